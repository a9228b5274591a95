"""Does the search beat hand-crafted sharing? A full.yaml search at 0.25x, its picks trained longer.

    python bench/evidence/search_vs_hand.py                 # report: 12 trials, evidence chassis
    python bench/evidence/search_vs_hand.py --quick         # smoke run: 5 trials, tiny chassis
    python bench/evidence/search_vs_hand.py --file-chassis  # full.yaml's own d_model 128 chassis (slow)

1. `npas.search` over search_spaces/full.yaml's knobs at its 0.25x budget, into a real SQLite study
   under a temp dir (Ray workers, ASHA on, TPE, seed 0). npas enqueues the three hand-crafted
   baselines first (narrow untied, full tying, cycle tying), so the same study holds them.
2. The front's knee and min-loss picks (`npas.service.study.pick`, exported with `npas.export`) and every
   front trial and baseline are retrained with a longer recipe (2x the proxy's steps) on seed 0;
   the knee, the min-loss pick and the best baseline (by that long run) get more seeds.
3. Kendall tau-b between the proxy ranking and the long-run ranking over front + baselines
   (full-fidelity proxy losses only; a baseline ASHA stopped early is ranked out, and said so).

All candidates hold the same stored-parameter budget (the fit's; printed). FLOPs per token differ
between candidates (tying and pools keep the reference shape, the narrow model is narrower): printed.
"""

from __future__ import annotations

import json
from pathlib import Path

import common

import npas
from npas.allocation.config import ArchConfig
from npas.service.exporter import export
from npas.service.study import pick
from npas.training.recipe import Recipe


def main() -> None:
    p = common.arg_parser(__doc__)
    p.add_argument("--trials", type=int, default=None, help="proxy trials (default 12 full, 5 quick)")
    p.add_argument("--file-chassis", action="store_true", help="use full.yaml's own chassis (d_model 128)")
    p.add_argument("--long-factor", type=int, default=2, help="long recipe = this many x the proxy's steps")
    p.add_argument("--max-front", type=int, default=5, help="retrain at most this many front trials")
    p.add_argument("--reuse", type=Path, default=None, help="a previous run's JSON: reuse its study, skip the search")
    args = p.parse_args()
    setup = common.setup_from(args, "search_vs_hand")
    trials = args.trials or (5 if setup.quick else 12)
    space = common.search_space(setup, args.file_chassis)
    print(f"space {space.source}: budget {space.budget_spec} = {space.budget_params:,} params of the "
          f"{space.reference_params:,}-param reference; {trials} trials, ASHA on", flush=True)
    if args.reuse:
        info = json.loads(args.reuse.read_text())["search"]
        print(f"reusing study {info['study']} at {info['storage']} (searched in {info['wall_s']} s)")
    else:
        info = common.run_search(setup, space, trials=trials, early_stop=True, tag="svh")
        common.shutdown_ray()
    study = common.load_study(info)
    rows = common.trial_rows(study)
    print(f"search: {len(rows)} proxy runs in {info['wall_s']:.0f} s; study {info['study']} at {info['storage']}")
    print_trials(rows)

    knee, minloss = pick(study, "knee"), pick(study, "min-loss")
    picks = {"knee": export(study, "knee"), "min-loss": export(study, "min-loss")}
    front = [r for r in rows if r["on_front"]]
    baselines = {r["baseline"]: r for r in rows if r["baseline"]}
    cand: dict[str, dict] = {}  # label -> trial row; one label per allocation
    seen: dict[str, str] = {}
    for label, row in ([("knee", _row(rows, knee.number)), ("min-loss", _row(rows, minloss.number))]
                       + [(f"baseline {b}", r) for b, r in sorted(baselines.items())]
                       + [(f"front #{r['number']}", r) for r in front[: args.max_front]]):
        h = ArchConfig.from_dict(row["allocation"]).hash
        if h in seen:
            cand[seen[h]].setdefault("aliases", []).append(label)
            continue
        seen[h] = label
        cand[label] = {**row, "aliases": []}
    for k, cfg in picks.items():
        assert cfg.hash == ArchConfig.from_dict(_row(rows, (knee if k == "knee" else minloss).number)["allocation"]).hash

    proxy = common.search_recipe(setup)
    steps = proxy.steps * args.long_factor
    long = Recipe.from_dict({**proxy.to_dict(), "name": f"{proxy.name}-long{args.long_factor}x", "steps": steps,
                             "eval_every": steps // 2, "eval_batches": setup.recipe.eval_batches})
    ref = npas.reference_config(space.reference_chassis.__class__(**{**space.reference_chassis.__dict__,
                                                                      "vocab_size": common.VOCAB}))
    configs = {label: ArchConfig.from_dict(r["allocation"]) for label, r in cand.items()}
    acc = {label: common.accounting_row(label, cfg, ref, space.budget_params) for label, cfg in configs.items()}
    common.print_accounting(list(acc.values()))
    print(f"\nlong recipe: {long.steps} steps x {long.batch_size}x{long.seq_len} ({args.long_factor}x the proxy), "
          f"seed 0 for every candidate", flush=True)
    jobs = [{"name": label, "config": cfg.to_dict(), "recipe": {**long.to_dict(), "seed": 0}}
            for label, cfg in configs.items()]
    first = common.run_jobs(jobs, setup.workers)
    seed0 = {r["name"]: r["val_loss"] for r in first}
    base_labels = [lbl for lbl in cand if lbl.startswith("baseline") or any(a.startswith("baseline")
                                                                           for a in cand[lbl]["aliases"])]
    best_base = min(base_labels, key=lambda lbl: seed0[lbl])
    finalists = list(dict.fromkeys([_label(cand, "knee"), _label(cand, "min-loss"), best_base]))
    more_seeds = [s for s in setup.seeds if s != 0]
    extra = [{"name": lbl, "config": configs[lbl].to_dict(), "recipe": {**long.to_dict(), "seed": s}}
             for s in more_seeds for lbl in finalists]
    results = first + (common.run_jobs(extra, setup.workers) if extra else [])

    summary = common.summarize(results, finalists, best_base)
    print(f"\nfinalists, long recipe, mean ± std over seeds {[0, *more_seeds]}; Δ = paired difference to the "
          f"best baseline ({best_base}; negative = search wins)")
    names = {lbl: _names(lbl, cand) for lbl in finalists}
    print(common.result_table(summary, acc, best_base, {lbl: {"also": n} for lbl, n in names.items()}))

    ranked = [lbl for lbl in cand if cand[lbl]["full_fidelity"]]
    dropped = [lbl for lbl in cand if not cand[lbl]["full_fidelity"]]
    px = [cand[lbl]["values"][0] for lbl in ranked]
    lx = [seed0[lbl] for lbl in ranked]
    tau = common.kendall_tau_b(px, lx)
    print("\nproxy vs long run, seed 0 (front + baselines):")
    table = [[lbl, ", ".join(cand[lbl]["aliases"]) or "-", cand[lbl]["summary"],
              f"{cand[lbl]['values'][0]:.4f}" + ("" if cand[lbl]["full_fidelity"] else
                                                 f" (stopped @{cand[lbl]['steps_done']})"),
              f"{seed0[lbl]:.4f}", f"{acc[lbl]['flops_ratio']:.3f}"] for lbl in cand]
    print(common.format_table(["candidate", "also", "allocation", "proxy loss", "long loss", "FLOPs xref"], table))
    print(f"Kendall tau-b (proxy vs long ranking) over {len(ranked)} candidates: {tau:.3f}"
          + (f"; left out (stopped early by ASHA): {dropped}" if dropped else ""))
    best_search = min((r for r in summary if r["name"] != best_base), key=lambda r: r["mean"], default=None)
    base_row = next(r for r in summary if r["name"] == best_base)
    if best_search is not None:
        verdict = "search WINS" if best_search["mean"] < base_row["mean"] else "search does NOT beat the baseline"
        print(f"best search pick {best_search['name']} {best_search['mean']:.4f} vs best baseline {best_base} "
              f"{base_row['mean']:.4f}: {verdict}")
    else:
        print(f"the search's knee and min-loss picks are the best baseline itself ({best_base}): "
              f"no gain over hand-crafted sharing in this study")
    common.save_json(setup, {"search": info, "trials": rows, "candidates": cand, "long_recipe": long.to_dict(),
                             "accounting": acc, "results": results, "summary": summary, "best_baseline": best_base,
                             "finalists": finalists, "kendall_tau_b": tau, "tau_left_out": dropped,
                             "exports": {k: v.to_dict() for k, v in picks.items()}})
    plot(setup, rows, cand, seed0, tau)
    common.finish(setup)


def _row(rows: list[dict], number: int) -> dict:
    return next(r for r in rows if r["number"] == number)


def _label(cand: dict[str, dict], name: str) -> str:
    return next(lbl for lbl, r in cand.items() if lbl == name or name in r["aliases"])


def _names(label: str, cand: dict[str, dict]) -> str:
    return ", ".join(cand[label]["aliases"]) or "-"


def print_trials(rows: list[dict]) -> None:
    table = [[r["number"], r["baseline"] or "-", r["status"], r["steps_done"],
              "-" if not r["values"] else f"{r['values'][0]:.4f}",
              "-" if not r["values"] or len(r["values"]) < 2 else f"{r['values'][1] / 1e6:.1f}",
              f"{r['stored_params'] or 0:,}", "yes" if r["on_front"] else "", r["summary"]] for r in rows]
    print(common.format_table(["trial", "baseline", "status", "steps", "proxy loss", "train MB", "stored",
                               "front", "allocation"], table))


def plot(setup: common.Setup, rows: list[dict], cand: dict[str, dict], seed0: dict[str, float], tau: float) -> None:
    plt = common.pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for r in rows:
        if not r["values"] or len(r["values"]) < 2:
            continue
        style = "s" if r["baseline"] else ("o" if r["full_fidelity"] else "x")
        color = "C3" if r["on_front"] else ("C1" if r["baseline"] else "C0")
        a.plot(r["values"][1] / 1e6, r["values"][0], style, color=color, alpha=0.8)
        if r["baseline"]:
            a.annotate(r["baseline"], (r["values"][1] / 1e6, r["values"][0]), fontsize=6, xytext=(3, 3),
                       textcoords="offset points")
    a.set_xlabel("train memory (MB, analytic)")
    a.set_ylabel("proxy val loss (nats/char)")
    a.set_title("search trials (red = front, squares = baselines, x = stopped)")
    for lbl, r in cand.items():
        b.plot(r["values"][0], seed0[lbl], "s" if "baseline" in lbl or any("baseline" in x for x in r["aliases"])
               else "o")
        b.annotate(lbl, (r["values"][0], seed0[lbl]), fontsize=6, xytext=(3, 3), textcoords="offset points")
    b.set_xlabel("proxy val loss")
    b.set_ylabel("long-run val loss (seed 0)")
    b.set_title(f"proxy vs long ranking: Kendall tau-b = {tau:.2f}")
    common.save_figure(setup, fig)


if __name__ == "__main__":
    main()
