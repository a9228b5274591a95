"""Relaxed recursive transformers: cycle tying with LoRA at the tied positions.

    python experiments/evidence/relaxed.py            # report: d_model 64, 8 layers, 3 seeds
    python experiments/evidence/relaxed.py --quick    # smoke run

Claims (Universal / Recursive and Relaxed Recursive Transformers): a recursive model
(U unique blocks cycled over L layers, ABAB) keeps the depth of the untied model at U/L of its
block parameters; per-position LoRA of rank r ("relaxation") recovers most of the untied model's
quality as r grows, r = 0 being pure tying; and the recursive model beats a shallower untied model
of the same parameter count (U layers).

Arms, on the report chassis (L = 8):
  untied             the reference, L unique layers
  cycle U=L/2 r=..   U = 4 and U = L/4 = 2, r in {0, 4, 16, 64}, LoRA on attention and MLP
  shallow L=U        an untied model of depth U, MLP width fitted to the stored params of cycle U r=0

What is and is not held equal (printed): cycle r=0 stores U/L of the block weights at the untied
model's per-token FLOPs; LoRA adds r(d_in + d_out) parameters per matrix per layer (at d_model = 64,
r = 64 is full rank: its adapters alone outweigh the untied blocks). npas merges each LoRA delta
into its layer's weight once per forward, so per-token FLOPs stay the untied model's and the merge
costs 2 r d_in d_out FLOPs per step (printed; before npas commit fd0fc1c the adapters ran per token
and `npas.count` counted them per token). The shallow model matches cycle r=0's stored params but
costs only about U/L of the FLOPs.
"""

from __future__ import annotations

import math

import common
import report
import runs
import stats

import npas
from npas import ArchConfig, reference_config
from npas.allocation.layer_maps import tying_map

RANKS = (0, 4, 16, 64)
REF = "untied"


def arms(ch, uniques: list[int] | None = None) -> tuple[dict[str, ArchConfig], dict[str, dict], list[int]]:
    L = ch.n_layers
    uniques = uniques or sorted({max(1, L // 2), max(1, L // 4)}, reverse=True)
    ref = reference_config(ch)
    configs: dict[str, ArchConfig] = {REF: ref}
    acc = {REF: common.accounting_row(REF, ref, ref)}
    for U in uniques:
        blocks = tying_map("cycle", L, U)
        for r in RANKS:
            name = f"cycle U={U} r={r}"
            cfg = ArchConfig(chassis=ch, mlp_widths=(ch.d_ff,) * L, block_of_layer=blocks, lora_attn=(r,) * L,
                             lora_mlp=(r,) * L)
            configs[name] = cfg
            acc[name] = common.accounting_row(name, cfg, ref)
        tied = npas.count(configs[f"cycle U={U} r=0"]).stored_params
        shallow = ch.__class__(**{**ch.__dict__, "n_layers": U})
        cand = common.fit(shallow, str(tied), width_fit="mlp")
        name = f"shallow L={U}"
        configs[name] = cand.config
        acc[name] = common.accounting_row(name, cand.config, ref, tied, cand.fit.step)
    return configs, acc, uniques


# (arm, reference, kind, words): the claims tested per unique-block count U, as paired differences
def claims(U: int) -> list[tuple[str, str, str, str]]:
    r0 = f"cycle U={U} r=0"
    out = [(f"cycle U={U} r={r}", r0, "better", f"relaxation (LoRA r={r}, alpha/r) improves on pure tying")
           for r in RANKS[1:]]
    out.append((r0, f"shallow L={U}", "better",
                f"our test: cycle U={U} (depth L, tied) beats an untied model of depth {U} at equal stored params"))
    return out


def main() -> None:
    p = common.arg_parser(__doc__)
    p.add_argument("--unique-blocks", default="",
                   help="comma-separated U values to run (default: L/2 and L/4); the report covers only these")
    args = p.parse_args()
    setup = common.setup_from(args, "relaxed")
    chosen = sorted({int(u) for u in args.unique_blocks.split(",") if u.strip()}, reverse=True) or None
    configs, acc, uniques = arms(setup.chassis, chosen)
    common.print_accounting(list(acc.values()))
    tokens = setup.recipe.tokens_per_step
    for name, a in acc.items():
        if a["generation_flops_per_step"]:
            print(f"  {name:16s} LoRA merge {a['generation_flops_per_step']:,} FLOPs/step = "
                  f"{a['generation_flops_per_step'] / (a['flops_per_token'] * tokens):.1%} of a {tokens}-token step's "
                  f"forward FLOPs")
    results = runs.run_arms(configs, setup)
    names = list(configs)
    summary = report.print_results(setup, results, names, REF, acc)
    means = {r["name"]: r["mean"] for r in summary}
    checks = {}
    for U in uniques:
        losses = [means[f"cycle U={U} r={r}"] for r in RANKS]
        gap0 = means[f"cycle U={U} r=0"] - means[REF]
        best_r = min(RANKS[1:], key=lambda r: means[f"cycle U={U} r={r}"])
        recovered = (means[f"cycle U={U} r=0"] - means[f"cycle U={U} r={best_r}"]) / gap0 if gap0 > 0 else math.nan
        checks[U] = {
            "monotone_in_r": all(a >= b for a, b in zip(losses, losses[1:], strict=False)),
            "gap_untied_r0": gap0,
            "recovered_fraction_best_r": recovered, "best_r": best_r,
            "beats_shallow_r0": means[f"cycle U={U} r=0"] < means[f"shallow L={U}"],
        }
        print(f"U={U}: loss by r {dict(zip(RANKS, [round(x, 4) for x in losses], strict=True))}; "
              f"r=0 is {gap0:+.4f} vs untied; best r={best_r} recovers {recovered:.0%} of that gap; "
              f"loss falls monotonically with r: {checks[U]['monotone_in_r']}; "
              f"cycle r=0 beats shallow L={U} at equal params: {checks[U]['beats_shallow_r0']}")
    print("\nclaims: paired Δ = loss(arm) - loss(reference), mean [95% t-interval] over shared seeds "
          "(negative = the arm is better)")
    verdicts = []
    for U in uniques:
        for arm, ref, kind, words in claims(U):
            iv = stats.paired_interval(results, arm, ref)
            verdicts.append({"arm": arm, "reference": ref, "claim": words, "delta": iv.value, "low": iv.low,
                             "high": iv.high, "n": iv.n, "verdict": stats.split_verdict(results, arm, ref, kind)})
            print(f"claim {words}: {arm} - {ref} {report.fmt_interval(iv)} over {iv.n} seed(s): "
                  f"{verdicts[-1]['verdict']}")
    report.save_json(setup, {"accounting": acc, "results": results, "summary": summary, "ranks": RANKS,
                             "unique_blocks": uniques, "checks": checks, "claims": verdicts})
    plot(setup, summary, acc, uniques)
    report.finish(setup)


def plot(setup: common.Setup, summary: list[dict], acc: dict[str, dict], uniques: list[int]) -> None:
    plt = report.pyplot()
    rows = {r["name"]: r for r in summary}
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    xs = list(range(len(RANKS)))
    for k, U in enumerate(uniques):
        names = [f"cycle U={U} r={r}" for r in RANKS]
        a.errorbar(xs, [rows[n]["mean"] for n in names], yerr=[_s(rows[n]["std"]) for n in names], marker="o",
                   capsize=3, color=f"C{k}", label=f"cycle U={U}")
        sh = rows[f"shallow L={U}"]
        a.axhline(sh["mean"], color=f"C{k}", ls=":", label=f"shallow untied L={U} (= params of r=0)")
    a.axhline(rows[REF]["mean"], color="k", ls="--", label=f"untied L={setup.chassis.n_layers}")
    a.set_xticks(xs, [str(r) for r in RANKS])
    a.set(xlabel="LoRA rank r at every tied position",
          ylabel="val loss (nats/char)",
          title="loss vs relaxation rank")
    a.legend(fontsize=7)
    for r in summary:
        p = acc[r["name"]]["stored_params"]
        b.errorbar(p, r["mean"], yerr=_s(r["std"]), fmt="o", capsize=3)
        b.annotate(r["name"], (p, r["mean"]), fontsize=6, xytext=(3, 3), textcoords="offset points")
    b.set_xscale("log")
    b.set(xlabel="stored params",
          ylabel="val loss (nats/char)",
          title=f"{setup.recipe.steps} steps, {len(setup.seeds)} seed(s), mean ± std")
    report.save_figure(setup, fig)


def _s(x: float) -> float:
    return 0.0 if x != x else x


if __name__ == "__main__":
    main()
