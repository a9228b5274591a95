"""The training numerics, declared: ``NUMERICS_VERSION`` names what a training computes, and the golden
runs below define it.

A result cached outside a run (the benches' run caches) is keyed by ``NUMERICS_VERSION`` and the
settings its runs share, never by the bytes of the code that trained it: a refactor that leaves every
golden value in place keeps every cache; a change that moves them fails
``tests/training/test_numerics_golden.py``, whose message names this constant. Bump it, then re-record:

    python -m npas.conversion.numerics record tests/data/numerics_golden.json

``record`` refuses to overwrite the values of the version it finds in the file with values that differ
beyond tolerance: a change of the numerics is a new version, never a quiet rewrite of the old one.

Why in `npas.conversion`: one golden run converts a trained model and uptrains it, so the numerics these
runs pin are training's and conversion's, and conversion is the layer that sees both (it trains; training
never converts).

The golden runs (``golden_runs``) train tiny models (d_model 16, 2 layers) on the bundled corpus, on one
CPU thread with deterministic algorithms, each from a fixed seed:

- per schedule, one run of the smoke recipes' full length (200 steps x 16 windows of 64 tokens): cosine,
  and warmup-stable-decay with its cooldown forks at the rungs 12 and 50 and its own end at 200, so a
  change that acts only late in a run (a schedule, clipping or optimizer-state rule, the data order past
  the first batches, a fork) moves them;
- per mechanism family one short run (12 steps): untied under the ``uniform`` parameterization; tying
  with nested MLP slices and LoRA; banks of all four generators; attention atoms at a scaled learning
  rate (``Recipe.with_lr_factor``); an expert pool under WSD with a fork; the llama chassis (grouped-query
  attention, SwiGLU, an untied head), dense and with values shared across layers; and a conversion of
  the trained dense llama model into tied blocks + LoRA (MLP widths refit on calibration text),
  uptrained from the converted weights;
- the learning-rate schedules of long recipes at every step (cosine, WSD with each decay shape, a
  scaled rate): cheap, and they see a schedule edit acting past the trained lengths.

Each run yields floats (float64): its losses (training, validation, the curve, the rungs, the test
split's, for a conversion the converted model's before uptraining) and three positive moments of its
tensors (sum of absolute values, of squares, and of absolute values under fixed cosine weights, which
see a permutation; positive terms only, so a relative tolerance means something): per tensor for a
short run, of the whole model for a full-length one, where 200 steps amplify a rounding-sized
difference (every initial weight moved by 1e-7) to 1.5e-4 in single tensors' moments but to at most
2.2e-6 in the whole model's and 2.7e-6 in the losses.

Tolerance: another CPU's kernels round differently. Between an AMD EPYC and an Intel Xeon host the same
2-step trainings' moments differed by 1.9e-8 relative (median), a few by up to 4.1e-5 (Adam's update
``m / sqrt(v)`` flips sign where a gradient is near zero); one parameter group's rate multiplier x 1.001
put 41% of them beyond 1e-5. So a run's moments match when at most ``OUTLIER_FRACTION`` of them (rounded
up) differ by more than ``RTOL`` and none by more than ``RTOL_MAX``; its losses and the schedules, which
have no such outliers, match when every value is within ``RTOL``.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
from collections.abc import Collection, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from npas.allocation.config import ArchConfig, AtomSpec, Bank, Chassis, ExpertPool, reference_config
from npas.conversion.calibration import calibration_ids
from npas.conversion.convert import convert_model
from npas.training.data import Corpus, load_corpus
from npas.training.forks import train_model
from npas.training.proxy import eval_batches, evaluate
from npas.training.recipe import Recipe

NUMERICS_VERSION = 1  # bump when the golden values move (module docstring); every bench cache is keyed by it

RTOL = 1e-5  # a value within this (relative) is equal
OUTLIER_FRACTION = 0.01  # at most this share of values may lie beyond RTOL ...
RTOL_MAX = 1e-3  # ... and none beyond this
ATOL = 1e-9  # differences below this are zero (a loss or moment that is exactly 0 on both sides)
RECORD_COMMAND = "python -m npas.conversion.numerics record tests/data/numerics_golden.json"

CHASSIS = Chassis(vocab_size=68, context=64, d_model=16, n_layers=2, n_heads=2, d_ff=32)
LLAMA = Chassis(vocab_size=68, context=64, d_model=16, n_layers=2, n_heads=2, d_ff=32, activation="swiglu",
                family="llama", n_kv_heads=1, tie_embeddings=False)
# the smoke recipes' numbers (npas/builtin/recipes/smoke*.yaml when this was written), frozen here: re-tuning
# a shipped recipe changes its runs' settings, which key their caches, not the numerics
SMOKE = Recipe(name="golden-smoke", seq_len=64, batch_size=16, steps=200, horizon=200, lr=2.5e-3, min_lr=2.5e-4,
               warmup_steps=10, weight_decay=0.1, betas=(0.9, 0.95), grad_clip=1.0, eval_every=50, eval_batches=4,
               seed=0, threads=1, parameterization="fair")
SMOKE_WSD = replace(SMOKE, name="golden-smoke-wsd", schedule="wsd")
SHORT = Recipe(name="golden-short", seq_len=32, batch_size=4, steps=12, horizon=12, lr=1e-2, min_lr=1e-3,
               warmup_steps=3, eval_every=6, eval_batches=1, seed=1, threads=1, parameterization="fair")
SHORT_WSD = replace(SHORT, name="golden-short-wsd", schedule="wsd", rungs=(6, 12), decay_shape="linear")
LONG_COSINE = Recipe(name="golden-long", seq_len=64, batch_size=48, steps=1600, horizon=1600, lr=6e-3, min_lr=6e-4,
                     warmup_steps=100)


@dataclass(frozen=True)
class GoldenRun:
    """One golden training: an allocation trained under a recipe (the fair parameterization scaled
    against ``reference``); with ``convert_from``, the allocation starts from that run's trained model
    converted into it (``npas.conversion.convert_model``) instead of a fresh init."""

    name: str
    config: ArchConfig
    recipe: Recipe
    reference: Chassis
    convert_from: str | None = None
    per_tensor: bool = True  # moments per tensor; False: of the whole model (a long run's, see module doc)


def golden_runs() -> tuple[GoldenRun, ...]:
    """The trainings that define the numerics (module docstring), in the order they run."""
    d, f = CHASSIS.d_model, CHASSIS.d_ff
    tied_lora = ArchConfig(chassis=CHASSIS, mlp_widths=(f, f // 2), block_of_layer=(0, 0), lora_attn=(2, 2),
                           lora_mlp=(0, 2), untied_norms=True)
    banks = ArchConfig(chassis=CHASSIS, mlp_widths=(f, f), block_of_layer=(0, 1), banks=(
        Bank(((0, "mlp_up"), (1, "mlp_up")), "template_mix", f * d, 2),
        Bank(((0, "mlp_down"), (1, "mlp_down")), "tie", f * d),
        Bank(((0, "attn_q"), (1, "attn_q")), "slice", d * d + d * d // 2),
        Bank(((0, "attn_o"), (1, "attn_o")), "tile", d * d // 4)))
    atoms = ArchConfig(chassis=CHASSIS, mlp_widths=(f, f), block_of_layer=(0, 1),
                       atoms=(AtomSpec("attn_q", 3, "layer"), AtomSpec("attn_v", 2, "block")))
    experts = ArchConfig(chassis=CHASSIS, mlp_widths=(1, 1), block_of_layer=(0, 1),
                         experts=ExpertPool((4,), (0, 0), 8, 2, "shared", 0.01))
    llama = ArchConfig(chassis=LLAMA, mlp_widths=(f, f), block_of_layer=(0, 1), kv_source=(0, 0), kv_mode="v")
    llama_dense = reference_config(LLAMA)
    converted = ArchConfig(chassis=LLAMA, mlp_widths=(f, f // 2), block_of_layer=(0, 0), lora_attn=(2, 2),
                           lora_mlp=(2, 2))
    uniform = replace(SHORT, parameterization="uniform")
    return (
        GoldenRun("cosine-smoke", reference_config(CHASSIS), SMOKE, CHASSIS, per_tensor=False),
        GoldenRun("wsd-smoke", reference_config(CHASSIS), SMOKE_WSD, CHASSIS, per_tensor=False),
        GoldenRun("untied-uniform", reference_config(CHASSIS), uniform, CHASSIS),
        GoldenRun("tied-lora", tied_lora, SHORT, CHASSIS),
        GoldenRun("banks", banks, SHORT, CHASSIS),
        GoldenRun("atoms", atoms, SHORT.with_lr_factor(0.5), CHASSIS),
        GoldenRun("experts-wsd", experts, SHORT_WSD, CHASSIS),
        GoldenRun("llama-kv-sharing", llama, SHORT, LLAMA),
        GoldenRun("llama-dense", llama_dense, SHORT, LLAMA),
        GoldenRun("llama-converted", converted, SHORT, LLAMA, convert_from="llama-dense"),
    )


def golden_names() -> list[str]:
    return [r.name for r in golden_runs()]


def golden_schedules() -> dict[str, Recipe]:
    """Long recipes whose learning rate at every step is part of the numerics (module docstring)."""
    wsd = replace(LONG_COSINE, schedule="wsd", rungs=(200, 400, 1600))
    return {"cosine-1600": LONG_COSINE, "cosine-1600-x2": LONG_COSINE.with_lr_factor(2.0),
            "wsd-1600-1-sqrt": wsd, "wsd-1600-linear": replace(wsd, decay_shape="linear")}


# ------------------------------------------------------------------------------------------ values
def tensor_moments(state: dict[str, torch.Tensor]) -> dict[str, list[float]]:
    """Three positive moments (float64) of every tensor: sum |x|, sum x^2, and sum |x| w with fixed
    weights w = 1 + cos(i) / 2 (which a permutation of the entries moves)."""
    out = {}
    for name, t in sorted(state.items()):
        x = t.detach().to("cpu", torch.float64).flatten()
        w = 1.0 + 0.5 * torch.cos(torch.arange(x.numel(), dtype=torch.float64))
        out[name] = [float(x.abs().sum()), float((x * x).sum()), float((x.abs() * w).sum())]
    return out


def _loss(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)


def _train(run: GoldenRun, corpus: Corpus, trained: dict[str, torch.nn.Module]) -> dict[str, Any]:
    """One golden run's values; its trained model kept in ``trained`` for a later conversion."""
    losses: dict[str, Any] = {}
    init = None
    if run.convert_from is not None:
        conv = convert_model(trained[run.convert_from], run.config, seed=run.recipe.seed,
                             calibration=calibration_ids(corpus, run.recipe.seq_len))
        init = {k: v.clone() for k, v in conv.model.state_dict().items()}
        losses["converted_val"] = _loss(evaluate(conv.model, eval_batches(corpus, run.recipe), torch.device("cpu"),
                                                 run.recipe))
    model, res = train_model(run.config, run.recipe, corpus, device="cpu", reference=run.reference, init_state=init)
    trained[run.name] = model
    losses |= {"status_ok": float(res.status == "ok"), "steps_done": float(res.steps_done),
               "train": _loss(res.train_loss), "val": _loss(res.val_loss),
               "curve": [[float(s), _loss(v)] for s, v in res.curve],
               "test": _loss(evaluate(model, eval_batches(corpus, run.recipe, split="test"), torch.device("cpu"),
                                      run.recipe))}
    rungs = getattr(res, "rung_losses", None)
    if rungs is not None:
        losses["rungs"] = {str(t): _loss(v) for t, v in sorted(rungs.items())}
        losses["steps_trained"] = float(res.steps_trained)
    moments = tensor_moments(model.state_dict())
    if run.per_tensor:
        return {"losses": losses, "tensors": moments}
    return {"losses": losses, "model": [math.fsum(m[i] for m in moments.values()) for i in range(3)]}


def schedule_values(recipe: Recipe) -> list[float]:
    """The learning rate at every step of ``recipe``, summarized: length, sum, sum of squares, sum of
    step-weighted rates, and the rate at 0, 10, 50, 80, 90 and 100% of the run."""
    lr = [recipe.lr_at(s) for s in range(recipe.steps)]
    return [float(len(lr)), math.fsum(lr), math.fsum(x * x for x in lr), math.fsum(i * x for i, x in enumerate(lr)),
            *(lr[int(q * (len(lr) - 1))] for q in (0.0, 0.1, 0.5, 0.8, 0.9, 1.0))]


def measure(corpus: Corpus | None = None, only: Collection[str] | None = None) -> dict[str, Any]:
    """Every golden run's and schedule's values (``only``: those runs alone, with the runs a conversion
    among them starts from), on one CPU thread with deterministic algorithms (the thread count and
    determinism flag are restored after)."""
    corpus = corpus if corpus is not None else load_corpus()
    wanted = set(golden_names() if only is None else only)
    wanted |= {r.convert_from for r in golden_runs() if r.name in wanted and r.convert_from}
    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    trained: dict[str, torch.nn.Module] = {}
    try:
        runs = {run.name: _train(run, corpus, trained) for run in golden_runs() if run.name in wanted}
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(det)
    return {"numerics_version": NUMERICS_VERSION, "runs": runs,
            "schedules": {name: schedule_values(r) for name, r in golden_schedules().items()}}


# ------------------------------------------------------------------------------------------ matching
def _leaves(v: Any, path: str) -> Iterator[tuple[str, Any]]:
    if isinstance(v, dict):
        for k in sorted(v):
            yield from _leaves(v[k], f"{path}.{k}")
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from _leaves(x, f"{path}[{i}]")
    else:
        yield path, v


def groups(values: dict[str, Any]) -> dict[str, tuple[bool, dict[str, Any]]]:
    """The recording's values by group, each with whether it tolerates outliers: every run's losses and
    the schedules must all match within ``RTOL`` (aggregates: another machine's rounding moves them by
    ~1e-6 at most); every run's moments may have the outliers of ``mismatch``."""
    out: dict[str, tuple[bool, dict[str, Any]]] = {}
    for name, run in values.get("runs", {}).items():
        out[f"runs.{name}.losses"] = (False, dict(_leaves(run.get("losses"), f"runs.{name}.losses")))
        moments = {k: v for k, v in run.items() if k != "losses"}
        out[f"runs.{name}.moments"] = (True, dict(_leaves(moments, f"runs.{name}")))
    out["schedules"] = (False, dict(_leaves(values.get("schedules", {}), "schedules")))
    return out


def differences(a: dict[str, Any], b: dict[str, Any]) -> tuple[list[str], list[tuple[float, str]]]:
    """Of two groups' leaves: (paths on one side only or with unequal non-numbers, [(relative difference,
    path)] of every number on both sides), relative to the larger magnitude, 0 below ``ATOL``."""
    unmatched = sorted(set(a) ^ set(b))
    rel: list[tuple[float, str]] = []
    for path in sorted(set(a) & set(b)):
        x, y = a[path], b[path]
        if isinstance(x, int | float) and isinstance(y, int | float):
            d = abs(x - y)
            rel.append((0.0 if d <= ATOL else d / max(abs(x), abs(y)), path))
        elif x != y:  # None (a non-finite loss) on one side only, or a string
            unmatched.append(path)
    return unmatched, rel


def mismatch(recorded: dict[str, Any], measured: dict[str, Any]) -> str | None:
    """None when ``measured`` is ``recorded`` up to another machine's rounding (module docstring), else
    what moved: a group (``groups``) missing on one side, a value beyond ``RTOL`` in a group of losses or
    schedules, or in a run's moments more than ``OUTLIER_FRACTION`` of them (rounded up) beyond ``RTOL``
    or one beyond ``RTOL_MAX``."""
    ga, gb = groups(recorded), groups(measured)
    problems = [f"{g}: recorded on one side only" for g in sorted(set(ga) ^ set(gb))]
    for g in sorted(set(ga) & set(gb)):
        outliers, a = ga[g]
        unmatched, rel = differences(a, gb[g][1])
        if unmatched:
            problems.append(f"{g}: {len(unmatched)} values present or finite on one side only ({unmatched[0]})")
            continue
        beyond = sorted((r for r in rel if r[0] > RTOL), reverse=True)
        allowed = math.ceil(OUTLIER_FRACTION * len(rel)) if outliers else 0
        if len(beyond) > allowed or (beyond and beyond[0][0] > RTOL_MAX):
            problems.append(f"{g}: {len(beyond)} of {len(rel)} beyond {RTOL:g} ({allowed} may be, none beyond "
                            f"{RTOL_MAX:g}); largest {beyond[0][1]} by {beyond[0][0]:.1e}")
    if not problems:
        return None
    return "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more groups" if len(problems) > 3 else "")


def check(recorded: dict[str, Any], measured: dict[str, Any]) -> str | None:
    """None when the recording holds for this code; else what to do about it, in one message."""
    if recorded.get("numerics_version") != NUMERICS_VERSION:
        return (f"the golden values are of numerics version {recorded.get('numerics_version')}, the code declares "
                f"NUMERICS_VERSION = {NUMERICS_VERSION} (npas/conversion/numerics.py): re-record them: {RECORD_COMMAND}")
    moved = mismatch(recorded, measured)
    if moved is None:
        return None
    return (f"the training numerics moved: {moved}. If the change is meant, bump NUMERICS_VERSION in "
            f"npas/conversion/numerics.py (now {NUMERICS_VERSION}; every bench cache is keyed by it) and re-record "
            f"the golden values: {RECORD_COMMAND}")


# ------------------------------------------------------------------------------------------ command line
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m npas.conversion.numerics", description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=("record", "check"),
                   help="record: write this code's golden values to PATH; check: compare them with PATH's")
    p.add_argument("path", type=Path, help="the golden values (tests/data/numerics_golden.json)")
    a = p.parse_args(argv)
    recorded = json.loads(a.path.read_text()) if a.path.exists() else None
    if a.action == "check" and recorded is None:
        print(f"error: {a.path} does not exist; record it first: {RECORD_COMMAND}", file=sys.stderr)
        return 2
    measured = measure()
    if a.action == "check":
        problem = check(recorded, measured)
        print(problem or f"{a.path}: the training numerics are those of version {NUMERICS_VERSION}")
        return 1 if problem else 0
    if recorded is not None and recorded.get("numerics_version") == NUMERICS_VERSION:
        moved = mismatch(recorded, measured)
        if moved is not None:
            print(f"error: {a.path} holds other values for numerics version {NUMERICS_VERSION} ({moved}); bump "
                  "NUMERICS_VERSION in npas/conversion/numerics.py first, so no cache keyed by the old numerics is "
                  "read as the new", file=sys.stderr)
            return 2
    measured["recorded_with"] = {"torch": torch.__version__, "machine": platform.machine(),
                                 "processor": platform.processor() or "unknown"}
    a.path.write_text(json.dumps(measured, indent=1) + "\n")
    print(f"{a.path}: recorded numerics version {NUMERICS_VERSION} ({len(measured['runs'])} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
