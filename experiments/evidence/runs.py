"""The evidence scripts' training pool and its cache: every run is one ``experiments/device.py`` spec, trained
on spawned 1-thread processes here (or exported for a lent GPU machine), and every finished run is one
record in ``experiments/evidence/results/runs/`` (``experiments/harness/store.py``) keyed by arm, allocation, recipe, seed, device kind and code
version, so a killed or time-boxed script resumes where it stopped and only what is missing trains.

``run_arms`` is what an experiment calls: its arms x its seeds, plus (full mode) each arm's 3-point
learning-rate check on seed 99, which is never a reported seed. ``locate_rates`` + ``run_at_rates`` is the
stricter form the later rows use: the check first, extended outward while its best sits at an edge, then
each arm's seeds at its own located rate.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from common import CPU_FLOPS, LR_CHECK_FACTORS, LR_CHECK_SEED, ROOT, Setup, cpu_seconds
from report import format_table
from stats import optimum_located, optimum_words, paired_interval, summarize

import npas
from experiments.harness.jobs import Runs, run_missing, run_spec
from experiments.harness.version import code_version as code_version_of
from experiments.harness.version import recipe_settings
from npas import ArchConfig, Chassis, Recipe


def spec_of(job: dict[str, Any], dest: str = "") -> dict[str, Any]:
    """The experiments/device.py spec of a job: the one runner both a CPU pool and a GPU machine use."""
    recipe = Recipe.from_dict(job["recipe"])
    cfg = ArchConfig.from_dict(job["config"])
    return {"dest": dest, "config": cfg.to_json(), "recipe": recipe.to_dict(), "reference": job.get("reference"),
            "test": True, "est_s": cpu_seconds(npas.count(cfg).flops_per_token, recipe.steps * recipe.tokens_per_step),
            "meta": {"name": job["name"], "seed": recipe.seed, "recipe_name": recipe.name, "lr": recipe.lr},
            **{k: job[k] for k in ("init_weights", "save_weights") if job.get(k)}}  # conversion.py's phases


def train_job(job: dict[str, Any]) -> dict[str, Any]:
    """One run in a worker process (the harness's one training function): the job's identity plus its metrics."""
    rec = run_spec(spec_of(job))
    rec.setdefault("steps_done", rec.get("steps", 0))
    rec["wall_s"] = round(rec.get("wall_s") or 0.0, 2)
    return rec


def make_jobs(configs: dict[str, ArchConfig], setup: Setup, recipe: Recipe | None = None,
              seeds: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """Every config x every seed, seed-major so a cut-short run still has whole seeds; the fair
    parameterization scales against the setup's chassis (the experiment's reference)."""
    base = recipe or setup.recipe
    return [{"name": name, "config": cfg.to_dict(), "reference": setup.chassis.to_dict(),
             "recipe": {**base.to_dict(), "seed": seed}} for seed in (setup.seeds if seeds is None else seeds)
            for name, cfg in configs.items()]


def code_version(experiment: str) -> str:
    """The code version of an experiment's runs (``experiments/harness/version.py``): the numerics. Every run is
    keyed by what it trains (allocation, recipe, seed, device), so the experiments share one version and
    one cache: a run two of them train (the reference) trains once."""
    return code_version_of(f"evidence/{experiment}", cache="evidence")


def cache_path(job: dict[str, Any], cache: Path, device_kind: str, version: str) -> Path:
    recipe = Recipe.from_dict(job["recipe"])
    rhash = hashlib.sha256(json.dumps({**recipe_settings(recipe), "seed": 0}, sort_keys=True).encode()).hexdigest()[:8]
    chash = ArchConfig.from_dict(job["config"]).hash[:12]
    name = quote(job["name"], safe=" +=,.-_()")  # an arm named "private P/4" must not become a folder
    return cache / f"{name}-{chash}-{recipe.name}-{rhash}-s{recipe.seed}-{device_kind}-{version}.json"


def device_kind() -> str:
    """The cache's device tag: NPAS_EVIDENCE_DEVICE when set (an export), else this machine's."""
    import torch

    return os.environ.get("NPAS_EVIDENCE_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")


def runs_of(jobs: list[dict[str, Any]], cache: Path | None, kind: str, version: str) -> Runs:
    """The pool's jobs (by index) as the harness trains, plans and reads them (``experiments/harness/jobs.py``):
    each cached at ``cache_path`` (not at all without a ``cache``: quick runs train afresh), trained by
    ``train_job``, its record keeping the code version last."""
    return Runs(list(range(len(jobs))), lambda i: cache_path(jobs[i], cache, kind, version) if cache else None,
                lambda i: (ArchConfig.from_dict(jobs[i]["config"]), Recipe.from_dict(jobs[i]["recipe"]),
                           Chassis(**jobs[i]["reference"]) if jobs[i].get("reference") else None),
                lambda i: {"code_version": version}, work=train_job, work_args=lambda i: (jobs[i],), label_last=True)


def cached(jobs: list[dict[str, Any]], cache: Path | None, version: str) -> dict[int, dict[str, Any]]:
    """The cached records of ``jobs`` (by index, in job order; none without a cache): a read of the
    cache only, for a report that must not train."""
    return dict(runs_of(jobs, cache, device_kind(), version).cached())


def run_jobs(jobs: list[dict[str, Any]], workers: int, version: str, cache: Path | None = None,
             plan_only: bool = False) -> list[dict[str, Any]]:
    """Train the jobs on `workers` spawned processes (1 torch thread each); results in job order.

    With a ``cache`` folder, finished runs are read from it and every new one is written the moment
    it arrives, so only what is missing trains. ``plan_only`` (or NPAS_EVIDENCE_EXPORT) trains
    nothing and returns what is cached. ``version``: the experiment's code version (``code_version``)."""
    kind = device_kind()
    runs = runs_of(jobs, cache, kind, version)
    out = dict(runs.cached())
    todo = [i for i in runs.jobs if i not in out]
    recipe = lambda i: Recipe.from_dict(jobs[i]["recipe"])  # noqa: E731
    cost = runs.cost(todo, lambda i: recipe(i).steps * recipe(i).tokens_per_step,
                     lambda i: npas.count(ArchConfig.from_dict(jobs[i]["config"])).flops_per_token, CPU_FLOPS)
    print(f"plan: {len(jobs)} runs, {len(out)} cached ({kind}, code {version}); {len(todo)} to train, "
          f"{cost.tokens / 1e6:.1f}M tokens -> ~{cost.secs / 3600:.2f} CPU-hours (~{cost.secs / 3600 / max(1, workers):.2f} h "
          f"wall on {workers} workers)", flush=True)
    export = os.environ.get("NPAS_EVIDENCE_EXPORT")
    if export and cache:
        with open(export, "a") as f:
            for i in todo:
                f.write(json.dumps({**spec_of(jobs[i], str(cache_path(jobs[i], cache, "cuda", version).relative_to(ROOT))),
                                    "group": "evidence"}) + "\n")
        print(f"exported {len(todo)} specs to {export}")
    if not (plan_only or export):
        def done(n: int, total: int, i: int, rec: dict[str, Any], elapsed: float) -> None:
            out[i] = rec
            loss = "failed" if rec["val_loss"] is None else f"{rec['val_loss']:.4f}"
            print(f"  [{n}/{total}] {rec['name']} seed {rec['seed']}: val_loss {loss}  ({rec['wall_s']:.0f} s, "
                  f"elapsed {elapsed:.0f} s)", file=sys.stderr, flush=True)

        run_missing(runs, workers, None, done)
    return [out[i] for i in runs.jobs if i in out]


def run_arms(configs: dict[str, ArchConfig], setup: Setup, recipe: Recipe | None = None,
             lr_check: bool = True) -> list[dict[str, Any]]:
    """The experiment's runs (every arm x every seed) and, in full mode (unless ``lr_check`` is off),
    each arm's learning-rate check (x0.5, x1, x2 of the base rate on seed 99, never a reported seed),
    whose table is printed here. ``--plan`` (or an export) prints the plan and exits: nothing trains.

    With ``--arms`` only those arms train; their table is printed and the script exits without a report
    (one with missing arms would be wrong), so a long report can be built up a few arms per session."""
    configs = selected(configs, setup)
    jobs, checks = arm_jobs(configs, setup, recipe, lr_check)
    base = recipe or setup.recipe
    ordered = checks + jobs if setup.lr_bracket else jobs + checks  # a moved optimum shows before the seeds
    results = run_jobs(ordered, setup.workers, code_version(setup.name), setup.cache, setup.plan_only)
    if setup.plan_only or os.environ.get("NPAS_EVIDENCE_EXPORT"):
        raise SystemExit(0)  # a plan or an export trains nothing, so it must not write a report either
    main = [r for r in results if r.get("seed") != LR_CHECK_SEED or not checks]
    lr_rows = [r for r in results if r.get("seed") == LR_CHECK_SEED and checks]
    if lr_rows:
        print(lr_check_table(lr_rows, list(configs), base.lr))
    if setup.only:
        _print_partial(main, list(configs))
        raise SystemExit(0)
    return main


def selected(configs: dict[str, ArchConfig], setup: Setup) -> dict[str, ArchConfig]:
    """The arms ``--arms`` names (all without it); an unknown name ends the script in one line."""
    if not setup.only:
        return configs
    unknown = [a for a in setup.only if a not in configs]
    if unknown:
        raise SystemExit(f"--arms: unknown arm(s) {unknown}; this script's arms are {list(configs)}")
    return {a: configs[a] for a in setup.only}


def arm_jobs(configs: dict[str, ArchConfig], setup: Setup, recipe: Recipe | None = None,
             lr_check: bool = True) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(every arm x every seed, and in full mode the learning-rate check's runs on seed 99): the check
    brackets the recipe's rate; after --lr-factor only with --lr-bracket (the first check's points at the
    same rates are cached, so it adds the runs beyond the old grid's edge)."""
    checks = []
    if lr_check and not setup.quick and (setup.lr_factor == 1.0 or setup.lr_bracket):
        for f in LR_CHECK_FACTORS:
            checks += make_jobs(configs, setup, (recipe or setup.recipe).with_lr_factor(f), seeds=(LR_CHECK_SEED,))
    return make_jobs(configs, setup, recipe), checks


def _print_partial(results: list[dict[str, Any]], names: list[str]) -> None:
    """The --arms table: each arm against the first named one, paired over the seeds both ran."""
    ref = names[0]
    rows = []
    for row in summarize(results, names, ref):
        iv = paired_interval(results, row["name"], ref) if row["name"] != ref else None
        rows.append([row["name"], row["n"], f"{row['mean']:.4f}", f"{row['std']:.4f}",
                     "-" if iv is None or iv.low is None else f"{iv.value:+.4f} [{iv.low:+.4f}, {iv.high:+.4f}]"])
    print(f"partial (--arms; no report written): val loss by arm, paired Δ vs {ref} with 95% t-interval")
    print(format_table(["arm", "seeds", "mean", "std", "Δ vs " + ref], rows), flush=True)


def lr_check_table(rows: list[dict[str, Any]], names: Sequence[str], base_lr: float) -> str:
    """Per arm: loss at x0.5, x1, x2 of the base rate (seed 99), whether the optimum moved, and whether it
    was located (interior to the grid: `stats.optimum_located`); an edge optimum is "x2 or beyond"."""
    table = []
    for name in names:
        by_f = {round(r["lr"] / base_lr, 3): r.get("val_loss") for r in rows if r.get("name") == name}
        cells = [by_f.get(f) for f in LR_CHECK_FACTORS]
        ok = [(v, f) for v, f in zip(cells, LR_CHECK_FACTORS, strict=True) if v is not None]
        best = min(ok)[1] if len(ok) == len(LR_CHECK_FACTORS) else None
        table.append([name, *("-" if v is None else f"{v:.4f}" for v in cells), optimum_words(best, LR_CHECK_FACTORS)])
    return f"learning-rate check (seed {LR_CHECK_SEED}, val loss):\n" + format_table(
        ["arm", *(f"lr x{f:g}" for f in LR_CHECK_FACTORS), "optimum"], table)


# how far ``locate_rates`` extends the check while its best is at an edge: only a bound on cost (the
# hashed row's low-budget arms were still improving at x8, so x8 was too near)
RATE_EDGES = (1 / 32, 32.0)


def _bases(configs: dict[str, ArchConfig], setup: Setup, recipes: dict[str, Recipe] | None) -> dict[str, Recipe]:
    """Each arm's recipe at x1: its own where ``recipes`` has one (a longer run at equal FLOPs), else the setup's."""
    return {n: (recipes or {}).get(n, setup.recipe) for n in configs}


def locate_rates(configs: dict[str, ArchConfig], setup: Setup, version: str,
                 recipes: dict[str, Recipe] | None = None) -> dict[str, tuple[float, bool]]:
    """Each arm's best rate factor on seed 99 (never reported) and whether it is interior to the grid it
    was checked on: the check starts at ``LR_CHECK_FACTORS`` and grows by a factor of 2 past whichever edge
    holds the best, up to ``RATE_EDGES``, so an optimum beyond the first grid is located, not assumed.
    ``recipes``: an arm's own recipe at x1 where it differs from the setup's (a longer run at equal FLOPs)."""
    base = _bases(configs, setup, recipes)
    grid = {name: list(LR_CHECK_FACTORS) for name in configs}
    losses: dict[str, dict[float, float]] = {name: {} for name in configs}
    while True:
        todo = [(n, f) for n in configs for f in grid[n] if f not in losses[n]]
        if todo:
            jobs = [j for n, f in todo for j in make_jobs({n: configs[n]}, setup, base[n].with_lr_factor(f), (LR_CHECK_SEED,))]
            recs = run_jobs(jobs, setup.workers, version, setup.cache)
            if len(recs) < len(todo):  # an export: the walk's next step needs these runs' losses
                print("the rate walk stops here: its next step needs the exported check runs' losses", flush=True)
                raise SystemExit(0)
            for (n, f), rec in zip(todo, recs, strict=True):
                losses[n][f] = rec["val_loss"] if rec.get("val_loss") is not None else float("inf")
        grown = False
        for n in configs:
            best = min(grid[n], key=lambda f: losses[n][f])
            if best == min(grid[n]) and best > RATE_EDGES[0]:
                grid[n].insert(0, best / 2)
                grown = True
            elif best == max(grid[n]) and best < RATE_EDGES[1]:
                grid[n].append(best * 2)
                grown = True
        if not grown:
            break
    out, rows = {}, []
    for n in configs:
        best = min(grid[n], key=lambda f: losses[n][f])
        out[n] = (best, optimum_located(best, grid[n]))
        rows.append([n, ", ".join(f"x{f:g} {losses[n][f]:.4f}" for f in grid[n]), optimum_words(best, grid[n])])
    print(f"learning-rate location (seed {LR_CHECK_SEED}, val loss):")
    print(format_table(["arm", "rates tried", "optimum"], rows), flush=True)
    return out


def run_at_rates(configs: dict[str, ArchConfig], setup: Setup, version: str, rates: dict[str, tuple[float, bool]],
                 recipes: dict[str, Recipe] | None = None) -> list[dict[str, Any]]:
    """Every arm's reported seeds at its own rate factor (``locate_rates``'s first element), seed-major so
    a cut-short run keeps whole seeds."""
    base = _bases(configs, setup, recipes)
    jobs = [j for n, c in configs.items() for j in make_jobs({n: c}, setup, base[n].with_lr_factor(rates[n][0]))]
    jobs.sort(key=lambda j: j["recipe"]["seed"])  # stable: the arms' order within a seed
    return run_jobs(jobs, setup.workers, version, setup.cache)


def run_located(configs: dict[str, ArchConfig], setup: Setup, recipes: dict[str, Recipe] | None = None
                ) -> tuple[dict[str, ArchConfig], dict[str, tuple[float, bool]], list[dict[str, Any]]]:
    """``run_arms`` for the rows that locate each arm's rate (``locate_rates``) before its seeds: the arms
    run (``--arms`` applied), each one's (rate factor, located), and the seeds' records. ``--plan`` prints
    the plan and exits; quick mode skips the walk (x1, "not located" is not claimed there)."""
    if setup.lr_factor != 1.0:
        raise SystemExit("--lr-factor: this experiment locates each arm's rate itself (seed 99); drop --lr-factor")
    configs = selected(configs, setup)
    version = code_version(setup.name)
    if setup.plan_only:
        plan_located(configs, setup, version, recipes)
        raise SystemExit(0)
    rates = {n: (1.0, False) for n in configs} if setup.quick else locate_rates(configs, setup, version, recipes)
    return configs, rates, run_at_rates(configs, setup, version, rates, recipes)


def rate_column(rates: dict[str, tuple[float, bool]], quick: bool) -> dict[str, dict[str, str]]:
    """The results table's "lr" column (``report.print_results``'s extra): each arm's factor, "(edge)"
    where the walk ended at its bound."""
    return {n: {"lr": f"x{f:g}" + ("" if ok or quick else " (edge)")} for n, (f, ok) in rates.items()}


def unlocated_note(rates: dict[str, tuple[float, bool]], first: str, second: str, quick: bool) -> str:
    """What a verdict between two arms adds when either one's rate is not located (quick mode claims none)."""
    return "" if quick or (rates[first][1] and rates[second][1]) else " (a rate at its grid's edge: not located)"


def rates_record(rates: dict[str, tuple[float, bool]]) -> dict[str, dict[str, Any]]:
    """The report JSON's per-arm rates."""
    return {n: {"factor": f, "located": ok} for n, (f, ok) in rates.items()}


def plan_located(configs: dict[str, ArchConfig], setup: Setup, version: str,
                 recipes: dict[str, Recipe] | None = None) -> None:
    """The runs a located report needs: the check's first grid and the reported seeds (at x1: a run's cost
    does not depend on its rate), plus the most the edge extensions could add."""
    base = _bases(configs, setup, recipes)
    jobs = [j for f in LR_CHECK_FACTORS for n, c in configs.items()
            for j in make_jobs({n: c}, setup, base[n].with_lr_factor(f), (LR_CHECK_SEED,))]
    jobs += [j for n, c in configs.items() for j in make_jobs({n: c}, setup, base[n])]
    run_jobs(jobs, setup.workers, version, setup.cache, plan_only=True)
    per_run = max(cpu_seconds(npas.count(c).flops_per_token, base[n].steps * base[n].tokens_per_step)
                  for n, c in configs.items())
    steps = round(math.log2(RATE_EDGES[1] / max(LR_CHECK_FACTORS)))  # x4 .. x32 (or down to x1/32) per arm at most
    worst = steps * len(configs)  # in practice one or two per arm
    print(f"plan: edge extensions add at most {worst} runs (~{worst * per_run / 3600:.2f} CPU-hours)")
