"""Shared plumbing of the evidence scripts: chassis and recipes, budget fitting, a 2-process training
pool, seed statistics, tables, JSON and figures.

Every script in this folder trains small decoder-only LMs on the bundled Shakespeare corpus
(character level, 68 symbols) with ``npas.run_proxy`` and compares allocations at a matched stored
parameter count. Seeds are the recipe seed: it sets the initialisation, the batch order and the
(fixed) validation batches, so configurations that share a seed are scored on the same text and
their difference is a *paired* comparison. Tables report mean +- sample std over seeds and the
paired difference against the comparison's reference row.

    --quick        tiny chassis, ~1 minute, 1 seed, output to a temp dir (a smoke test)
    (default)      the report's setting (second edition): d_model 64, 8 layers, 5 seeds, 1,000 steps
                   of 3,072 tokens, the fair parameterization against the chassis' reference;
                   output to bench/evidence/results/*.json and docs/figures/*.png
    --plan         print runs x tokens -> CPU-hours (and what is cached) and train nothing

Second-edition rules (issue "Evidence, second edition"): every finished run is cached as one JSON in
``bench/evidence/results/runs/``, keyed by arm, allocation, recipe, seed, device kind and code version,
so a killed or time-boxed script resumes where it stopped and a later session only trains what is
missing; every arm also gets a 3-point learning-rate check (x0.5, x1, x2 on seed 99, which is never a
reported seed). With ``NPAS_EVIDENCE_EXPORT=FILE`` set, a script trains nothing: it appends a
``bench/device.py`` spec for every missing run to FILE and reports from the cache (how a lent GPU
machine runs the experiments; ``python bench/device.py export --groups evidence`` does this for all).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

import npas
from npas.allocation.config import ArchConfig, Chassis
from npas.training.recipe import Recipe

ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = ROOT / "bench" / "evidence" / "results"
FIG_DIR = ROOT / "docs" / "figures"
VOCAB = 68  # distinct characters of the bundled corpus

# The report's chassis: big enough for depth/width allocation to matter (8 layers), small enough for
# ~100 proxy runs on 2 shared CPU cores inside the time box. Quick mode is a smoke test only.
FULL_CHASSIS = Chassis(vocab_size=VOCAB, context=64, d_model=64, n_layers=8, n_heads=4, d_ff=256)
QUICK_CHASSIS = Chassis(vocab_size=VOCAB, context=32, d_model=32, n_layers=4, n_heads=4, d_ff=128)

# Second edition: 1,000 steps x 3,072 tokens (3.1M tokens, ~7.6 per parameter of the reference), the
# product's proxy batch and base learning rate, so the untied reference ends well below the trigram
# entropy instead of ranking how fast models learn bigrams (the first edition's 200 x 768 tokens did).
FULL_RECIPE = Recipe(name="evidence-v2", seq_len=64, batch_size=48, steps=1000, lr=6e-3, min_lr=6e-4,
                     warmup_steps=50, eval_every=250, eval_batches=16, threads=1)
FULL_SEEDS = 5
LR_CHECK_SEED, LR_CHECK_FACTORS = 99, (0.5, 1.0, 2.0)
RUNS_DIR = RESULTS_DIR / "runs"
# Files whose content decides a run's loss; their hash is the cache's code version.
VERSIONED = ("npas/training/parameterization.py", "npas/training/proxy.py", "npas/training/data.py",
             "npas/allocation/transformer.py", "npas/allocation/sharing.py", "npas/allocation/config.py",
             "npas/allocation/atoms.py")
CPU_FLOPS = 5e10  # training FLOP/s of one thread here (bench/lr_transfer.py measured 50-70 GFLOP/s)
QUICK_RECIPE = Recipe(name="evidence-quick", seq_len=32, batch_size=8, steps=60, lr=1e-2, min_lr=1e-3,
                      warmup_steps=6, eval_every=30, eval_batches=2, threads=1)


def cpu_seconds(flops_per_token: int, tokens: int) -> float:
    """Estimated training time on one thread here: forward + backward ~ 3x the forward FLOPs."""
    return 3 * flops_per_token * tokens / CPU_FLOPS


def scaled_lr(recipe: Recipe, factor: float) -> Recipe:
    """The recipe at ``factor`` x its learning rate, the cosine floor scaled with it (the check's grid
    and --lr-factor move the whole schedule, not only its peak)."""
    return Recipe.from_dict({**recipe.to_dict(), "lr": recipe.lr * factor, "min_lr": recipe.min_lr * factor})


@dataclass
class Setup:
    """What one script run uses: chassis, recipe, seeds, workers and where outputs go."""

    name: str
    quick: bool
    chassis: Chassis
    recipe: Recipe
    seeds: tuple[int, ...]
    workers: int
    out_dir: Path
    fig_dir: Path
    t0: float = field(default_factory=time.perf_counter)
    cache: Path | None = None  # per-run records (full mode); None: train everything afresh (quick)
    plan_only: bool = False
    only: tuple[str, ...] = ()  # --arms: train just these arms (a partial, cached step of a long report)
    lr_factor: float = 1.0  # --lr-factor: the reported seeds at this multiple of the recipe's rate

    def recipe_for(self, seed: int, **changes: Any) -> Recipe:
        return Recipe.from_dict({**self.recipe.to_dict(), "seed": seed, **changes})

    def describe(self) -> str:
        c, r = self.chassis, self.recipe
        return (f"[{self.name}] mode={'quick' if self.quick else 'full'} chassis: d_model={c.d_model} "
                f"n_layers={c.n_layers} n_heads={c.n_heads} d_ff={c.d_ff} context={c.context} "
                f"vocab={c.vocab_size} (reference {npas.count(npas.reference_config(c)).stored_params:,} params) | "
                f"recipe: {r.steps} steps x {r.batch_size}x{r.seq_len} tokens, lr {r.lr:g}->{r.min_lr:g}, "
                f"eval {r.eval_batches} batches | seeds {list(self.seeds)} | workers {self.workers}")

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0


def arg_parser(doc: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny chassis and recipe, 1 seed: a 1-3 minute smoke run")
    p.add_argument("--seeds", type=int, default=None, help=f"number of recipe seeds (default: 1 quick, {FULL_SEEDS} full)")
    p.add_argument("--plan", action="store_true", help="print runs x tokens -> CPU-hours and what is cached; train nothing")
    p.add_argument("--steps", type=int, default=None, help="override the recipe's optimizer steps")
    p.add_argument("--workers", type=int, default=2, help="training processes in parallel (1 thread each)")
    p.add_argument("--out", type=Path, default=None, help="folder for the JSON (default: results/ or a temp dir)")
    p.add_argument("--fig-dir", type=Path, default=None, help="folder for the PNG (default: docs/figures or --out)")
    p.add_argument("--arms", default="",
                   help="comma-separated arm names: train (or plan) only these and print their paired table against "
                        "the first one, writing no report; a later run without --arms reads them from the cache")
    p.add_argument("--lr-factor", type=float, default=1.0,
                   help="train the reported seeds at this multiple of the recipe's learning rate (and min lr): the "
                        "second rate the report must give for arms whose optimum moved in the learning-rate check; "
                        "its report is NAME_lrF.json and the check is not repeated around the new rate")
    return p


def setup_from(args: argparse.Namespace, name: str) -> Setup:
    quick = bool(args.quick)
    recipe = QUICK_RECIPE if quick else FULL_RECIPE
    if args.steps:
        recipe = recipe.with_steps(args.steps)
        recipe = Recipe.from_dict({**recipe.to_dict(), "eval_every": max(1, args.steps // 2)})
    lr_factor = float(getattr(args, "lr_factor", 1.0))
    if lr_factor <= 0:
        raise SystemExit(f"--lr-factor must be positive, got {lr_factor:g}")
    if lr_factor != 1.0:
        recipe = scaled_lr(recipe, lr_factor)
        name = f"{name}_lr{lr_factor:g}"
    n_seeds = args.seeds or (1 if quick else FULL_SEEDS)
    if quick:
        out = args.out or Path(tempfile.gettempdir()) / "npas-evidence-quick"
        figs = args.fig_dir or out
    else:
        out = args.out or RESULTS_DIR
        figs = args.fig_dir or (args.out if args.out else FIG_DIR)
    out.mkdir(parents=True, exist_ok=True)
    figs.mkdir(parents=True, exist_ok=True)
    s = Setup(name=name, quick=quick, chassis=QUICK_CHASSIS if quick else FULL_CHASSIS, recipe=recipe,
              seeds=tuple(range(n_seeds)), workers=max(1, args.workers), out_dir=out, fig_dir=figs,
              cache=None if quick else RUNS_DIR, plan_only=bool(getattr(args, "plan", False)),
              only=tuple(a.strip() for a in (getattr(args, "arms", "") or "").split(",") if a.strip()),
              lr_factor=lr_factor)
    print(s.describe(), flush=True)
    return s


# ---- fitting allocations to a budget ---------------------------------------------------------
MAX_WIDTH_SCALE = 8.0  # full.yaml uses 4; full tying at 0.5x needs ~5.4x the MLP width to fill its budget


def space_for(chassis: Chassis, budget: str, width_fit: str = "all", max_templates: int = 64):
    """A one-off search space holding only a chassis and a budget, so `Space.candidate` can fit."""
    from npas.allocation.space import parse_space

    text = yaml.safe_dump({"name": "evidence", "chassis": asdict(chassis), "budget": budget,
                           "fit": {"width": width_fit, "max_width_scale": MAX_WIDTH_SCALE,
                                   "max_templates": max_templates},
                           "knobs": {}}, sort_keys=False)
    return parse_space(text, "<evidence>")


def fit(chassis: Chassis, budget: str, *, width_fit: str = "all", **knobs: Any):
    """Fit an allocation with these knob values to `budget`; raise if nothing fits."""
    space = space_for(chassis, budget, width_fit)
    values = {**asdict(chassis), "taper": "uniform", "tying": "none", "pools": False, "width_fit": width_fit,
              **knobs}
    cand = space.candidate(values)
    if not cand.feasible:
        raise SystemExit(f"{knobs} does not fit {budget}: {cand.reason}")
    return cand


POOL_KNOBS = {"tying": "none", "pools": True, "bank_rule": "by_type", "n_banks": 1, "generator": "template_mix"}


def fit_pools(chassis: Chassis, budget: str, tolerance: float = 0.02):
    """template_mix pools (one bank per slot type over all blocks) filling `budget`.

    npas solves T, the template count, and a template costs one block's worth of every slot, so T
    full-length templates can leave up to ~1/L of the reference unused (12% at L = 8). Asking for at
    least `t` templates makes the fit shorten (and tile) them when t full ones do not fit, which hits
    the budget to within t params. Use the smallest t >= 2 whose fit leaves <= `tolerance` unused."""
    for t in range(2, 65):
        cand = fit(chassis, budget, templates=t, **POOL_KNOBS)
        if cand.budget - cand.fit.stored <= tolerance * cand.budget:
            return cand
    return fit(chassis, budget, templates=2, **POOL_KNOBS)


def accounting_row(name: str, cfg: ArchConfig, ref: ArchConfig, budget: int | None = None, step: int = 0,
                   recipe: Recipe | None = None) -> dict[str, Any]:
    """The analytic costs of an allocation next to the reference's: what every comparison must hold equal."""
    acc = npas.count(cfg, batch_size=recipe.batch_size if recipe else 1, seq_len=recipe.seq_len if recipe else None)
    racc = npas.count(ref)
    flops = npas.count(cfg).flops_per_token
    return {
        "name": name, "summary": cfg.summary(), "stored_params": acc.stored_params,
        "budget": budget, "gap": None if budget is None else budget - acc.stored_params, "fit_step": step,
        "flops_per_token": flops, "flops_ratio": flops / racc.flops_per_token,
        "generation_flops_per_step": acc.generation_flops_per_step,
        "mlp_widths": list(cfg.mlp_widths), "d_model": cfg.chassis.d_model, "n_layers": cfg.chassis.n_layers,
        "unique_blocks": cfg.n_blocks, "hash": cfg.hash, "config": cfg.to_dict(),
    }


def print_accounting(rows: Sequence[dict[str, Any]]) -> None:
    """Print the analytic check of each comparison: stored params, gap to budget, FLOPs ratio."""
    headers = ["config", "stored params", "budget", "gap", "fit step", "FLOPs/token", "xref", "allocation"]
    table = [[r["name"], f"{r['stored_params']:,}", "-" if r["budget"] is None else f"{r['budget']:,}",
              "-" if r["gap"] is None else f"{r['gap']:,}", f"{r['fit_step']:,}" if r["fit_step"] else "-", f"{r['flops_per_token']:,}",
              f"{r['flops_ratio']:.3f}", r["summary"]] for r in rows]
    print("accounting (npas.count, analytic):")
    print(format_table(headers, table), flush=True)


# ---- the training pool -------------------------------------------------------------------------
_CORPUS = None


def _corpus():
    global _CORPUS
    if _CORPUS is None:
        _CORPUS = npas.load_corpus(None)
    return _CORPUS


def _device_module():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import device
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return device


def spec_of(job: dict[str, Any], dest: str = "") -> dict[str, Any]:
    """The bench/device.py spec of a job: the one runner both a CPU pool and a GPU machine use."""
    recipe = Recipe.from_dict(job["recipe"])
    cfg = ArchConfig.from_dict(job["config"])
    return {"dest": dest, "config": cfg.to_json(), "recipe": recipe.to_dict(), "reference": job.get("reference"),
            "test": True, "est_s": cpu_seconds(npas.count(cfg).flops_per_token, recipe.steps * recipe.tokens_per_step),
            "meta": {"name": job["name"], "seed": recipe.seed, "recipe_name": recipe.name, "lr": recipe.lr}}


def train_job(job: dict[str, Any]) -> dict[str, Any]:
    """One run in a worker process (bench/device.py's runner): the job's identity plus its metrics."""
    rec = _device_module().run_spec(spec_of(job))
    rec.setdefault("steps_done", rec.get("steps", 0))
    rec["wall_s"] = round(rec.get("wall_s") or 0.0, 2)
    return rec


def make_jobs(configs: dict[str, ArchConfig], setup: Setup, recipe: Recipe | None = None,
              seeds: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """Every config x every seed, seed-major so a cut-short run still has whole seeds; the fair
    parameterization scales against the setup's chassis (the experiment's reference)."""
    base = recipe or setup.recipe
    return [{"name": name, "config": cfg.to_dict(), "reference": asdict(setup.chassis),
             "recipe": {**base.to_dict(), "seed": seed}} for seed in (setup.seeds if seeds is None else seeds)
            for name, cfg in configs.items()]


def code_version() -> str:
    return _device_module().files_version(VERSIONED)


def cache_path(job: dict[str, Any], cache: Path, device_kind: str, version: str) -> Path:
    recipe = Recipe.from_dict(job["recipe"])
    rhash = hashlib.sha256(json.dumps({**recipe.to_dict(), "seed": 0}, sort_keys=True).encode()).hexdigest()[:8]
    chash = ArchConfig.from_dict(job["config"]).hash[:12]
    return cache / f"{job['name']}-{chash}-{recipe.name}-{rhash}-s{recipe.seed}-{device_kind}-{version}.json"


def _device_kind() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def run_jobs(jobs: list[dict[str, Any]], workers: int, cache: Path | None = None,
             plan_only: bool = False) -> list[dict[str, Any]]:
    """Train the jobs on `workers` spawned processes (1 torch thread each); results in job order.

    With a ``cache`` folder, finished runs are read from it and every new one is written the moment
    it arrives, so only what is missing trains. ``plan_only`` (or NPAS_EVIDENCE_EXPORT) trains
    nothing and returns what is cached."""
    t0 = time.perf_counter()
    version, kind = code_version(), os.environ.get("NPAS_EVIDENCE_DEVICE") or _device_kind()
    paths = [cache_path(j, cache, kind, version) if cache else None for j in jobs]
    out: list[dict[str, Any] | None] = [json.loads(p.read_text()) if p and p.exists() else None for p in paths]
    todo = [i for i, r in enumerate(out) if r is None]
    tokens = sum(Recipe.from_dict(jobs[i]["recipe"]).steps * Recipe.from_dict(jobs[i]["recipe"]).tokens_per_step
                 for i in todo)
    cpu_s = sum(spec_of(jobs[i])["est_s"] for i in todo)
    print(f"plan: {len(jobs)} runs, {len(jobs) - len(todo)} cached ({kind}, code {version}); {len(todo)} to train, "
          f"{tokens / 1e6:.1f}M tokens -> ~{cpu_s / 3600:.2f} CPU-hours (~{cpu_s / 3600 / max(1, workers):.2f} h wall "
          f"on {workers} workers)", flush=True)
    export = os.environ.get("NPAS_EVIDENCE_EXPORT")
    if export and cache:
        with open(export, "a") as f:
            for i in todo:
                f.write(json.dumps({**spec_of(jobs[i], str(cache_path(jobs[i], cache, "cuda", version).relative_to(ROOT))),
                                    "group": "evidence"}) + "\n")
        print(f"exported {len(todo)} specs to {export}")
    if plan_only or export:
        return [r for r in out if r is not None]

    def done(i: int, rec: dict[str, Any], n: int) -> None:
        out[i] = rec
        if paths[i] is not None:
            paths[i].parent.mkdir(parents=True, exist_ok=True)
            tmp = paths[i].with_suffix(".tmp")
            tmp.write_text(json.dumps({**rec, "code_version": version}, default=str) + "\n")
            tmp.replace(paths[i])
        _progress(n, len(todo), rec, t0)

    if workers <= 1:
        for n, i in enumerate(todo, 1):
            done(i, train_job(jobs[i]), n)
        return [r for r in out if r is not None]
    ctx = mp.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = {pool.submit(train_job, jobs[i]): i for i in todo}
        for n, fut in enumerate(as_completed(futures), 1):
            done(futures[fut], fut.result(), n)
    return [r for r in out if r is not None]


def run_arms(configs: dict[str, ArchConfig], setup: Setup, recipe: Recipe | None = None) -> list[dict[str, Any]]:
    """The experiment's runs (every arm x every seed) and, in full mode, each arm's learning-rate check
    (x0.5, x1, x2 of the base rate on seed 99, never a reported seed), whose table is printed here.

    With ``--arms`` only those arms train; their table is printed and the script exits without a report
    (one with missing arms would be wrong), so a long report can be built up a few arms per session."""
    if setup.only:
        unknown = [a for a in setup.only if a not in configs]
        if unknown:
            raise SystemExit(f"--arms: unknown arm(s) {unknown}; this script's arms are {list(configs)}")
        configs = {a: configs[a] for a in setup.only}
    jobs = make_jobs(configs, setup, recipe)
    base = recipe or setup.recipe
    checks = []
    if not setup.quick and setup.lr_factor == 1.0:  # the check brackets the base rate; --lr-factor reuses it
        for f in LR_CHECK_FACTORS:
            checks += make_jobs(configs, setup, scaled_lr(base, f), seeds=(LR_CHECK_SEED,))
    results = run_jobs(jobs + checks, setup.workers, setup.cache, setup.plan_only)
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
    """Per arm: loss at x0.5, x1, x2 of the base rate (seed 99) and whether the optimum moved."""
    table = []
    for name in names:
        by_f = {round(r["lr"] / base_lr, 3): r.get("val_loss") for r in rows if r.get("name") == name}
        cells = [by_f.get(f) for f in LR_CHECK_FACTORS]
        ok = [(v, f) for v, f in zip(cells, LR_CHECK_FACTORS, strict=True) if v is not None]
        best = min(ok)[1] if len(ok) == len(LR_CHECK_FACTORS) else None
        table.append([name, *("-" if v is None else f"{v:.4f}" for v in cells),
                      "incomplete" if best is None else (f"x{best:g}" + ("" if best == 1.0 else " (moved)"))])
    return f"learning-rate check (seed {LR_CHECK_SEED}, val loss):\n" + format_table(
        ["arm", *(f"lr x{f:g}" for f in LR_CHECK_FACTORS), "optimum"], table)


def _progress(n: int, total: int, r: dict[str, Any], t0: float) -> None:
    loss = "failed" if r["val_loss"] is None else f"{r['val_loss']:.4f}"
    print(f"  [{n}/{total}] {r['name']} seed {r['seed']}: val_loss {loss}  ({r['wall_s']:.0f} s, "
          f"elapsed {time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)


# ---- statistics ----------------------------------------------------------------------------------
def mean_std(xs: Sequence[float]) -> tuple[float, float]:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return math.nan, math.nan
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else math.nan)


def by_name(results: Iterable[dict[str, Any]]) -> dict[str, dict[int, float]]:
    """name -> seed -> val_loss."""
    out: dict[str, dict[int, float]] = {}
    for r in results:
        if r["val_loss"] is not None:
            out.setdefault(r["name"], {})[r["seed"]] = r["val_loss"]
    return out


def summarize(results: list[dict[str, Any]], names: Sequence[str], ref: str | None) -> list[dict[str, Any]]:
    """Per config: mean/std of val loss over seeds, and the paired (same-seed) difference to `ref`."""
    losses = by_name(results)
    walls: dict[str, list[float]] = {}
    for r in results:
        walls.setdefault(r["name"], []).append(r["wall_s"])
    rows = []
    for name in names:
        per_seed = losses.get(name, {})
        m, s = mean_std(list(per_seed.values()))
        row = {"name": name, "mean": m, "std": s, "n": len(per_seed), "per_seed": per_seed,
               "wall_s": statistics.fmean(walls.get(name, [math.nan]))}
        if ref is not None and ref in losses:
            diffs = [per_seed[k] - losses[ref][k] for k in per_seed if k in losses[ref]]
            row["delta_mean"], row["delta_std"] = mean_std(diffs)
            row["wins"] = sum(d < 0 for d in diffs)
        rows.append(row)
    return rows


# Claims of "on par" are tested one-sided against this margin: the arm may be worse by less than 0.02
# nats/char (about 1% of these models' loss, the size of an effect a seed claim calls "parity").
PARITY_MARGIN = 0.02


def paired_interval(results: Iterable[dict[str, Any]], name: str, ref: str):
    """loss(name) - loss(ref) over the seeds both ran, with the 95% t-interval of
    `npas.service.fidelity.paired_delta` (negative = `name` better)."""
    from npas.service.fidelity import paired_delta

    losses = by_name(results)
    a, b = losses.get(name, {}), losses.get(ref, {})
    seeds = sorted(set(a) & set(b))
    return paired_delta([a[k] for k in seeds], [b[k] for k in seeds])


def claim_verdict(interval, kind: str, margin: float = PARITY_MARGIN) -> tuple[bool, str]:
    """Whether a paired difference reproduces a claim, and why, from its 95% interval only.

    kind "better": the arm beats the reference; reproduced only if the whole interval is below 0.
    kind "parity": the arm reaches the reference's loss; reproduced only if the whole interval is
    below +margin (non-inferiority: worse by less than the margin, at 95%; better by any amount counts).
    A mean without an interval (one seed) reproduces nothing."""
    if kind not in ("better", "parity"):
        raise ValueError(f"claim kind {kind!r}: use 'better' or 'parity'")
    bound = 0.0 if kind == "better" else margin
    at = "0" if bound == 0 else f"{bound:+.2f}"
    if interval.low is None or interval.high is None:
        return False, f"no interval from {interval.n} seed(s); run --seeds 2 or more"
    if interval.high < bound:
        return True, f"the interval is below {at}"
    if interval.low > bound:
        return False, f"contradicted: the interval is above {at}"
    return False, f"the interval covers {at}"


def verdict_of(interval, kind: str, margin: float = PARITY_MARGIN) -> str:
    """The report's verdict words for a claim: "reproduced", "contradicted", or "unresolved at this
    scale" with the interval's width (the second edition's rule, from `claim_verdict`)."""
    ok, why = claim_verdict(interval, kind, margin)
    if ok:
        return "reproduced"
    if why.startswith("contradicted"):
        return "contradicted"
    if interval.low is None or interval.high is None:
        return "unresolved (too few seeds)"
    return f"unresolved at this scale (interval width {interval.high - interval.low:.3f})"


def fmt_interval(interval) -> str:
    """`+0.0123 [-0.0040, +0.0286]`, or the mean alone without an interval."""
    if interval.value is None:
        return "-"
    if interval.low is None:
        return f"{interval.value:+.4f} [no interval]"
    return f"{interval.value:+.4f} [{interval.low:+.4f}, {interval.high:+.4f}]"


def fmt_pm(m: float, s: float, digits: int = 4) -> str:
    if math.isnan(m):
        return "-"
    return f"{m:.{digits}f} ± {s:.{digits}f}" if not math.isnan(s) else f"{m:.{digits}f} ± -"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def result_table(summary: list[dict[str, Any]], acc: dict[str, dict[str, Any]], ref: str | None,
                 extra: dict[str, dict[str, str]] | None = None) -> str:
    """The main table: config, stored params, FLOPs ratio, val loss mean +- std, paired delta to ref."""
    extra = extra or {}
    extra_cols = sorted({k for v in extra.values() for k in v})
    headers = ["config", *extra_cols, "stored params", "FLOPs xref", "val loss (nats)", f"Δ vs {ref or '-'}",
               "wins", "seeds", "s/run"]
    rows = []
    for r in summary:
        a = acc.get(r["name"], {})
        delta = fmt_pm(r.get("delta_mean", math.nan), r.get("delta_std", math.nan)) if ref and r["name"] != ref \
            else "-"
        wins = f"{r.get('wins', 0)}/{r['n']}" if ref and r["name"] != ref and "wins" in r else "-"
        rows.append([r["name"], *(extra.get(r["name"], {}).get(k, "") for k in extra_cols),
                     f"{a.get('stored_params', 0):,}", f"{a.get('flops_ratio', math.nan):.3f}",
                     fmt_pm(r["mean"], r["std"]), delta, wins, r["n"], f"{r['wall_s']:.0f}"])
    return format_table(headers, rows)


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b between two rankings (ties handled as in scipy.stats.kendalltau)."""
    n = len(x)
    if n != len(y) or n < 2:
        return math.nan
    concordant = discordant = ties_x = ties_y = 0
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = x[i] - x[j], y[i] - y[j]
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                ties_x += 1
            elif dy == 0:
                ties_y += 1
            elif (dx > 0) == (dy > 0):
                concordant += 1
            else:
                discordant += 1
    denom = math.sqrt((concordant + discordant + ties_x) * (concordant + discordant + ties_y))
    return (concordant - discordant) / denom if denom else math.nan


def hypervolume_2d(points: Iterable[tuple[float, float]], ref: tuple[float, float]) -> float:
    """Area dominated by `points` (both objectives minimised) and bounded by `ref`."""
    pts = sorted((a, b) for a, b in points if a < ref[0] and b < ref[1])
    area, best_b = 0.0, ref[1]
    for a, b in pts:
        if b < best_b:
            area += (ref[0] - a) * (best_b - b)
            best_b = b
    return area


# ---- outputs -------------------------------------------------------------------------------------
def save_json(setup: Setup, payload: dict[str, Any]) -> Path:
    path = setup.out_dir / f"{setup.name}{'_quick' if setup.quick else ''}.json"
    payload = {"experiment": setup.name, "quick": setup.quick, "chassis": asdict(setup.chassis),
               "recipe": setup.recipe.to_dict(), "seeds": list(setup.seeds), "wall_s": round(setup.elapsed(), 1),
               "cpu_count": os.cpu_count(), **payload}
    path.write_text(json.dumps(_clean(payload), indent=1, default=str, allow_nan=False))
    print(f"wrote {path}")
    return path


def _clean(o: Any) -> Any:
    """JSON-safe copy: non-finite floats become null, tuples lists, keys strings."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_clean(v) for v in o]
    return o


def figure_path(setup: Setup) -> Path:
    return setup.fig_dir / f"{setup.name}{'_quick' if setup.quick else ''}.png"


def save_figure(setup: Setup, fig) -> Path:
    path = figure_path(setup)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")
    return path


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def loss_bars(ax, setup: Setup, summary: Sequence[dict[str, Any]]) -> None:
    """Mean val loss per config as bars (± std over seeds), each seed's loss as a dot, the y axis
    zoomed to the seeds' range: the comparison panel several scripts draw."""
    names = [r["name"] for r in summary]
    ax.bar(names, [r["mean"] for r in summary], yerr=[0 if r["std"] != r["std"] else r["std"] for r in summary],
           capsize=4, color=[f"C{k}" for k in range(len(names))])
    for r in summary:
        for v in r["per_seed"].values():
            ax.plot(names.index(r["name"]), v, "k.", ms=4)
    vals = [v for r in summary for v in r["per_seed"].values()]
    if vals:
        lo, hi = min(vals), max(vals)
        ax.set_ylim(lo - 0.3 * (hi - lo + 1e-3), hi + 0.3 * (hi - lo + 1e-3))
    ax.set_ylabel("val loss (nats/char)")
    ax.set_title(f"{setup.recipe.steps} steps, {len(setup.seeds)} seed(s): mean ± std, dots = seeds")


def finish(setup: Setup) -> None:
    print(f"wall: {setup.elapsed():.1f} s ({setup.name}, {'quick' if setup.quick else 'full'})", flush=True)


# ---- searches (experiments 5 and 6) ----------------------------------------------------------------
def search_space(setup: Setup, file_chassis: bool = False):
    """search_spaces/full.yaml's knobs and 0.25x budget; its own chassis, or (default) the evidence
    chassis so a 12-trial study fits the time box. unique_blocks is clipped to the chassis depth."""
    from npas.allocation.space import parse_space

    path = ROOT / "search_spaces" / "full.yaml"
    data = yaml.safe_load(path.read_text())
    if not file_chassis:
        data["chassis"] = asdict(setup.chassis)
    L = int(data["chassis"]["n_layers"])
    ub = data["knobs"]["tying"].get("unique_blocks")
    if isinstance(ub, dict) and ub.get("high", 0) > L:
        data["knobs"]["tying"]["unique_blocks"] = {"low": min(int(ub["low"]), L), "high": L}
    label = f"{path.relative_to(ROOT)}" + ("" if file_chassis else " (knobs and budget; evidence chassis)")
    return parse_space(yaml.safe_dump(data, sort_keys=False), label)


def search_recipe(setup: Setup) -> Recipe:
    """The proxy of the searches: the experiments' recipe with 4 evaluations (the ASHA rungs)."""
    r = setup.recipe
    return Recipe.from_dict({**r.to_dict(), "name": f"{r.name}-search", "eval_every": max(1, r.steps // 4),
                             "eval_batches": max(2, r.eval_batches * 2 // 3)})


def run_search(setup: Setup, space, *, trials: int, early_stop: bool, tag: str, workdir: Path | None = None,
               seed: int = 0) -> dict[str, Any]:
    """One npas.search into a fresh SQLite study under a temp dir; returns where it is and its wall time."""
    import optuna

    from npas.service.driver import search

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    work = workdir or Path(tempfile.mkdtemp(prefix=f"npas-evidence-{tag}-"))
    work.mkdir(parents=True, exist_ok=True)
    recipe = search_recipe(setup)
    rpath = work / "recipe.yaml"
    rpath.write_text(recipe.to_yaml())
    url = f"sqlite:///{work / 'study.db'}"
    name = f"evidence-{tag}-{int(time.time())}"
    t0 = time.perf_counter()
    search(space, trials=trials, study=name, storage=url, recipe=str(rpath), seed=seed,
                launch=_launch(setup.workers, early_stop))
    wall = time.perf_counter() - t0
    return {"storage": url, "study": name, "wall_s": round(wall, 1), "trials": trials, "early_stop": early_stop,
            "recipe": recipe.to_dict(), "space": space.source, "seed": seed, "workdir": str(work)}


def _launch(workers: int, early_stop: bool):
    from npas.service.launch import Launch

    return Launch(workers=workers, early_stop=early_stop)


def shutdown_ray() -> None:
    try:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    except Exception:  # noqa: BLE001 - best effort: a report must not fail on cleanup
        pass


def load_study(info: dict[str, Any]):
    import optuna

    return optuna.load_study(study_name=info["study"], storage=info["storage"])


def trial_rows(study) -> list[dict[str, Any]]:
    """Every trial that ran a proxy: status, fidelity, losses, memory, compute."""
    from optuna.trial import TrialState

    from npas.service.record import StudyAttr, TrialAttr
    from npas.service.study import front_trials, is_full_fidelity, status

    tokens_per_step = int(study.user_attrs[StudyAttr.RECIPE]["seq_len"]) * int(study.user_attrs[StudyAttr.RECIPE]["batch_size"])
    front = {t.number for t in front_trials(study)}
    rows = []
    for t in study.get_trials(deepcopy=False):
        proxy = t.user_attrs.get(TrialAttr.PROXY) or {}
        state = status(t)
        if t.state != TrialState.COMPLETE and state != "failed":
            continue
        steps = int(proxy.get("steps_done", t.user_attrs.get(TrialAttr.FIDELITY, 0)) or 0)
        alloc = t.user_attrs.get(TrialAttr.ALLOC)
        rows.append({
            "number": t.number, "status": state, "baseline": t.user_attrs.get(TrialAttr.BASELINE, ""),
            "values": list(t.values) if t.values else None, "steps_done": steps,
            "tokens": steps * tokens_per_step, "wall_s": proxy.get("wall_s"),
            "full_fidelity": is_full_fidelity(t), "on_front": t.number in front,
            "summary": ArchConfig.from_dict(alloc).summary() if alloc else "", "allocation": alloc,
            "stored_params": (t.user_attrs.get(TrialAttr.ACCOUNTING) or {}).get("stored_params"),
            "knobs": t.user_attrs.get(TrialAttr.KNOBS),
        })
    return rows
