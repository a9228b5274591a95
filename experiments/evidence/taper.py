"""Taper schedules at a fixed budget: front-heavy cosine vs uniform vs reverse vs hourglass.

    python experiments/evidence/taper.py            # report: d_model 64, 8 layers, 3 seeds
    python experiments/evidence/taper.py --quick    # smoke run

Claim (Tapered LMs): at equal parameters and compute, a front-heavy cosine taper of the
MLP width (1.5x -> 0.5x of d_ff, ratio 3) beats the uniform model, and the reverse taper hurts:
loss(cosine) < loss(uniform) < loss(reverse). Hourglass (><former: wide ends, narrow middle) is
the fourth arm.

Every arm is fitted to the 1x budget with `fit.width: mlp` (only MLP widths scale, d_model fixed),
so stored parameters match the reference to within one width step, and since per-token FLOPs are
linear in the summed MLP width they match too (printed).
"""

from __future__ import annotations

import common
import report
import runs

ARMS = {  # name -> knob values (ratio 3 = 1.5x -> 0.5x of d_ff, mean 1x)
    "uniform": {"taper": "uniform"},
    "cosine": {"taper": "cosine", "taper_ratio": 3.0},
    "reverse": {"taper": "reverse", "taper_ratio": 3.0},
    "hourglass": {"taper": "hourglass", "taper_ratio": 3.0},
}
REF = "uniform"


def main() -> None:
    args = common.arg_parser(__doc__).parse_args()
    setup = common.setup_from(args, "taper")
    ch = setup.chassis
    ref = common.fit(ch, "1x", width_fit="mlp").config
    configs, acc = {}, {}
    for name, knobs in ARMS.items():
        cand = common.fit(ch, "1x", width_fit="mlp", **knobs)
        configs[name] = cand.config
        acc[name] = common.accounting_row(name, cand.config, ref, cand.budget, cand.fit.step)
    common.print_accounting(list(acc.values()))
    for name, row in acc.items():
        print(f"  {name:10s} MLP widths {row['mlp_widths']}")
    results = runs.run_arms(configs, setup)
    summary = report.print_results(setup, results, list(ARMS), REF, acc)
    means = {r["name"]: r["mean"] for r in summary}
    order = " < ".join(sorted(means, key=means.get))
    claim = means["cosine"] < means["uniform"] < means["reverse"]
    print(f"ordering by mean loss: {order}")
    print(f"claim cosine < uniform < reverse: {'REPRODUCED' if claim else 'NOT REPRODUCED'}")
    report.save_json(setup, {"accounting": acc, "results": results, "summary": summary, "ordering": order,
                             "claim_reproduced": claim})
    plot(setup, summary, acc)
    report.finish(setup)


def plot(setup: common.Setup, summary: list[dict], acc: dict[str, dict]) -> None:
    plt = report.pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, row in acc.items():
        a.plot(range(len(row["mlp_widths"])), row["mlp_widths"], marker="o", label=name)
    a.set(xlabel="layer",
          ylabel="MLP width",
          title=f"taper profiles (1x = {setup.chassis.d_ff}, equal stored params)")
    a.legend()
    report.loss_bars(b, setup, summary)
    report.save_figure(setup, fig)


if __name__ == "__main__":
    main()
