"""Does the search beat hand-crafted sharing? A full.yaml search at 0.25x, certified by `npas validate`.

    python experiments/evidence/search_vs_hand.py --plan     # runs x tokens -> CPU-hours; trains nothing
    python experiments/evidence/search_vs_hand.py            # report: 12 trials, evidence chassis, 5 fresh seeds
    python experiments/evidence/search_vs_hand.py --quick    # smoke run: 5 trials, tiny chassis, 2 seeds
    python experiments/evidence/search_vs_hand.py --report --out experiments/evidence/results/second_edition
                                                       # the certificate and the comparisons from the saved
                                                       # report's JSON: trains nothing, writes nothing

Second edition: the product's own path, end to end, so the result is what a user would get.
1. `npas.search` over search_spaces/full.yaml's knobs at its 0.25x budget on the evidence chassis
   (Ray workers, ASHA, TPE, seed 0), proxy recipe = the evidence recipe cut to a quarter of its steps
   (250 x 3,072 tokens), ranked on the VALIDATION split. npas enqueues its hand-crafted baselines
   first (narrow untied = the dense model of equal stored params, full tying with untied norms, cycle
   tying U = L/2); this script adds full tying with TIED norms (one more enqueued trial).
2. `npas validate --pick knee --top K --sample 0`: the front's K best points, the knee pick, every
   baseline and the dense untied model whose FLOPs per token are closest to the pick's, retrained with
   the full evidence recipe (1,000 x 3,072 tokens, >= 4x the proxy) on fresh seeds (10000+s, never the
   proxy's), scored on the TEST split the search never read. Its certificate (Kendall tau / Spearman
   rho with bootstrap intervals, over all validated points and over the front, seed noise, SNR, R² of
   size and compute) is printed as `npas validate` prints it.
3. The claim "the search beats hand-crafted sharing" is the paired Δ (same fresh seeds) of the knee
   pick and of the best front point by test loss against each baseline, with its 95% t-interval.

Held equal: stored parameters (every candidate is fitted to the same budget, printed), data, recipe
and seeds. Not equal, and shown: FLOPs per token (tied and pooled models keep the full shape) and so
training FLOPs. Which baselines are kept decides the verdict: it is stated against each one.

Everything lives in one SQLite file (experiments/evidence/results/search_vs_hand/study.db in full mode),
the search's trials and the validation's retrainings alike, so a killed run resumes: finished proxy
trials and retrainings never rerun. The file stays out of git (the report's JSON keeps the trials and
the certificate `--report` reads); a checkout without it searches and validates afresh. Not done here: the per-arm learning-rate check of the other
experiments (the search's allocations are not known in advance); the fair parameterization is on.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import common
import report
import searches
import stats

from npas import Recipe

STUDY = "evidence-search-vs-hand-v2"
EXTRA_BASELINE = "full_tying_tied_norms"  # not among npas's own baselines; added to this study
PROXY_FRACTION = 4  # the proxy trains 1/4 of the evidence recipe's steps
# A per-layer MoE baseline whose experts are narrower than this fraction of d_model is a strawman (experts
# of width 1 or 4 hold almost nothing each); its comparisons are marked stale until a study re-runs it with
# the fixed baseline (each expert at least d_model/2 wide).
MIN_EXPERT_WIDTH = 0.5


def main() -> None:
    p = common.arg_parser(__doc__)
    p.add_argument("--trials", type=int, default=None, help="searched trials besides the baselines "
                                                             "(default 12 full, 5 quick)")
    p.add_argument("--top", type=int, default=None, help="front points to validate (default 3 full, 2 quick)")
    p.add_argument("--workdir", type=Path, default=None,
                   help="where the study's SQLite file lives (default results/search_vs_hand, or a temp dir quick)")
    p.add_argument("--report", action="store_true",
                   help="print the certificate and the comparisons from the saved report (NAME.json in --out; a "
                        "first-edition report, without a certificate, prints what it saved); trains nothing, writes "
                        "nothing")
    args = p.parse_args()
    setup = common.setup_from(args, "search_vs_hand")
    if args.report:
        path = setup.out_dir / f"{setup.name}{'_quick' if setup.quick else ''}.json"
        if not path.exists():
            raise SystemExit(f"--report: no saved report at {path}; run without --report first, or point --out at it")
        print_saved(json.loads(path.read_text()), path)
        return
    trials = args.trials or (5 if setup.quick else 12)
    top = args.top or (2 if setup.quick else 3)
    seeds = len(setup.seeds) if args.seeds else (2 if setup.quick else common.FULL_SEEDS)
    space = searches.search_space(setup)
    proxy, score = recipes(setup)
    n_base = len(space.baselines()) + 1
    print(f"space {space.source}: budget {space.budget_spec} = {space.budget_params:,} params of the "
          f"{space.reference_params:,}-param reference; {n_base} baselines + {trials} searched trials", flush=True)
    print_plan(setup, space, proxy, score, trials + n_base, top, seeds)
    if setup.plan_only or setup.only:
        raise SystemExit(0)  # a plan trains nothing and writes nothing

    work = args.workdir or (setup.out_dir / "search_vs_hand_study" if setup.quick else
                            common.RESULTS_DIR / "search_vs_hand")
    url = f"sqlite:///{work.resolve() / 'study.db'}"
    st, wall_search = run_search(setup, space, proxy, work, url, trials + n_base)
    rows = searches.trial_rows(st)
    print(f"\nsearch: {len(rows)} proxy runs ({wall_search:.0f} s this call); study {STUDY} at {url}")
    print_trials(rows)

    cert, wall_val = run_validate(setup, score, work, url, top, seeds)
    from npas.presentation.cli.validate import format_table as certificate_table

    print("\n" + certificate_table(cert), flush=True)
    verdicts = compare(cert)
    report.save_json(setup, {"study": STUDY, "storage_file": str(work / "study.db"), "proxy_recipe": proxy.to_dict(),
                             "score_recipe": score.to_dict(), "trials": rows, "certificate": cert,
                             "comparisons": verdicts, "wall_s": {"search": wall_search, "validate": wall_val}})
    plot(setup, cert)
    report.finish(setup)


def print_saved(doc: dict[str, Any], path: Path) -> None:
    """``--report``: the saved report's certificate and comparisons; a report of the first edition (no
    certificate: before ``npas validate``) prints what it saved instead, its search's trials, the
    finalists' retrained losses against the best baseline and the proxy-to-long Kendall tau."""
    print(f"report from {path} (nothing trains)", flush=True)
    if "certificate" in doc:
        from npas.presentation.cli.validate import format_table as certificate_table

        print("\n" + certificate_table(doc["certificate"]), flush=True)
        compare(doc["certificate"])
        return
    print("\nno certificate: a first-edition report (before the search was certified by `npas validate`); "
          "what it saved:")
    if doc.get("trials"):
        print(f"\nsearch: {len(doc['trials'])} proxy runs (study {doc.get('search', {}).get('study', '?')})")
        print_trials(doc["trials"])
    if doc.get("summary"):
        ref = doc.get("best_baseline")
        long = doc.get("long_recipe") or {}
        print(f"\nfinalists retrained ({long.get('name', '?')}, {long.get('steps', '?')} steps), val loss over "
              f"seeds {doc.get('seeds', '?')}; Δ is the paired same-seed difference to {ref or '-'}:")
        print(report.result_table(doc["summary"], doc.get("accounting", {}), ref))
    if doc.get("kendall_tau_b") is not None:
        left = doc.get("tau_left_out") or []
        print(f"\nKendall tau-b, proxy vs retrained ranking: {doc['kendall_tau_b']:.3f}"
              + (f" (left out: {', '.join(map(str, left))})" if left else ""))


def recipes(setup: common.Setup) -> tuple[Recipe, Recipe]:
    """(the search's proxy: a quarter of the evidence recipe, 4 evaluations for ASHA's rungs;
    the validation recipe: the evidence recipe itself)."""
    r = setup.recipe
    steps = max(4, r.steps // PROXY_FRACTION)
    proxy = Recipe.from_dict({**r.to_dict(), "name": f"{r.name}-proxy", "steps": steps,
                              "warmup_steps": max(1, r.warmup_steps // PROXY_FRACTION),
                              "eval_every": max(1, steps // 4), "eval_batches": max(2, r.eval_batches * 2 // 3)})
    return proxy, Recipe.from_dict({**r.to_dict(), "name": f"{r.name}-validate"})


def print_plan(setup: common.Setup, space, proxy: Recipe, score: Recipe, trials: int, top: int, seeds: int) -> None:
    """Runs x tokens -> CPU-hours, before anything trains (validated allocations: top + pick +
    baselines + the FLOPs-matched dense model, an upper bound; cached work is not subtracted)."""
    import npas

    ref = npas.count(npas.reference_config(space.reference_chassis)).flops_per_token
    proxy_tokens = trials * proxy.steps * proxy.tokens_per_step
    n_val = top + 1 + len(space.baselines()) + 1 + 1
    val_tokens = n_val * seeds * score.steps * score.tokens_per_step
    cpu_h = common.cpu_seconds(ref, proxy_tokens + val_tokens) / 3600
    print(f"plan: search {trials} proxy runs x {proxy.steps} steps x {proxy.tokens_per_step} tokens = "
          f"{proxy_tokens / 1e6:.1f}M tokens (ASHA stops some); validate <= {n_val} allocations x {seeds} seeds x "
          f"{score.steps} x {score.tokens_per_step} = {val_tokens / 1e6:.1f}M tokens -> ~{cpu_h:.2f} CPU-hours at the "
          f"reference's FLOPs (~{cpu_h / max(1, setup.workers):.2f} h wall on {setup.workers} workers)", flush=True)


def run_search(setup: common.Setup, space, proxy: Recipe, work: Path, url: str, total: int):
    """Create the study (or find it) and run it to `total` trials, the extra baseline included."""
    import time

    import optuna

    from npas import TrialAttr, resume, search
    from npas.service.search.samplers import split_baseline

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    work.mkdir(parents=True, exist_ok=True)
    rpath = work / "proxy.yaml"
    rpath.write_text(proxy.to_yaml())
    launch = searches.launch(setup.workers, True)
    t0 = time.perf_counter()
    names = optuna.get_all_study_names(url) if (work / "study.db").exists() else []
    if STUDY not in names:  # creating runs the baselines npas enqueues first, and stops there
        search(space, trials=len(space.baselines()), study=STUDY, storage=url, recipe=str(rpath), seed=0,
               launch=launch)
    st = optuna.load_study(study_name=STUDY, storage=url)
    if not any(t.user_attrs.get(TrialAttr.BASELINE) == EXTRA_BASELINE for t in st.trials):
        params, fixed = split_baseline(space, {**space.baselines()["full_tying"], "untied_norms": False})
        st.enqueue_trial(params, user_attrs={TrialAttr.BASELINE: EXTRA_BASELINE, TrialAttr.BASELINE_FIXED: fixed})
    if len(st.trials) < total or any(t.state.name in ("RUNNING", "WAITING") for t in st.trials):
        st = resume(STUDY, trials=total, storage=url, launch=launch)
    searches.shutdown_ray()
    return st, round(time.perf_counter() - t0, 1)


def run_validate(setup: common.Setup, score: Recipe, work: Path, url: str, top: int, seeds: int):
    import time

    from npas import CertifyOptions as Options
    from npas import certify

    rpath = work / "validate.yaml"
    rpath.write_text(score.to_yaml())
    t0 = time.perf_counter()
    cert = certify(STUDY, Options(pick="knee", top=top, sample=0, recipe=str(rpath), seeds=seeds,
                                  workers=setup.workers, threads=1), storage=url)
    searches.shutdown_ray()
    return cert, round(time.perf_counter() - t0, 1)


def stale_baseline(row: dict[str, Any]) -> str | None:
    """Why a comparison against this validated allocation is stale, or None: a per-layer MoE whose experts
    are narrower than MIN_EXPERT_WIDTH x d_model (read from the allocation's summary, `d=.. experts=PxN:kK:wW`)."""
    m = re.search(r"\bd=(\d+)\b.*\bexperts=\d+x\d+:k\d+:w(\d+)\b", row.get("summary") or "")
    if m is None or int(m[2]) >= MIN_EXPERT_WIDTH * int(m[1]):
        return None
    return (f"stale: its experts are {m[2]} wide at d_model {m[1]} (below d_model/2), a strawman; re-run with the "
            "fixed baseline")


def compare(cert: dict[str, Any]) -> list[dict[str, Any]]:
    """Paired Δ (same fresh seeds, test split) of the knee pick and of the best validated front point
    against each baseline and the FLOPs-matched dense model; negative = the search's point is better."""
    from npas.service.study.fidelity import paired_delta

    rows = [r for r in cert["allocations"] if r["complete"]]
    pick = next((r for r in rows if "pick" in r["roles"]), None)
    front = [r for r in rows if "front" in r["roles"] or "pick" in r["roles"]]
    best = min(front, key=lambda r: r["test_mean"], default=None)
    refs = [r for r in rows if "baseline" in r["roles"] or "flops_matched" in r["roles"]]
    out, table = [], []
    for who, r in (("knee pick", pick), ("best front point", best)):
        if r is None:
            continue
        for b in refs:
            if b["hash"] == r["hash"]:
                continue
            iv = paired_delta(r["test_losses"], b["test_losses"])
            stale = stale_baseline(b)
            verdict = stats.verdict_of(iv, "better") + (f" [{stale}]" if stale else "")
            name = b["label"] or ",".join(b["roles"])
            out.append({"search_point": who, "trial": r["trial"], "summary": r["summary"], "against": name,
                        "delta": dataclasses.asdict(iv), "verdict": verdict, "stale": stale,
                        "flops_ratio": r["flops_per_token"] / b["flops_per_token"],
                        "stored_ratio": r["stored_params"] / b["stored_params"]})
            table.append([f"{who} (#{r['trial']})", name, report.fmt_interval(iv), f"{out[-1]['stored_ratio']:.3f}",
                          f"{out[-1]['flops_ratio']:.3f}", verdict])
    print("\nsearch vs hand-crafted, test split, paired over the fresh seeds (negative = the search's point wins):")
    print(report.format_table(["search point", "against", "Δ test loss [95% CI]", "stored xref", "FLOPs xref",
                               "verdict (claim: search better)"], table))
    return out


def print_trials(rows: list[dict]) -> None:
    table = [[r["number"], r["baseline"] or "-", r["status"], r["steps_done"],
              "-" if not r["values"] else f"{r['values'][0]:.4f}",
              f"{r['stored_params'] or 0:,}", "yes" if r["on_front"] else "", r["summary"]] for r in rows]
    print(report.format_table(["trial", "baseline", "status", "steps", "proxy val loss", "stored", "front",
                               "allocation"], table))


def plot(setup: common.Setup, cert: dict[str, Any]) -> None:
    plt = report.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in cert["allocations"]:
        if not r["complete"] or r["proxy_loss"] is None:
            continue
        base = "baseline" in r["roles"]
        err = 0.0 if r["test_std"] is None else r["test_std"]
        ax.errorbar(r["proxy_loss"], r["test_mean"], yerr=err, fmt="s" if base else "o", capsize=3,
                    color="C1" if base else ("C3" if "pick" in r["roles"] else "C0"))
        ax.annotate(r["label"] or f"#{r['trial']}", (r["proxy_loss"], r["test_mean"]), fontsize=6,
                    xytext=(3, 3), textcoords="offset points")
    tau = cert["all"]["kendall_tau"]
    t = "-" if tau.get("value") is None else f"{tau['value']:.2f}"
    ax.set(xlabel="proxy val loss (search, a quarter of the steps)",
           ylabel="test loss, mean ± std over fresh seeds",
           title=f"proxy vs validated: Kendall τ = {t} (squares = hand-crafted, red = knee pick)")
    report.save_figure(setup, fig)


if __name__ == "__main__":
    main()
