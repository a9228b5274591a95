"""Warmup-stable-decay (WSD) runs scored by cooldown forks: finished-at-t losses at every rung of one run.

A cosine proxy of 400 steps anneals to its floor at step 400; the 1,600-step run it is meant to
predict anneals at 1,600, so from step ~30 on the two train under different schedules. Under WSD
every run holds the peak rate until its decay starts, whatever its length (``Recipe.lr_at``), so one
*stable* run is, up to step ``decay_start(t)``, every WSD run of length ``t`` at once. A *fork*
copies the stable run there (model, optimizer state, data stream and RNG), decays the copy to ``t``,
scores it on the validation windows and drops it, and the stable run goes on: the fork's loss is,
bit for bit on CPU, the loss of a separately trained WSD run of length ``t`` on the same seed, and
the stable run never sees the fork. One run to ``steps`` thus gives a finished-at-t loss at every
rung it passes (``Recipe.fork_rungs``: horizon/16, horizon/4, horizon by default) for the cost of
the forks' decays (Hägele et al. 2024; MiniCPM's WSD).

The pieces are kept apart so a promotion ladder can drive them: a ``Trainer``
(``npas.training.trainer``) is one run's state, ``Trainer.advance`` trains it stable from its step to
a given step, ``fork_loss`` scores the WSD run of length ``t`` from a trainer at ``decay_start(t)``.
``train_model`` / ``run_proxy`` here are the one entry point of every schedule: the recipe's
schedule picks its strategy (``SCHEDULES``: ``proxy.run_cosine``, or ``run_wsd`` below), and both
drive the same trainer, step for step the same loop.

Under WSD the evaluations are the rungs: the loss ``report`` sees at step t (ASHA's rungs) and the
curve's points are finished-at-t losses, never a stable-phase loss at the peak rate that no finished
run would show; ``eval_every`` sets only how often the host checks for non-finite losses.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from npas.allocation.budget import count
from npas.allocation.transformer import build_model
from npas.training.data import Corpus
from npas.training.parameterization import apply_init
from npas.training.proxy import (
    Progress,
    ProxyResult,
    Report,
    RunLog,
    _finite,
    check_compatible,
    check_window,
    eval_batches,
    eval_tokens_per_byte,
    evaluate,
    make_trainer,
    peak_rss_bytes,
    pick_device,
    run_cosine,
    to_bpb,
)
from npas.training.recipe import Recipe
from npas.training.recursion_eval import recursion_report
from npas.training.trainer import Check, Stream, Trainer, stop_if_not_finite

__all__ = ["SCHEDULES", "ForkResult", "Stream", "Trainer", "build", "fork_loss", "make_trainer", "run_proxy",
           "run_wsd", "stop_if_not_finite", "train_model"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ForkResult(ProxyResult):
    """A WSD run's metrics: those of a proxy run (``val_loss`` is the loss at its last rung, finished
    at ``steps_done``), plus the finished-at-t loss of every rung it passed and what it cost."""

    rung_losses: dict[int, float] = field(default_factory=dict)  # {t: val loss of a WSD run of length t}
    steps_trained: int = 0  # optimizer steps actually run: the stable run's plus every fork's decay

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["rung_losses"] = {int(t): _finite(v) for t, v in self.rung_losses.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ForkResult:
        d = dict(d)
        d["rung_losses"] = {int(t): float("nan") if v is None else float(v)
                            for t, v in (d.get("rung_losses") or {}).items()}
        return super().from_dict(d)  # type: ignore[return-value]


def _rng_state(dev: torch.device) -> tuple:
    return torch.get_rng_state(), torch.cuda.get_rng_state(dev) if dev.type == "cuda" else None


def _set_rng_state(state: tuple, dev: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], dev)


def fork_loss(tr: Trainer, t: int, evals: tuple[torch.Tensor, torch.Tensor]) -> float:
    """The validation loss a WSD run of length ``t`` finishes at, from ``tr`` at its fork point
    ``decay_start(t)``: a branch (model, optimizer, data stream, and torch's global RNG, restored
    after) decays to ``t``, is scored on ``evals`` and dropped. ``tr`` is left exactly as it was.
    NaN when the branch's training loss went non-finite."""
    start = tr.recipe.decay_start(t)
    if tr.step != start:
        raise ValueError(f"a fork to {t} leaves the stable run at step {start}, not {tr.step}")
    rng = _rng_state(tr.device)
    branch = tr.branch()
    try:
        if branch.advance(t, t, stop_if_not_finite):
            return math.nan
        return evaluate(branch.model, evals, tr.device, tr.recipe)
    finally:
        _set_rng_state(rng, tr.device)


@dataclass
class WsdRunLog(RunLog):
    rung_losses: dict[int, float] = field(default_factory=dict)
    main_steps: int = 0  # steps the stable run itself trained (its own decay included)
    fork_steps: int = 0


def run_wsd(tr: Trainer, evals: tuple[torch.Tensor, torch.Tensor], run: WsdRunLog, report: Report | None,
            check: Check) -> None:
    """The WSD schedule's strategy: the stable run to ``steps`` with a fork at every rung short of it;
    the run's own decay is the last rung. Reports each rung's loss; a report that returns True stops
    the run at that rung."""
    recipe, dev = tr.recipe, tr.device
    reached = 0
    for t in recipe.fork_rungs():
        last = t == recipe.steps
        if tr.advance(recipe.steps if last else recipe.decay_start(t), recipe.steps, check):
            break
        e = time.perf_counter()
        if last:
            loss = evaluate(tr.model, evals, dev, recipe)
        else:
            loss = fork_loss(tr, t, evals)
            run.fork_steps += t - tr.step
        run.eval_s += time.perf_counter() - e  # a fork too, like an evaluation: off the stable run's tokens/s
        run.rung_losses[t] = loss
        run.curve.append((t, loss))
        run.val_loss = loss
        if not math.isfinite(loss):
            where = "the run's own decay" if last else f"the cooldown fork to rung {t}"
            run.status, run.reason = "failed", f"non-finite loss in {where} ({loss}); lower lr or raise warmup"
            break
        reached = t
        if report is not None and report(t, loss) and not last:
            run.status = "stopped"
            log.debug("stop requested at rung %d (val_loss %.4f)", t, loss)
            break
    if run.status != "failed":
        run.step = reached  # fidelity: the longest run whose finished loss is known


Strategy = Callable[[Trainer, tuple[torch.Tensor, torch.Tensor], Any, "Report | None", Check], None]
SCHEDULES: dict[str, tuple[type[RunLog], Strategy]] = {"cosine": (RunLog, run_cosine), "wsd": (WsdRunLog, run_wsd)}


def build(cfg: Any, recipe: Recipe, reference: Any = None, init_state: dict[str, torch.Tensor] | None = None
          ) -> nn.Module:
    """The model at step 0: seeded init (reproducible from the recipe alone), the parameterization's
    init scales, fp32 master weights at any ``cfg.dtype``, then ``init_state``'s weights when given."""
    torch.manual_seed(recipe.seed)
    model = build_model(cfg).float()
    apply_init(model, recipe.parameterization, reference)
    if init_state is not None:
        model.load_state_dict(init_state)
    return model


def train_model(cfg: Any, recipe: Recipe, corpus: Corpus, report: Report | None = None,
                device: str | torch.device | None = None, progress: Progress | None = None,
                reference: Any = None, init_state: dict[str, torch.Tensor] | None = None,
                lr_factor: float = 1.0) -> tuple[nn.Module, ProxyResult]:
    """Build ``cfg``, train it under ``recipe`` and return the trained module with its metrics: a
    ``ProxyResult`` for a cosine recipe, a ``ForkResult`` (with every rung's finished loss) for a WSD
    one, whose module is the stable run's after its own decay to ``steps``.

    Memory: on CUDA ``peak_memory_bytes`` is ``torch.cuda.max_memory_allocated`` over the run (a fork
    holds a second copy of model and optimizer: measured, it is in the peak). On CPU torch has no
    allocator statistics and the process's peak RSS is a high-water mark shared with everything the
    process did before (a worker's second trial usually adds 0), so the figure is the analytic
    ``npas.count(...).train_memory_bytes`` and the measured peak-RSS growth is kept beside it as
    ``rss_delta_bytes`` for sanity checks only. ``reference`` is the chassis whose untied model
    ``recipe.lr`` is tuned for (default ``cfg.chassis``; a learning-rate transfer study moves width and
    depth away from it). ``init_state`` starts training from given weights (a model converted from a
    trained one, ``npas.conversion``) instead of the recipe's fresh init. ``lr_factor``: the run's
    rates times this factor (``Trainer.lr_factor``). ``report(step, val_loss)`` is called at every
    evaluation (a WSD run's rungs) and may return True to stop the run early (ASHA-style)."""
    t_start = time.perf_counter()
    dev = pick_device(device)
    check_compatible(cfg, recipe, corpus, padded=init_state is not None)
    acc = count(cfg, batch_size=recipe.batch_size, seq_len=recipe.seq_len)
    prev_threads = torch.get_num_threads()
    if dev.type == "cpu" and recipe.threads > 0:
        torch.set_num_threads(recipe.threads)
    rss0 = peak_rss_bytes()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    log_type, strategy = SCHEDULES[recipe.schedule]
    run = log_type()
    try:
        model = build(cfg, recipe, reference, init_state).to(dev)
        model.train()
        tr = make_trainer(model, recipe, corpus, dev, reference, lr_factor=lr_factor)
        evals = tuple(t.to(dev) for t in eval_batches(corpus, recipe))
        t0 = time.perf_counter()

        def check(done: int, losses: list[torch.Tensor]) -> bool:
            return check_window(run, losses, done, t0, recipe, progress)

        try:
            strategy(tr, evals, run, report, check)
        except torch.cuda.OutOfMemoryError as err:  # a too-large candidate fails; the worker lives on
            run.status, run.reason = "failed", f"out of memory after step {tr.step}: {str(err).splitlines()[0]}"
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        run.train_s = time.perf_counter() - t0
        if isinstance(run, WsdRunLog):
            run.main_steps = tr.step
    finally:
        torch.set_num_threads(prev_threads)
    stored = sum(p.numel() for p in model.parameters())
    if dev.type == "cuda":
        peak, source = torch.cuda.max_memory_allocated(dev), "cuda_max_allocated"
    else:
        peak, source = acc.train_memory_bytes, "analytic"
    wall = time.perf_counter() - t_start
    train_s = max(1e-9, run.train_s - run.eval_s)  # the (stable) run's own training time
    val = run.val_loss if run.status != "failed" else None
    fields = dict(
        status=run.status, val_loss=val, val_bpc=None if val is None else val / math.log(2),
        train_loss=run.train_loss, steps_done=run.step, stored_params=stored,
        param_bytes=acc.param_bytes, peak_memory_bytes=int(peak), memory_source=source,
        rss_delta_bytes=max(0, peak_rss_bytes() - rss0), flops_per_token=acc.flops_per_token,
        tokens_per_s=run.step * recipe.tokens_per_step / train_s, wall_s=wall, curve=tuple(run.curve),
        failure_reason=run.reason, device=str(dev), config_hash=getattr(cfg, "hash", ""),
        val_bpb=to_bpb(val, eval_tokens_per_byte(corpus, recipe)),
        train_bpb=to_bpb(run.train_loss, 1.0 / corpus.bytes_per_token("train")),
    )
    if getattr(cfg, "recursion", None) is not None and val is not None:
        fields["recursion"] = recursion_report(model, evals, dev, recipe)
        fields["flops_per_token"] = fields["recursion"]["flops_per_token"]  # what the causal rule realised
    if not isinstance(run, WsdRunLog):
        result = ProxyResult(**fields)
        log.info("proxy %s %s: %s val_loss=%s steps=%d %.0f tok/s %.1fs", result.config_hash, recipe.name,
                 result.status, "-" if val is None else f"{val:.4f}", run.step, result.tokens_per_s, wall)
        return model, result
    fields["tokens_per_s"] = run.main_steps * recipe.tokens_per_step / train_s
    result = ForkResult(**fields, rung_losses=dict(run.rung_losses), steps_trained=run.main_steps + run.fork_steps)
    log.info("wsd proxy %s %s: %s val_loss=%s rungs=%s steps=%d (+%d in forks) %.1fs", result.config_hash,
             recipe.name, result.status, "-" if val is None else f"{val:.4f}",
             {t: round(v, 4) for t, v in run.rung_losses.items()}, run.main_steps, run.fork_steps, wall)
    return model, result


def run_proxy(cfg: Any, recipe: Recipe, corpus: Corpus, report: Report | None = None,
              device: str | torch.device | None = None, progress: Progress | None = None,
              reference: Any = None, init_state: dict[str, torch.Tensor] | None = None,
              lr_factor: float = 1.0) -> ProxyResult:
    """Train and score one allocation under its recipe's schedule; see ``train_model``."""
    return train_model(cfg, recipe, corpus, report=report, device=device, progress=progress,
                       reference=reference, init_state=init_state, lr_factor=lr_factor)[1]
