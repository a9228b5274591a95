"""A recipe's base learning rate: is the proxy's rate where the space's baselines learn best?

``lr_transfer.py`` checks one half of fair training: under ``fair``, every allocation's optimum sits
at the reference's, so one base rate serves a whole search. This bench checks the other half: that
the search's recipe puts that base rate at the optimum. A rate below it under-trains every proxy
run, and an under-trained proxy rewards whatever raises the effective step (the second evidence
edition saw LoRA adapters do exactly that), which is noise in the ranking, not allocation.

It trains baselines of ``experiments/spaces/full_frozen.yaml`` (the space ``proxy_fidelity.py`` ranks; by
default its two cheapest, ``narrow_untied`` and ``cycle_tying``) with the ``proxy`` recipe at
x0.5, x1, x2 and x4 of its rate (the cosine floor scaled with it), on fresh seeds 20 and 21 under the
default ``fair`` parameterization, scored on the validation split as a search scores them.

Target: every arm's optimum (mean over seeds) at x1 of the recipe's rate, i.e. the recipe is within
half a x2 step of the optimum on the grid (PASS/MISS; INCOMPLETE while runs are missing). The
sub-grid position from a parabola in log2(lr) is printed beside it.

Each finished run is cached in ``experiments/results/recipe_lr/`` (``experiments/harness/store.py``) keyed by (arm, allocation hash,
factor, seed, code version); the code version is that of the training numerics (``npas.conversion.numerics``)
and the recipe, so editing the frozen proxy starts a fresh cache. A shipped recipe's sweep (``--recipe
NAME``) keys its runs by the rate they train at and leaves the base rate out of its version, so
re-tuning that rate keeps the grid it was re-tuned from.

    python experiments/recipe_lr.py --plan          runs x tokens -> estimated CPU-hours
    nice -n 10 python experiments/recipe_lr.py      train what is missing (2 workers), then the table
    python experiments/recipe_lr.py --arms narrow_untied,cycle_tying,full_tying   all three baselines
    python experiments/recipe_lr.py --quick         smoke recipe, tiny steps, temp dir
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere in the checkout
    sys.path.insert(0, str(ROOT))

from experiments.harness import jobs as jobs_lib  # noqa: E402
from experiments.harness.cli import bench_parser, version_to_read  # noqa: E402
from experiments.harness.version import code_version as harness_version  # noqa: E402
from experiments.harness.version import recipe_settings  # noqa: E402
from experiments.lr_transfer import CPU_FLOPS, optimum  # noqa: E402
from experiments.proxy_fidelity import (  # noqa: E402
    Candidate,
    code_version,
    load_candidates,
    make_setup,
)
from npas import Recipe  # noqa: E402

RESULTS = ROOT / "experiments" / "results" / "recipe_lr"
FACTORS = (0.5, 1.0, 2.0, 4.0)
QUICK_FACTORS = (0.5, 1.0, 2.0)
SEEDS = (20, 21)  # never the proxy's seed 0 nor proxy_fidelity's long seeds 1000+
DEFAULT_ARMS = ("narrow_untied", "cycle_tying")
Job = tuple[Candidate, float, int]  # (arm, lr factor, seed)


def scaled(recipe: Recipe, factor: float, seed: int, threads: int | None = None) -> Recipe:
    d = {**recipe.with_lr_factor(factor).to_dict(), "seed": seed, "parameterization": "fair"}
    return Recipe.from_dict(d if threads is None else {**d, "threads": threads})


def shipped(name: str) -> Recipe:
    """A recipe npas ships (``npas/builtin/recipes``), by name: the rate item 2 of issue #35 re-tunes.
    One thread per run: the bench's pool runs one worker per core (``long`` asks for 2)."""
    from npas import load_recipe
    from npas.training.recipe import resolve_recipe

    return load_recipe(resolve_recipe(name))


def shipped_version(recipe: Recipe) -> str:
    """The cache version of a shipped recipe's sweep: the numerics and this recipe bar its rate. The rate
    is left out and each run keyed by the rate it trains at (``key``), so re-tuning the recipe's base
    rate -- what this sweep is for -- keeps every run: x1 at the new rate is the old grid's run at that
    rate. The cosine floor stays in as its ratio to the peak (``with_lr_factor`` scales both). A WSD
    recipe's ``rungs`` are left out too: its forks branch off beside the run and leave the run's own
    loss, the one this sweep scores, bit for bit as it was (tests/training/test_checkpoint.py)."""
    d = recipe_settings(recipe, leave_out=("seed", "parameterization", "threads", "lr", "min_lr", "rungs"))
    return harness_version("recipe_lr", {**d, "floor_ratio": round(recipe.min_lr / recipe.lr, 9)})


def key(c: Candidate, factor: float, seed: int, version: str, base_lr: float | None = None) -> str:
    """A run's name: by its factor (the frozen proxy's cache), or by the rate it trains at, ``base_lr x
    factor`` (a shipped recipe's: its version leaves the base rate out)."""
    at = f"x{factor:g}" if base_lr is None else f"lr{base_lr * factor:.4g}"
    return f"{c.name}-{c.config.hash[:8]}-{at}-s{seed}-{version}"


def runs_of(recipe: Recipe, jobs: list[Job], out: Path, version: str, reference: Any,
            threads: int | None = None, by_rate: bool = False) -> jobs_lib.Runs:
    """The bench's runs as the harness trains, plans and reads them (``experiments/harness/jobs.py``); a shipped
    recipe's (`by_rate`) named by the rate each trains at."""
    base = recipe.lr if by_rate else None
    return jobs_lib.Runs(jobs, lambda j: out / f"{key(*j, version, base)}.json",
                         lambda j: (j[0].config, scaled(recipe, j[1], j[2], threads), reference),
                         lambda j: {"arm": j[0].name, "factor": j[1], "seed": j[2], "code_version": version})


def progress(_i: int, _n: int, job: Job, rec: dict, elapsed: float) -> None:
    loss = rec["val_loss"] if rec["status"] == "ok" else None
    print(f"  {job[0].name:<14} x{job[1]:<4g} seed {job[2]}: val {'-' if loss is None else f'{loss:.4f}'} "
          f"({rec['wall_s']:.0f} s, {elapsed:.0f} s elapsed)", flush=True)


def report(runs: jobs_lib.Runs, arms: list[Candidate], factors: tuple[float, ...], seeds: tuple[int, ...],
           base_lr: float) -> str:
    """Print the loss grid and each arm's optimum; return PASS, MISS or INCOMPLETE."""
    print(f"\nmean val loss (nats) over seeds {list(seeds)}, lr = factor x {base_lr:g}; 'div' = diverged")
    print(f"{'arm':<14}" + "".join(f"{'x' + format(f, 'g'):>9}" for f in factors) + f"{'best':>7}{'sub-grid':>10}")
    verdicts = []
    for c in arms:
        means = []
        for f in factors:
            recs = [r for _, r in runs.cached([(c, f, s) for s in seeds])]
            losses = [r["val_loss"] if r["status"] == "ok" and r["val_loss"] is not None else math.inf for r in recs]
            means.append(statistics.fmean(losses) if len(losses) == len(seeds) else None)
        cells = "".join(f"{'-' if m is None else ('div' if not math.isfinite(m) else f'{m:.4f}'):>9}" for m in means)
        if any(m is None for m in means):
            verdicts.append("INCOMPLETE")
            print(f"{c.name:<14}{cells}{'-':>7}{'-':>10}")
            continue
        i, sub = optimum(means)
        one = factors.index(1.0)
        verdicts.append("PASS" if i == one else "MISS")
        # the sub-grid position as a factor of the recipe's rate: grid steps are x2
        print(f"{c.name:<14}{cells}{'x' + format(factors[i], 'g'):>7}{'x' + format(2 ** (sub - one), '.2f'):>10}")
    verdict = "INCOMPLETE" if "INCOMPLETE" in verdicts else ("MISS" if "MISS" in verdicts else "PASS")
    print(f"target: every arm's optimum at x1 of the recipe's rate ({base_lr:g}): {verdict}")
    return verdict


def main(argv: list[str] | None = None) -> int:
    p = bench_parser(__doc__.split("\n\n")[0], "smoke recipe at 6 steps, 3 factors, 1 seed, temp dir", RESULTS)
    p.add_argument("--recipe", default=None, metavar="NAME",
                   help="a shipped recipe by name (proxy, long, ladder, smoke, smoke-wsd; npas/builtin/recipes) "
                        "instead of the bench's frozen proxy: its cache is its own")
    p.add_argument("--factors", default=None, help="comma-separated lr factors (default 0.5,1,2,4)")
    p.add_argument("--seeds", default=None, help="comma-separated seeds (default 20,21)")
    p.add_argument("--arms", default=",".join(DEFAULT_ARMS),
                   help="comma-separated baselines of full_frozen.yaml (narrow_untied, cycle_tying, full_tying)")
    a = p.parse_args(argv)
    setup = make_setup(a.quick, None, None, a.out or (None if a.quick else RESULTS), a.workers)
    recipe = setup.proxy if a.recipe is None else shipped(a.recipe)
    factors, seeds = (QUICK_FACTORS, SEEDS[:1]) if a.quick else (FACTORS, SEEDS)
    if a.quick and a.recipe is not None:  # the shipped recipe, cut to the quick sweep's length
        recipe = recipe.with_steps(setup.proxy.steps) if recipe.schedule == "cosine" else recipe.with_steps(recipe.fork_rungs()[0])
    if a.factors:
        factors = tuple(float(x) for x in a.factors.split(","))
        if 1.0 not in factors:
            p.error("--factors must include 1 (the recipe's own rate)")
    if a.seeds:
        seeds = tuple(int(x) for x in a.seeds.split(","))
    space, cands = load_candidates(setup)
    by_name = {c.name: c for c in cands if c.name in space.baselines()}
    wanted = [n.strip() for n in a.arms.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in by_name]
    if unknown or not wanted:
        p.error(f"--arms {a.arms!r}: choose from {', '.join(by_name)}")
    arms = [by_name[n] for n in wanted]
    # proxy_fidelity's key (same files, same recipe), or the shipped recipe's own
    version = version_to_read(p, a, code_version(setup) if a.recipe is None else shipped_version(recipe))
    out = setup.out if a.recipe is None or a.quick or a.out else setup.out / a.recipe
    print(f"[recipe_lr] recipe {recipe.name}: lr {recipe.lr:g} -> {recipe.min_lr:g}, {recipe.steps} steps x "
          f"{recipe.tokens_per_step} tokens | arms {wanted} | factors {list(factors)} | seeds {list(seeds)} | "
          f"fair | code {version}", flush=True)
    runs = runs_of(recipe, [(c, f, s) for s in seeds for c in arms for f in factors], out, version,
                   space.reference_chassis, None if a.recipe is None else 1, by_rate=a.recipe is not None)
    if a.plan:
        tokens = recipe.steps * recipe.tokens_per_step
        secs = runs.cost(runs.jobs, lambda j: tokens, lambda j: j[0].flops, CPU_FLOPS).secs
        print(f"plan: {len(runs.jobs)} runs x {tokens:,} tokens -> ~{secs / 3600:.2f} CPU-hours "
              f"(~{secs / 3600 / max(1, setup.workers):.2f} h wall on {setup.workers} workers)")
        return 0
    if not a.report:
        jobs_lib.run_missing(runs, setup.workers, f" in {out}", progress)
    report(runs, arms, factors, seeds, recipe.lr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
