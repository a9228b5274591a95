"""Low budgets: Shapeshifter pools with learned template mixing vs hand-crafted sharing.

    python experiments/evidence/low_budget.py            # report: 0.1x, 0.25x, 0.5x of the 8-layer chassis, 3 seeds
    python experiments/evidence/low_budget.py --quick    # smoke run

Claim (Shapeshifter Networks / NPAS): parameter pools fit any budget without changing
the architecture, and at low budgets (<< reference) learned template mixing does better than
hand-crafted sharing. Arms, each fitted to the budget by npas (`fit.width: all` for the width fits):
  narrow_untied   every layer unique; d_model steps down by n_heads, then the MLP fills the budget
  full_tying      one block reused by all L layers; the fit narrows or widens it to the budget
  cycle_tying     U = L/2 blocks, ABAB; same fit
  pools_tmix      the reference shape (d_model, L, d_ff unchanged); each slot type's weights of all
                  L blocks come from one bank of T learned templates mixed per layer. npas solves T;
                  where T full-length templates would leave > 2% of the budget unused, the script asks
                  for one more template, which the fit then shortens and tiles to hit the budget
                  (`common.fit_pools`)

Stored params match the budget to within each fit's step (printed). FLOPs per token do NOT match
and cannot: the narrow model is narrower, tied models run L layers at the fitted width, pools run
the full reference shape. The table prints each arm's FLOPs relative to the 1x reference.
"""

from __future__ import annotations

import common
import report
import runs
import stats

BUDGETS = ("0.1x", "0.25x", "0.5x")
REF = "narrow_untied"


def arm_knobs(L: int) -> dict[str, dict]:
    return {
        "narrow_untied": {"tying": "none", "width_fit": "all"},
        "full_tying": {"tying": "all", "width_fit": "all", "lora_rank": 0},
        "cycle_tying": {"tying": "cycle", "unique_blocks": max(1, L // 2), "width_fit": "all", "lora_rank": 0},
        "pools_tmix": {},  # common.fit_pools: the fewest templates that fill the budget
    }


def main() -> None:
    p = common.arg_parser(__doc__)
    common.budgets_arg(p, BUDGETS, "the report covers only these")
    args = p.parse_args()
    budgets = common.budgets_of(p, args, BUDGETS)
    setup = common.setup_from(args, "low_budget")
    ch = setup.chassis
    ref = common.fit(ch, "1x", width_fit="mlp").config
    arms = arm_knobs(ch.n_layers)
    fitters = {arm: (lambda b: common.fit_pools(ch, b)) if arm == "pools_tmix"
               else (lambda b, knobs=knobs: common.fit(ch, b, **knobs)) for arm, knobs in arms.items()}
    configs, acc = common.budget_arms(budgets, fitters, ref)
    for name, cfg in configs.items():
        if cfg.banks:
            b0 = cfg.banks[0]
            acc[name]["templates"] = b0.templates
            acc[name]["template_fraction"] = b0.size / max(cfg.member_numels(b0))  # < 1: shortened, tiled
    common.print_accounting(list(acc.values()))
    for name, a in acc.items():
        if "templates" in a:
            print(f"  {name:18s} T={a['templates']} templates of {a['template_fraction']:.0%} of a full block's "
                  f"length{' (tiled)' if a['template_fraction'] < 1 else ''}")
    results = runs.run_arms(configs, setup)
    print(f"\nresults: val loss after {setup.recipe.steps} steps, mean ± std over {len(setup.seeds)} seed(s); "
          f"Δ is the paired same-seed difference to {REF} at the same budget (negative = better)")
    summaries, verdict = {}, {}
    for budget in budgets:
        names = [f"{budget} {arm}" for arm in arms]
        summ = stats.summarize(results, names, f"{budget} {REF}")
        summaries[budget] = summ
        print(f"\nbudget {budget} ({acc[names[0]]['budget']:,} params):")
        print(report.result_table(summ, acc, f"{budget} {REF}"))
        best = min(summ, key=lambda r: r["mean"])["name"].split(" ", 1)[1]
        verdict[budget] = best
        print(f"best at {budget}: {best}")
    print("\nclaims (Shapeshifter: learned template mixing beats hand-crafted sharing at low budgets): paired Δ = "
          "loss(pools_tmix) - loss(arm), mean [95% t-interval] over shared seeds (negative = pools better)")
    claims = []
    for budget in budgets:
        for arm in (a for a in arms if a != "pools_tmix"):
            pools, other = f"{budget} pools_tmix", f"{budget} {arm}"
            iv = stats.paired_interval(results, pools, other)
            claims.append({"budget": budget, "against": arm, "delta": iv.value, "low": iv.low, "high": iv.high,
                           "n": iv.n, "verdict": stats.split_verdict(results, pools, other, "better")})
            print(f"claim {budget} pools_tmix beats {arm}: {report.fmt_interval(iv)} over {iv.n} seed(s): "
                  f"{claims[-1]['verdict']}")
    wins = sum(v == "pools_tmix" for v in verdict.values())
    print(f"\npools_tmix best at {wins}/{len(budgets)} budgets; best arm per budget: {verdict}")
    report.save_json(setup, {"accounting": acc, "results": results, "summary": summaries, "best": verdict,
                             "claims": claims})
    plot(setup, summaries, acc, list(arms), budgets)
    report.finish(setup)


def plot(setup: common.Setup, summaries: dict[str, list[dict]], acc: dict[str, dict], arms: list[str],
         budgets: tuple[str, ...]) -> None:
    plt = report.pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    xs = list(range(len(budgets)))
    for k, arm in enumerate(arms):
        rows = [next(r for r in summaries[bud] if r["name"] == f"{bud} {arm}") for bud in budgets]
        a.errorbar([x + 0.05 * (k - 1.5) for x in xs], [r["mean"] for r in rows],
                   yerr=[0 if r["std"] != r["std"] else r["std"] for r in rows], marker="o", capsize=3, label=arm)
        b.plot([acc[r["name"]]["flops_ratio"] for r in rows], [r["mean"] for r in rows], marker="o", label=arm)
        for r in rows:
            b.annotate(r["name"].split(" ")[0], (acc[r["name"]]["flops_ratio"], r["mean"]), fontsize=6,
                       xytext=(3, 3), textcoords="offset points")
    a.set_xticks(xs, list(budgets))
    a.set(xlabel="stored-parameter budget (x reference)",
          ylabel="val loss (nats/char)",
          title=f"{setup.recipe.steps} steps, {len(setup.seeds)} seed(s), mean ± std")
    a.legend(fontsize=8)
    b.set(xlabel="FLOPs/token relative to the 1x reference",
          ylabel="val loss (nats/char)",
          title="same runs against per-token compute")
    b.legend(fontsize=8)
    report.save_figure(setup, fig)


if __name__ == "__main__":
    main()
