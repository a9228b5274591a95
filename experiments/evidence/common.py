"""What every evidence script shares about its setting: the report's chassis and recipe, the command
line (``--quick``, ``--plan``, ``--seeds``, ``--arms``, ``--lr-factor``), fitting an allocation to a
budget, and the analytic accounting each comparison prints (what it holds equal).

Every script in this folder trains small decoder-only LMs on the bundled Shakespeare corpus
(character level, 68 symbols) with ``npas.run_proxy`` and compares allocations at a matched stored
parameter count. The rest of the plumbing is one concept a module: ``runs`` (the training pool and
its per-run cache), ``stats`` (paired intervals and verdicts), ``report`` (tables, JSON, figures) and
``searches`` (the search experiments' studies).

    --quick        tiny chassis, ~1 minute, 1 seed, output to a temp dir (a smoke test)
    (default)      the report's setting (second edition): d_model 64, 8 layers, 5 seeds, 1,000 steps
                   of 3,072 tokens, the fair parameterization against the chassis' reference;
                   output to experiments/evidence/results/*.json and docs/figures/*.png
    --plan         print runs x tokens -> CPU-hours (and what is cached) and train nothing

With ``NPAS_EVIDENCE_EXPORT=FILE`` set, a script trains nothing: it appends a ``experiments/device.py`` spec
for every missing run to FILE and reports from the cache (how a lent GPU machine runs the
experiments; ``python experiments/device.py export --groups evidence`` does this for all).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from report import format_table

import npas
from npas import ArchConfig, Chassis, Recipe

ROOT = Path(__file__).resolve().parents[2]

RESULTS_DIR = ROOT / "experiments" / "evidence" / "results"
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
# Training FLOP/s of one run while two share the machine's 2 cores (how every row runs: --workers 2):
# 145 runs of the second edition's d_model 64 rows averaged 27.8 GFLOP/s (3x forward FLOPs x tokens over
# wall time, evaluation included). A quiet single thread reaches 50-70 (experiments/lr_transfer.py); plans
# priced at 5e10 came out about half of the time the rows then took.
CPU_FLOPS = 2.8e10
QUICK_RECIPE = Recipe(name="evidence-quick", seq_len=32, batch_size=8, steps=60, lr=1e-2, min_lr=1e-3,
                      warmup_steps=6, eval_every=30, eval_batches=2, threads=1)


def cpu_seconds(flops_per_token: int, tokens: int) -> float:
    """Estimated training time of one run here, two sharing the cores: forward + backward ~ 3x the forward FLOPs."""
    return 3 * flops_per_token * tokens / CPU_FLOPS


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
    lr_bracket: bool = False  # --lr-bracket: with --lr-factor, the check around the new rate too

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
                        "its report is NAME_lrF.json and the check is not repeated around the new rate (see --lr-bracket)")
    p.add_argument("--lr-bracket", action="store_true",
                   help="with --lr-factor: check the rate again around the new one on seed 99 (x0.5, x1, x2 of it; "
                        "the first check's runs at the same rates are read from the cache) before the reported seeds, "
                        "so the report says whether the new rate is interior to the grid")
    return p


def budgets_arg(p: argparse.ArgumentParser, choices: Sequence[str], what: str) -> None:
    """``--budgets``: the comma-separated subset of ``choices`` a budget sweep runs (``what`` says more)."""
    p.add_argument("--budgets", default=",".join(choices),
                   help=f"comma-separated budgets to run, of {', '.join(choices)}; {what}")


def budgets_of(p: argparse.ArgumentParser, args: argparse.Namespace, choices: Sequence[str]) -> tuple[str, ...]:
    """The budgets ``--budgets`` named, in its order; an empty or unknown one ends the script in one line."""
    budgets = tuple(b.strip() for b in args.budgets.split(",") if b.strip())
    if not budgets or any(b not in choices for b in budgets):
        p.error(f"--budgets {args.budgets!r}: choose from {', '.join(choices)}")
    return budgets


def setup_from(args: argparse.Namespace, name: str) -> Setup:
    quick = bool(args.quick)
    recipe = QUICK_RECIPE if quick else FULL_RECIPE
    if args.steps:
        recipe = recipe.with_steps(args.steps)
        recipe = Recipe.from_dict({**recipe.to_dict(), "eval_every": max(1, args.steps // 2)})
    lr_factor = float(getattr(args, "lr_factor", 1.0))
    if lr_factor <= 0:
        raise SystemExit(f"--lr-factor must be positive, got {lr_factor:g}")
    lr_bracket = bool(getattr(args, "lr_bracket", False))
    if lr_bracket and lr_factor == 1.0:
        raise SystemExit("--lr-bracket checks around the rate --lr-factor moved to; give --lr-factor too")
    if lr_factor != 1.0:
        recipe = recipe.with_lr_factor(lr_factor)
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
              lr_factor=lr_factor, lr_bracket=lr_bracket)
    print(s.describe(), flush=True)
    return s


# ---- fitting allocations to a budget ---------------------------------------------------------
MAX_WIDTH_SCALE = 8.0  # full.yaml uses 4; full tying at 0.5x needs ~5.4x the MLP width to fill its budget


def space_for(chassis: Chassis, budget: str, width_fit: str = "all", max_templates: int = 64):
    """A one-off search space holding only a chassis and a budget, so `Space.candidate` can fit."""
    from npas.allocation.space_parser import parse_space

    text = yaml.safe_dump({"name": "evidence", "chassis": chassis.to_dict(), "budget": budget,
                           "fit": {"width": width_fit, "max_width_scale": MAX_WIDTH_SCALE,
                                   "max_templates": max_templates},
                           "knobs": {}}, sort_keys=False)
    return parse_space(text, "<evidence>")


def fit(chassis: Chassis, budget: str, *, width_fit: str = "all", **knobs: Any):
    """Fit an allocation with these knob values to `budget`; raise if nothing fits."""
    space = space_for(chassis, budget, width_fit)
    values = {**chassis.to_dict(), "taper": "uniform", "tying": "none", "pools": False, "width_fit": width_fit,
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


def budget_arms(budgets: Sequence[str], fitters: dict[str, Callable[[str], Any]], ref: ArchConfig,
                recipe: Recipe | None = None) -> tuple[dict[str, ArchConfig], dict[str, dict[str, Any]]]:
    """Every arm fitted at every budget, named "{budget} {arm}" budget-major (the report's order): the
    allocations and their accounting rows against ``ref``."""
    configs, acc = {}, {}
    for budget in budgets:
        for arm, fit_arm in fitters.items():
            cand = fit_arm(budget)
            name = f"{budget} {arm}"
            configs[name] = cand.config
            acc[name] = accounting_row(name, cand.config, ref, cand.budget, cand.fit.step, recipe)
    return configs, acc


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
