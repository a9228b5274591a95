"""Early stopping (ASHA) on and off: the same search, its proxy compute and its front's hypervolume.

    python experiments/evidence/early_stop.py                                   # report: 12 trials each
    python experiments/evidence/early_stop.py --reuse-asha results/search_vs_hand.json   # reuse exp. 5's study
    python experiments/evidence/early_stop.py --quick                           # smoke run

The same space (search_spaces/full.yaml's knobs at 0.25x), recipe, sampler seed and trial count,
run once with `Launch(early_stop=True)` (Ray Tune's ASHA on validation loss, grace period = one
eval interval, reduction factor 3) and once with `early_stop=False`. Reported per search: proxy
runs, runs stopped early, total proxy compute (sum of steps_done x tokens/step, and summed trial
wall time), search wall time, and the 2-D hypervolume of the final full-fidelity front (val loss
vs training memory), both measured against one reference point shared by the two searches.
With `--reuse-asha`, the ASHA arm is the study experiment 5 already ran (same settings), not rerun.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import common
import report
import searches
import stats


def main() -> None:
    p = common.arg_parser(__doc__)
    p.add_argument("--trials", type=int, default=None, help="proxy trials per search (default 12 full, 5 quick)")
    p.add_argument("--file-chassis", action="store_true", help="use full.yaml's own chassis (d_model 128)")
    p.add_argument("--reuse-asha", type=Path, default=None,
                   help="search_vs_hand's JSON: take its (ASHA) study as this experiment's ASHA arm")
    args = p.parse_args()
    setup = common.setup_from(args, "early_stop")
    trials = args.trials or (5 if setup.quick else 12)
    space = searches.search_space(setup, args.file_chassis)
    print(f"space {space.source}: budget {space.budget_spec} = {space.budget_params:,} params; {trials} trials "
          f"per search", flush=True)
    recipe = searches.search_recipe(setup)
    arms = 1 if args.reuse_asha else 2
    tokens = arms * trials * recipe.steps * recipe.tokens_per_step
    import npas

    cpu_h = common.cpu_seconds(npas.count(npas.reference_config(space.reference_chassis)).flops_per_token, tokens) / 3600
    print(f"plan: {arms} search(es) x {trials} trials x {recipe.steps} steps x {recipe.tokens_per_step} tokens = "
          f"{tokens / 1e6:.1f}M tokens at most (ASHA stops some) -> ~{cpu_h:.2f} CPU-hours at the reference's FLOPs",
          flush=True)
    if setup.plan_only:
        raise SystemExit(0)  # a plan trains nothing and writes nothing
    infos = {}
    if args.reuse_asha:
        prev = json.loads(args.reuse_asha.read_text())["search"]
        same = (prev["trials"] == trials and prev["recipe"] == searches.search_recipe(setup).to_dict()
                and prev["early_stop"] and prev["space"] == space.source)
        if not same:
            raise SystemExit(f"{args.reuse_asha}: its search used other settings ({prev['trials']} trials, "
                             f"{prev['space']}); run without --reuse-asha")
        infos["asha"] = prev
        print(f"ASHA arm: reusing study {prev['study']} ({prev['wall_s']} s)")
    for arm, es in (("asha", True), ("no_early_stop", False)):
        if arm not in infos:
            infos[arm] = searches.run_search(setup, space, trials=trials, early_stop=es, tag=f"es-{arm}")
            print(f"{arm}: searched in {infos[arm]['wall_s']:.0f} s", flush=True)
    searches.shutdown_ray()

    rows = {arm: searches.trial_rows(searches.load_study(info)) for arm, info in infos.items()}
    pts = {arm: [(r["values"][0], r["values"][1] / 1e6) for r in rs if r["on_front"]] for arm, rs in rows.items()}
    allpts = [(r["values"][0], r["values"][1] / 1e6) for rs in rows.values() for r in rs
              if r["values"] and r["full_fidelity"]]
    ref = (max(a for a, _ in allpts) + 0.05, max(b for _, b in allpts) * 1.05)
    box = (ref[0] - min(a for a, _ in allpts)) * (ref[1] - min(b for _, b in allpts))
    arm_stats = {}
    for arm, rs in rows.items():
        hv = stats.hypervolume_2d(pts[arm], ref)
        arm_stats[arm] = {
            "proxy_runs": len(rs), "stopped": sum(r["status"] == "stopped" for r in rs),
            "failed": sum(r["status"] == "failed" for r in rs),
            "full_fidelity": sum(r["full_fidelity"] for r in rs), "front_size": len(pts[arm]),
            "tokens": sum(r["tokens"] for r in rs),
            # per-trial wall comes from the trial's proxy record, which ASHA runs lack (see RESULTS.md)
            "trial_wall_s": None if any(r["wall_s"] is None for r in rs) else sum(r["wall_s"] for r in rs),
            "search_wall_s": infos[arm]["wall_s"], "hypervolume": hv, "hv_normalised": hv / box if box else math.nan,
            "best_loss": min((r["values"][0] for r in rs if r["full_fidelity"]), default=math.nan),
        }
    base = arm_stats["no_early_stop"]
    table = [[arm, s["proxy_runs"], s["stopped"], s["full_fidelity"], s["front_size"], f"{s['tokens'] / 1e6:.2f}",
              f"{s['tokens'] / base['tokens']:.2f}", "n/a" if s["trial_wall_s"] is None else f"{s['trial_wall_s']:.0f}", f"{s['search_wall_s']:.0f}",
              f"{s['hv_normalised']:.4f}", f"{s['best_loss']:.4f}"] for arm, s in arm_stats.items()]
    print(f"\nhypervolume: objectives (val loss nats, train memory MB), reference point ({ref[0]:.3f}, {ref[1]:.2f}); "
          f"normalised by the box spanned by all full-fidelity trials of both searches")
    print(report.format_table(["search", "proxy runs", "stopped", "full fid.", "front", "Mtokens", "xno-ES",
                               "trial s", "search s", "HV (norm.)", "best loss"], table))
    a, n = arm_stats["asha"], arm_stats["no_early_stop"]
    print(f"ASHA used {a['tokens'] / n['tokens']:.0%} of the proxy tokens and {a['search_wall_s'] / n['search_wall_s']:.0%} "
          f"of the wall time of the search without early stopping; hypervolume {a['hv_normalised']:.4f} vs "
          f"{n['hv_normalised']:.4f}")
    for arm, rs in rows.items():
        print(f"\n{arm} trials:")
        print(report.format_table(["trial", "baseline", "status", "steps", "proxy loss", "front", "allocation"],
                                  [[r["number"], r["baseline"] or "-", r["status"], r["steps_done"],
                                    "-" if not r["values"] else f"{r['values'][0]:.4f}", "yes" if r["on_front"] else "",
                                    r["summary"]] for r in rs]))
    report.save_json(setup, {"searches": infos, "trials": rows, "stats": arm_stats, "hv_reference": ref, "fronts": pts})
    plot(setup, rows, ref)
    report.finish(setup)


def plot(setup: common.Setup, rows: dict[str, list[dict]], ref: tuple[float, float]) -> None:
    plt = report.pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for k, (arm, rs) in enumerate(rows.items()):
        full = [r for r in rs if r["values"] and r["full_fidelity"]]
        a.plot([r["values"][1] / 1e6 for r in full], [r["values"][0] for r in full], "o", color=f"C{k}", alpha=0.4)
        front = sorted((r["values"][1] / 1e6, r["values"][0]) for r in rs if r["on_front"])
        if front:
            xs, ys = zip(*front, strict=True)
            a.step(xs, ys, where="post", color=f"C{k}", label=f"{arm} front")
        cum = 0
        xs, ys = [], []
        for r in sorted(rs, key=lambda r: r["number"]):
            cum += r["tokens"]
            xs.append(cum / 1e6)
            ys.append(min([y for y in ys] + [r["values"][0] if r["values"] and r["full_fidelity"] else math.inf]))
        b.step(xs, ys, where="post", color=f"C{k}", label=arm)
    a.set(xlabel="train memory (MB, analytic)",
          ylabel="proxy val loss (nats/char)",
          title="full-fidelity trials and fronts")
    a.legend(fontsize=8)
    b.set(xlabel="cumulative proxy tokens (M)",
          ylabel="best full-fidelity loss so far",
          title="search progress against proxy compute")
    b.legend(fontsize=8)
    report.save_figure(setup, fig)


if __name__ == "__main__":
    main()
