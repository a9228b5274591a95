"""Learning-rate transfer: does one base learning rate suit every allocation?

A search trains every candidate with the recipe's one base learning rate, so the ranking is only
fair if each allocation's best learning rate sits where the reference's does. This bench sweeps the
base rate over a x2 grid for allocations that differ from the reference (the untied uniform model at
the middle depth and width) in depth, width, tying, pooling and LoRA relaxation, trains each with
the real proxy loop (``experiments/harness/jobs.py``'s ``train_and_score``, reference chassis passed so the ``fair``
rules see the width and depth ratios), and prints where each optimum lies under the ``fair``
parameterization and the old ``uniform`` one side by side.

Target: under ``fair``, every arm's optimum (mean loss over seeds) within one grid step of the
reference's.

Finished runs are cached in ``experiments/results/lr_transfer/`` (``experiments/harness/store.py``) keyed by (arm, lr, seed,
parameterization, allocation hash, code version), so a killed or time-boxed run resumes where it
stopped; the code version is that of the training numerics (``npas.conversion.numerics``), the recipe and
the reference chassis, so a change to any of them starts afresh (and editing this report does not).

    python experiments/lr_transfer.py --plan        runs x tokens -> estimated CPU-hours, trains nothing
    nice -n 10 python experiments/lr_transfer.py    run what is missing (2 workers), then print the table
    python experiments/lr_transfer.py --report --out experiments/results/lr_transfer_h200   the GPU runs (experiments/device.py)
    python experiments/lr_transfer.py --report      print the table from the cache only
    python experiments/lr_transfer.py --quick       a tiny chassis, seconds, output to a temp dir (smoke test)
"""

from __future__ import annotations

import math
import statistics
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere in the checkout
    sys.path.insert(0, str(ROOT))

import npas  # noqa: E402
from experiments.harness import jobs as jobs_lib  # noqa: E402
from experiments.harness.cli import bench_parser, version_to_read  # noqa: E402
from experiments.harness.report import Columns, cost_table  # noqa: E402
from experiments.harness.version import code_version as harness_version  # noqa: E402
from experiments.harness.version import recipe_settings  # noqa: E402
from npas import ArchConfig, Bank, Chassis, Recipe, reference_config  # noqa: E402
from npas.allocation.config import block_slots  # noqa: E402
from npas.training.recipe import PARAMETERIZATIONS  # noqa: E402

RESULTS = ROOT / "experiments" / "results" / "lr_transfer"
RESULTS_GPU = ROOT / "experiments" / "results" / "lr_transfer_h200"  # runs made on the lent H200 (experiments/device.py)
SEEDS = (10, 11)  # fresh seeds: the parameterization's exponents were chosen looking at seeds 0 and 1
CPU_FLOPS = 5e10  # training FLOP/s of one thread, measured here: d_model 64-128 runs reach 50-70 GFLOP/s

REFERENCE = Chassis(vocab_size=68, context=64, d_model=64, n_layers=4, n_heads=4, d_ff=256)
RECIPE = Recipe(name="lr-transfer", seq_len=64, batch_size=16, steps=400, warmup_steps=40, eval_every=400,
                eval_batches=8, threads=1)  # 410k tokens a run; lr and min_lr = lr/10 set per grid point
GRID = (1.25e-3, 2.5e-3, 5e-3, 1e-2, 2e-2, 4e-2)  # x2 steps; a probe put the reference's optimum near 1e-2
LORA_RANKS = (4, 16)

QUICK_REFERENCE = Chassis(vocab_size=68, context=16, d_model=16, n_layers=2, n_heads=2, d_ff=64)
QUICK_RECIPE = Recipe(name="lr-transfer-quick", seq_len=16, batch_size=4, steps=6, warmup_steps=2, eval_every=6,
                      eval_batches=1, threads=1)
QUICK_GRID = (5e-3, 1e-2, 2e-2)
QUICK_LORA_RANKS = (2, 4)


@dataclass(frozen=True)
class Setup:
    reference: Chassis
    recipe: Recipe
    grid: tuple[float, ...]
    seeds: tuple[int, ...]
    lora_ranks: tuple[int, ...]
    out: Path
    workers: int


@dataclass(frozen=True)
class Job:
    arm: str
    lr: float
    seed: int
    parameterization: str

    def key(self, cfg: ArchConfig, version: str) -> str:
        return f"{self.arm}-{self.parameterization}-lr{self.lr:.4g}-s{self.seed}-{cfg.hash[:8]}-{version}"


# ------------------------------------------------------------------------------------------ arms
def arms(ref: Chassis, lora_ranks: tuple[int, ...]) -> dict[str, ArchConfig]:
    """The reference and the allocations whose optimum should match it, built as plain ArchConfigs."""
    L, d = ref.n_layers, ref.d_model
    out = {"reference": reference_config(ref)}
    for depth in (L // 2, 2 * L):
        out[f"untied_L{depth}"] = reference_config(replace(ref, n_layers=depth))
    for width in (d // 2, 2 * d):
        out[f"untied_d{width}"] = reference_config(replace(ref, d_model=width, d_ff=ref.d_ff * width // d))
    full = ArchConfig(chassis=ref, mlp_widths=(ref.d_ff,) * L, block_of_layer=(0,) * L)
    out["tied_full"] = full
    out["tied_cycle2"] = replace(full, block_of_layer=tuple(i % 2 for i in range(L)))
    # every slot kind pooled across the L untied blocks: 2 mixed templates each (half the block weights)
    banks = tuple(Bank(members=tuple((b, slot) for b in range(L)), generator="template_mix",
                       size=math.prod(full.slot_shape(0, slot)), templates=2)
                  for slot in block_slots(ref.activation))
    out["pools_tmix"] = ArchConfig(chassis=ref, mlp_widths=(ref.d_ff,) * L, block_of_layer=tuple(range(L)),
                                   banks=banks)
    for r in lora_ranks:
        out[f"lora_r{r}"] = replace(full, lora_attn=(r,) * L, lora_mlp=(r,) * L)
    return out


# ------------------------------------------------------------------------------------------ runs
def version_settings(setup: Setup) -> list[dict]:
    """What every run shares: the base recipe and the reference chassis."""
    return [recipe_settings(setup.recipe), setup.reference.__dict__]


def code_version(setup: Setup) -> str:
    """The cache's code version (``experiments/harness/version.py``): the numerics and ``version_settings``."""
    return harness_version("lr_transfer", version_settings(setup))


def recipe_for(setup: Setup, job: Job) -> Recipe:
    return Recipe.from_dict({**setup.recipe.to_dict(), "lr": job.lr, "min_lr": job.lr / 10, "seed": job.seed,
                             "parameterization": job.parameterization})


def jobs_of(setup: Setup, configs: dict[str, ArchConfig]) -> list[Job]:
    """Every run, seed-major so a partial cache holds whole sweeps, and within a seed the cheapest arms
    first (FLOPs per token), so a time-boxed session measures the most arms; the reference runs once
    (fair and uniform train it identically: all its multipliers are 1, tests/training/test_parameterization.py)."""
    names = sorted(configs, key=lambda n: (n != "reference", npas.count(configs[n]).flops_per_token))
    out = []
    for seed in setup.seeds:
        for name in names:
            for par in (("uniform",) if name == "reference" else PARAMETERIZATIONS):
                out.extend(Job(name, lr, seed, par) for lr in setup.grid)
    return out


def runs_of(setup: Setup, configs: dict[str, ArchConfig], version: str) -> jobs_lib.Runs:
    """The bench's runs as the harness trains, plans, reads and exports them (``experiments/harness/jobs.py``)."""
    return jobs_lib.Runs(jobs_of(setup, configs), lambda j: setup.out / f"{j.key(configs[j.arm], version)}.json",
                         lambda j: (configs[j.arm], recipe_for(setup, j), setup.reference),
                         lambda j: {"arm": j.arm, "lr": j.lr, "seed": j.seed, "parameterization": j.parameterization,
                                    "code_version": version})


def progress(i: int, n: int, j: Job, _rec: dict, elapsed: float) -> None:
    if i == n or i % 10 == 0:
        print(f"  {i}/{n} done ({elapsed:.0f} s), last {j.arm} {j.parameterization} lr {j.lr:g} seed {j.seed}",
              flush=True)


PLAN_COLUMNS = Columns((("arm", "<14"), ("runs", ">6"), ("tokens/run", ">12,"), ("fwd FLOPs/tok", ">15,"),
                        ("est CPU-h", ">11.2f")))


def plan(setup: Setup, configs: dict[str, ArchConfig], version: str) -> None:
    """Runs x tokens -> CPU-hours, from `npas.count`'s FLOPs and a measured CPU rate; trains nothing."""
    tokens = setup.recipe.steps * setup.recipe.tokens_per_step
    runs = runs_of(setup, configs, version)
    flops = {name: npas.count(cfg).flops_per_token for name, cfg in configs.items()}
    total, left = cost_table(runs, [(name, [j for j in runs.jobs if j.arm == name]) for name in configs],
                             PLAN_COLUMNS, lambda name, cost: (name, cost.runs, tokens, flops[name], cost.secs / 3600),
                             lambda j: tokens, lambda j: flops[j.arm], CPU_FLOPS)
    n = len(runs.jobs)
    print(f"plan: {n} runs x {tokens:,} tokens = {n * tokens / 1e6:.0f}M tokens -> ~{total / 3600:.2f} CPU-hours "
          f"at {CPU_FLOPS / 1e9:.0f} GFLOP/s per thread (3x forward FLOPs, evaluation excluded); "
          f"~{left / 3600 / setup.workers:.2f} h wall left on {setup.workers} workers "
          f"({1 - left / max(total, 1e-9):.0%} cached)")


# ------------------------------------------------------------------------------------------ report
def load_results(setup: Setup, configs: dict[str, ArchConfig], version: str) -> dict[tuple, float]:
    """(arm, parameterization, lr, seed) -> final val loss (inf for a failed run), for the runs of
    exactly these arms, recipe and code version."""
    out = {}
    for j, r in runs_of(setup, configs, version).cached():
        loss = r["val_loss"] if r["status"] == "ok" and r["val_loss"] is not None else math.inf
        out[j.arm, j.parameterization, j.lr, j.seed] = loss
        if j.arm == "reference":  # one run stands for both parameterizations
            out["reference", "fair", j.lr, j.seed] = loss
    return out


def curve(res: dict, arm: str, par: str, setup: Setup) -> tuple[list[int], list[float], list[float]] | None:
    """(seeds, arm's mean loss per grid point, reference's mean loss per grid point) over the seeds
    complete for both, so an arm is always compared with the reference on the same seeds."""
    seeds = [s for s in setup.seeds
             if all((a, par, lr, s) in res for a in (arm, "reference") for lr in setup.grid)]
    if not seeds:
        return None

    def mean(a: str) -> list[float]:
        return [statistics.fmean(res[a, par, lr, s] for s in seeds) for lr in setup.grid]

    return seeds, mean(arm), mean("reference")


def optimum(losses: list[float]) -> tuple[int, float]:
    """Grid index of the lowest loss, and a sub-grid position from a parabola through its neighbours
    in log2(lr) (the index itself at the grid's edges or when a neighbour diverged)."""
    i = min(range(len(losses)), key=losses.__getitem__)
    if 0 < i < len(losses) - 1 and all(math.isfinite(v) for v in losses[i - 1:i + 2]):
        a, b, c = losses[i - 1:i + 2]
        den = a - 2 * b + c
        if den > 0:
            return i, i + 0.5 * (a - c) / den
    return i, float(i)


MIN_MOVE = 0.25  # x2 steps: a rule that moves an optimum by less than this gives no estimate


def implied_exponent(uniform: float, fair: float, exponent: float) -> float | None:
    """The sharing exponent that would put an arm's optimum on the reference's, from its sub-grid
    optimum shifts (x2 steps from the reference's) under ``uniform`` (no sharing correction, exponent 0)
    and ``fair`` (``exponent``), assuming the shift is linear in the exponent between the two: an
    extrapolation from two points, so a direction, not a fit. None when the rule moved the optimum by
    less than ``MIN_MOVE`` (the shift says nothing about the exponent then)."""
    if abs(fair - uniform) < MIN_MOVE:
        return None
    return exponent * uniform / (uniform - fair)


def report(setup: Setup, configs: dict[str, ArchConfig], version: str) -> bool:
    """Print the loss grid and the optima side by side; True when every run is cached."""
    names = list(configs)
    res = load_results(setup, configs, version)
    grid = "  ".join(f"{lr:>8.4g}" for lr in setup.grid)
    print(f"\nmean final val loss (nats) over the seeds shown, lr grid x2:\n{'arm':<14}{'param':<9}{grid}  seeds")
    rows: dict[tuple[str, str], tuple[list[int], tuple[int, float], tuple[int, float]]] = {}
    for name in names:
        for par in PARAMETERIZATIONS:
            c = curve(res, name, par, setup)
            if c is None:
                print(f"{name:<14}{par:<9}" + "  ".join(f"{'-':>8}" for _ in setup.grid))
                continue
            seeds, losses, ref_losses = c
            rows[name, par] = seeds, optimum(losses), optimum(ref_losses)
            print(f"{name:<14}{par:<9}" + "  ".join(f"{v:>8.4f}" if math.isfinite(v) else f"{'div':>8}"
                                                   for v in losses) + f"  {seeds}")
    print(f"\noptimum vs the reference's on the same seeds (steps of x2; sub-grid from a parabola in log2 lr)\n"
          f"{'arm':<14}{'fair: best lr':>14}{'steps':>7}{'(sub-grid)':>11}   "
          f"{'uniform: best lr':>17}{'steps':>7}{'(sub-grid)':>11}")
    within = {p: 0 for p in PARAMETERIZATIONS}
    counted = {p: 0 for p in PARAMETERIZATIONS}
    for name in names:
        cells = []
        for par in PARAMETERIZATIONS:
            if (name, par) not in rows:
                cells.append(f"{'-':>14}{'-':>7}{'-':>11}")
                continue
            _, (i, sub), (ri, rsub) = rows[name, par]
            counted[par] += 1
            within[par] += abs(i - ri) <= 1
            cells.append(f"{setup.grid[i]:>14.4g}{i - ri:>+7d}{sub - rsub:>+11.2f}")
        print(f"{name:<14}{cells[0]}   {cells[1]:>35}")
    _print_implied_exponents(names, rows)
    n = len(names)
    complete = len(res) == len(jobs_of(setup, configs)) + len(setup.grid) * len(setup.seeds)  # + reference alias
    so_far = "" if complete else "so far "
    verdict = ("PASS" if within["fair"] == n else "MISS") if complete else "INCOMPLETE"
    print(f"\ntarget: every optimum within one grid step of the reference's under fair: {verdict} "
          f"({so_far}{within['fair']}/{counted['fair']} arms within one step, {n} arms in all)")
    old = ("yes" if within["uniform"] == n else "no") if complete else "unknown"
    print(f"old (uniform) already met it: {old} "
          f"({so_far}{within['uniform']}/{counted['uniform']} arms within one step)")
    return complete


def _print_implied_exponents(names: list[str], rows: dict) -> None:
    """Per shared arm (tied, pooled, relaxed): the sharing exponent its two optima point at."""
    from npas.training.parameterization import SHARING_EXPONENT

    lines = []
    for name in names:
        if not name.startswith(("tied_", "pools_", "lora_")) or not all((name, p) in rows for p in ("fair", "uniform")):
            continue
        shift = {p: rows[name, p][1][1] - rows[name, p][2][1] for p in ("fair", "uniform")}
        e = implied_exponent(shift["uniform"], shift["fair"], SHARING_EXPONENT)
        lines.append(f"{name:<14}{shift['uniform']:>+9.2f}{shift['fair']:>+9.2f}   " +
                     (f"{e:+.2f}" if e is not None else f"- (the rule moved it under {MIN_MOVE} step)"))
    if lines:
        print(f"\nimplied sharing exponent (the default is {SHARING_EXPONENT}; linear between uniform = 0 and "
              f"fair, sub-grid steps from the reference's):\n{'arm':<14}{'uniform':>9}{'fair':>9}   exponent")
        print("\n".join(lines))


def full_setup(n_seeds: int = len(SEEDS), out: Path = RESULTS, workers: int = 2) -> Setup:
    return Setup(REFERENCE, RECIPE, GRID, tuple(SEEDS[0] + i for i in range(n_seeds)), LORA_RANKS, out, workers)


def device_specs() -> list[dict]:
    """Every run of the full bench as a spec for experiments/device.py (GPU cache: RESULTS_GPU)."""
    setup = full_setup(out=RESULTS_GPU)
    return runs_of(setup, arms(setup.reference, setup.lora_ranks), code_version(setup)).device_specs(test=False)


def main(argv: list[str] | None = None) -> int:
    p = bench_parser(__doc__.split("\n\n")[0], "tiny chassis, 3-point grid, 1 seed: seconds", RESULTS)
    p.add_argument("--seeds", type=int, default=None, help="seeds per grid point (default 2; 1 quick)")
    a = p.parse_args(argv)
    if a.quick:
        setup = Setup(QUICK_REFERENCE, QUICK_RECIPE, QUICK_GRID, tuple(range(a.seeds or 1)), QUICK_LORA_RANKS,
                      a.out or Path(tempfile.mkdtemp(prefix="npas-lr-transfer-")), 1)
    else:
        setup = full_setup(a.seeds or len(SEEDS), a.out or RESULTS, max(1, a.workers))
    configs = arms(setup.reference, setup.lora_ranks)
    version = version_to_read(p, a, code_version(setup))
    c, r = setup.reference, setup.recipe
    print(f"[lr_transfer] reference: untied d_model={c.d_model} n_layers={c.n_layers} d_ff={c.d_ff} "
          f"({npas.count(reference_config(c)).stored_params:,} params) | {r.steps} steps x {r.tokens_per_step} "
          f"tokens, warmup {r.warmup_steps}, cosine to lr/10 | grid {list(setup.grid)} | seeds {list(setup.seeds)} "
          f"| arms {', '.join(configs)}", flush=True)
    if a.plan:
        plan(setup, configs, version)
        return 0
    if not a.report:
        jobs_lib.run_missing(runs_of(setup, configs, version), setup.workers,
                             f" (code version {version}) in {setup.out}", progress)
    report(setup, configs, version)
    return 0


if __name__ == "__main__":
    sys.exit(main())
