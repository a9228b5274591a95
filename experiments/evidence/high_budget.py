"""High budgets: extra templates at unchanged per-token FLOPs vs the 1x reference.

    python experiments/evidence/high_budget.py            # report: 1.5x and 2x of the 8-layer chassis, 3 seeds
    python experiments/evidence/high_budget.py --quick    # smoke run

Claim (Shapeshifter Networks): a budget above the reference adds capacity at equal
inference FLOPs: the architecture is unchanged, each layer's weights are a learned mix of T
templates, and T grows with the budget. Arms:
  reference     the untied 1x model
  pools_tmix 1x, 1.5x, 2x   one template_mix bank per slot type over the L blocks at the reference
                shape; npas solves T for the budget (`common.fit_pools`: if T full-length templates
                leave > 2% unused, one more template, shortened and tiled, fills it). The 1x arm
                separates "more parameters" from "template reparameterisation" itself.
Note: L generated weights are L linear combinations of the T templates, so for T >= L the set of
weights the pooled model can express is exactly the untied model's; budgets above 1x add
parameters (an over-parameterisation of the same function class), not expressible capacity.

FLOPs per token are identical for every arm (checked analytically and printed); template mixing
adds a once-per-step generation cost (m x T x size multiply-adds per bank), printed beside it.
"""

from __future__ import annotations

import common
import report
import runs

REF = "reference"
BUDGETS = ("1x", "1.5x", "2x")


def main() -> None:
    args = common.arg_parser(__doc__).parse_args()
    setup = common.setup_from(args, "high_budget")
    ch = setup.chassis
    ref = common.fit(ch, "1x", width_fit="mlp").config
    configs = {REF: ref}
    acc = {REF: common.accounting_row(REF, ref, ref, common.fit(ch, "1x").budget, 0)}
    for budget in BUDGETS:
        cand = common.fit_pools(ch, budget)
        name = f"pools_tmix {budget}"
        configs[name] = cand.config
        acc[name] = common.accounting_row(name, cand.config, ref, cand.budget, cand.fit.step)
        b0 = cand.config.banks[0]
        acc[name]["templates"] = b0.templates
        acc[name]["template_fraction"] = b0.size / max(cand.config.member_numels(b0))
    common.print_accounting(list(acc.values()))
    for name, a in acc.items():
        frac = f" of {a['template_fraction']:.0%} length" if "template_fraction" in a else ""
        print(f"  {name:16s} templates per bank: {a.get('templates', '-')}{frac}, generation FLOPs/step "
              f"{a['generation_flops_per_step']:,} (= {a['generation_flops_per_step'] / (a['flops_per_token'] * setup.recipe.tokens_per_step):.2%}"
              f" of one step's forward FLOPs at {setup.recipe.tokens_per_step} tokens)")
    results = runs.run_arms(configs, setup)
    extra = {n: {"T": str(a.get("templates", "-"))} for n, a in acc.items()}
    summary = report.print_results(setup, results, list(configs), REF, acc, extra)
    means = {r["name"]: r["mean"] for r in summary}
    more = [means[f"pools_tmix {b}"] for b in BUDGETS]
    claim = means["pools_tmix 2x"] < means[REF] and more[2] < more[0]
    print(f"loss by budget (pools_tmix): {dict(zip(BUDGETS, [round(x, 4) for x in more], strict=True))}; "
          f"reference {means[REF]:.4f}")
    print(f"claim 2x templates beat the 1x reference at equal FLOPs: {'REPRODUCED' if claim else 'NOT REPRODUCED'}")
    report.save_json(setup, {"accounting": acc, "results": results, "summary": summary, "claim_reproduced": claim})
    plot(setup, summary, acc)
    report.finish(setup)


def plot(setup: common.Setup, summary: list[dict], acc: dict[str, dict]) -> None:
    plt = report.pyplot()
    fig, a = plt.subplots(figsize=(6, 4))
    rows = {r["name"]: r for r in summary}
    ref = rows[REF]
    a.axhline(ref["mean"], color="k", ls="--", label="untied reference (1x)")
    if ref["std"] == ref["std"]:
        a.axhspan(ref["mean"] - ref["std"], ref["mean"] + ref["std"], color="k", alpha=0.1)
    names = [f"pools_tmix {b}" for b in BUDGETS]
    xs = [acc[n]["stored_params"] for n in names]
    a.errorbar(xs, [rows[n]["mean"] for n in names], yerr=[0 if rows[n]["std"] != rows[n]["std"] else rows[n]["std"]
                                                          for n in names], marker="o", capsize=3,
               label="template_mix pools (same FLOPs/token)")
    for n, x in zip(names, xs, strict=True):
        a.annotate(f"{n.split()[1]}, T={acc[n]['templates']}", (x, rows[n]["mean"]), fontsize=7, xytext=(3, 3),
                   textcoords="offset points")
    a.set(xlabel="stored params",
          ylabel="val loss (nats/char)",
          title=f"{setup.recipe.steps} steps, {len(setup.seeds)} seed(s), mean ± std")
    a.legend(fontsize=8)
    report.save_figure(setup, fig)


if __name__ == "__main__":
    main()
