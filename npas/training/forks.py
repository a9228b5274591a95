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

The pieces are kept apart so a promotion ladder can drive them: ``Trainer`` is one run's state,
``advance`` trains it stable from its step to a given step, ``fork_loss`` scores the WSD run of
length ``t`` from a trainer at ``decay_start(t)``. ``train_model`` / ``run_proxy`` here are the
entry points every caller uses: a ``cosine`` recipe goes to ``npas.training.proxy``, a ``wsd`` recipe
runs the loop below, which shares the proxy's helpers (optimizer, evaluation, checks) and its data
order (offsets drawn ``OFFSET_BLOCK`` steps at a time from ``seed + 1``; always whole blocks here, so
the batch of step s does not depend on the run's length -- CPU ``randint`` draws prefix-consistently,
so this is also the cosine loop's order).

Under WSD the evaluations are the rungs: the loss ``report`` sees at step t (ASHA's rungs) and the
curve's points are finished-at-t losses, never a stable-phase loss at the peak rate that no finished
run would show; ``eval_every`` sets only how often the host checks for non-finite losses.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from npas.training import proxy as _proxy
from npas.training.data import Corpus
from npas.training.proxy import (
    CHECK_EVERY,
    OFFSET_BLOCK,
    Progress,
    ProxyResult,
    Report,
    autocast_for,
    eval_batches,
    eval_tokens_per_byte,
    evaluate,
    make_optimizer,
    pick_device,
    to_bpb,
)
from npas.training.recipe import Recipe

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ForkResult(ProxyResult):
    """A WSD run's metrics: those of a proxy run (``val_loss`` is the loss at its last rung, finished
    at ``steps_done``), plus the finished-at-t loss of every rung it passed and what it cost."""

    rung_losses: dict[int, float] = field(default_factory=dict)  # {t: val loss of a WSD run of length t}
    steps_trained: int = 0  # optimizer steps actually run: the stable run's plus every fork's decay

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["rung_losses"] = {int(t): _proxy._finite(v) for t, v in self.rung_losses.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ForkResult:
        d = dict(d)
        d["rung_losses"] = {int(t): float("nan") if v is None else float(v)
                            for t, v in (d.get("rung_losses") or {}).items()}
        return super().from_dict(d)  # type: ignore[return-value]


class Stream:
    """A run's data order: batch offsets drawn ``OFFSET_BLOCK`` steps at a time from a generator seeded
    ``seed + 1``. Whole blocks are drawn whatever the run's length, so step s's batch is a function of
    the seed alone; steps are read in order, block after block."""

    def __init__(self, n_data: int, batch: int, seq_len: int, seed: int, device: torch.device) -> None:
        self.high, self.batch, self.device = n_data - seq_len, batch, device
        self.gen = torch.Generator().manual_seed(seed + 1)  # seed itself draws the init
        self.block = -1
        self.offsets = torch.empty(0)

    def at(self, step: int) -> torch.Tensor:
        """(B, 1) offsets of ``step``'s windows."""
        while self.block < step // OFFSET_BLOCK:
            self.offsets = torch.randint(self.high, (OFFSET_BLOCK, self.batch, 1), generator=self.gen).to(self.device)
            self.block += 1
        if self.block != step // OFFSET_BLOCK:
            raise ValueError(f"step {step} is behind the stream's block {self.block}; a stream only moves forward")
        return self.offsets[step % OFFSET_BLOCK]

    def copy(self) -> Stream:
        """An independent stream at the same point: what it draws next equals what this one draws next."""
        new = copy.copy(self)
        new.gen = torch.Generator()
        new.gen.set_state(self.gen.get_state())
        return new  # the current block is shared: nobody writes into it


@dataclass
class Trainer:
    """One WSD run's state between steps: ``step`` optimizer steps are done."""

    model: nn.Module
    opt: torch.optim.Optimizer
    stream: Stream
    recipe: Recipe
    data: torch.Tensor  # the train split on the device
    device: torch.device
    step: int = 0

    def branch(self) -> Trainer:
        """A copy to decay and discard: model and optimizer deep-copied together (so the copied
        optimizer's state is keyed on the copied parameters) and the data stream copied."""
        model, opt = copy.deepcopy((self.model, self.opt))
        return Trainer(model, opt, self.stream.copy(), self.recipe, self.data, self.device, self.step)


def make_trainer(model: nn.Module, recipe: Recipe, corpus: Corpus, dev: torch.device,
                 reference: Any = None) -> Trainer:
    opt = make_optimizer(model, recipe, dev, reference)
    data = corpus.train.to(dev)  # uint8: the whole split lives on the device, batches are gathered there
    return Trainer(model, opt, Stream(len(data), recipe.batch_size, recipe.seq_len, recipe.seed, dev), recipe,
                   data, dev)


Check = Callable[[int, list[torch.Tensor]], bool]  # (steps done, losses since the last check) -> stop


def advance(tr: Trainer, until: int, length: int, check: Check | None = None) -> bool:
    """Train ``tr`` from its step to ``until`` under the schedule of a WSD run of ``length`` steps
    (stable as long as ``until <= decay_start(length)``). ``check`` sees the losses every
    ``min(eval_every, CHECK_EVERY)`` steps and at ``until`` (one host sync each) and may stop the
    segment; returns True when it did. The step is the proxy loop's, operation for operation."""
    recipe, dev = tr.recipe, tr.device
    groups = tr.opt.param_groups
    mults = [g["lr_mult"] for g in groups]
    params = [p for g in groups for p in g["params"]]
    window = torch.arange(recipe.seq_len + 1, device=dev)
    amp = autocast_for(dev, recipe)
    clip = recipe.grad_clip
    every = min(recipe.eval_every, CHECK_EVERY)
    losses: list[torch.Tensor] = []
    while tr.step < until:
        lr = recipe.lr_at(tr.step, length)
        for g, mult in zip(groups, mults, strict=True):
            g["lr"] = lr * mult
        xy = tr.data[tr.stream.at(tr.step) + window].long()  # (B, T+1)
        with amp:
            _, loss = tr.model(xy[:, :-1], xy[:, 1:])
        aux = getattr(tr.model, "aux_loss", None)
        (loss if aux is None else loss + aux).backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(params, clip, foreach=True)
        tr.opt.step()
        tr.opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        tr.step += 1
        if tr.step % every == 0 or tr.step == until:
            if check is not None and check(tr.step, losses):
                return True
            losses = []
    return False


def _stop_if_not_finite(done: int, losses: list[torch.Tensor]) -> bool:
    return not bool(torch.isfinite(torch.stack(losses).float()).all())


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
        if advance(branch, t, t, _stop_if_not_finite):
            return math.nan
        return evaluate(branch.model, evals, tr.device, tr.recipe)
    finally:
        _set_rng_state(rng, tr.device)


@dataclass
class _WsdRun(_proxy._Run):
    rung_losses: dict[int, float] = field(default_factory=dict)
    main_steps: int = 0  # steps the stable run itself trained (its own decay included)
    fork_steps: int = 0


def _wsd_loop(model: nn.Module, recipe: Recipe, corpus: Corpus, dev: torch.device, report: Report | None,
              progress: Progress | None, reference: Any = None) -> _WsdRun:
    """The stable run to ``steps`` with a fork at every rung short of it; the run's own decay is the last
    rung. Reports each rung's loss; a report that returns True stops the run at that rung."""
    run = _WsdRun()
    tr = make_trainer(model, recipe, corpus, dev, reference)
    evals = tuple(t.to(dev) for t in eval_batches(corpus, recipe))
    t0 = time.perf_counter()

    def check(done: int, losses: list[torch.Tensor]) -> bool:
        return _proxy._check(run, losses, done, t0, recipe, progress)

    reached = 0
    try:
        for t in recipe.fork_rungs():
            last = t == recipe.steps
            if advance(tr, recipe.steps if last else recipe.decay_start(t), recipe.steps, check):
                break
            if last:
                e = time.perf_counter()
                loss = evaluate(tr.model, evals, dev, recipe)
                run.eval_s += time.perf_counter() - e
            else:
                f = time.perf_counter()
                loss = fork_loss(tr, t, evals)
                run.eval_s += time.perf_counter() - f  # like an evaluation, off the stable run's tokens/s
                run.fork_steps += t - tr.step
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
    except torch.cuda.OutOfMemoryError as err:  # a too-large candidate fails; the worker lives on
        run.status, run.reason = "failed", f"out of memory after step {tr.step}: {str(err).splitlines()[0]}"
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    run.train_s = time.perf_counter() - t0
    run.main_steps = tr.step
    if run.status != "failed":
        run.step = reached  # fidelity: the longest run whose finished loss is known
    return run


def train_model(cfg: Any, recipe: Recipe, corpus: Corpus, report: Report | None = None,
                device: str | torch.device | None = None, progress: Progress | None = None,
                reference: Any = None, init_state: dict[str, torch.Tensor] | None = None
                ) -> tuple[nn.Module, ProxyResult]:
    """``npas.training.proxy.train_model`` for any schedule: a cosine recipe runs there, untouched; a
    WSD recipe runs the stable run with its forks and returns a ``ForkResult`` (the model returned is
    the stable run's after its own decay to ``steps``)."""
    if recipe.schedule != "wsd":
        return _proxy.train_model(cfg, recipe, corpus, report=report, device=device, progress=progress,
                                  reference=reference, init_state=init_state)
    from npas.allocation.budget import count
    from npas.allocation.transformer import build_model
    from npas.training.parameterization import apply_init

    t_start = time.perf_counter()
    dev = pick_device(device)
    _proxy.check_compatible(cfg, recipe, corpus)
    acc = count(cfg, batch_size=recipe.batch_size, seq_len=recipe.seq_len)
    prev_threads = torch.get_num_threads()
    if dev.type == "cpu" and recipe.threads > 0:
        torch.set_num_threads(recipe.threads)
    rss0 = _proxy._peak_rss_bytes()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    try:
        torch.manual_seed(recipe.seed)  # init is reproducible from the recipe alone, as in the cosine loop
        model = build_model(cfg).float()
        apply_init(model, recipe.parameterization, reference)
        if init_state is not None:
            model.load_state_dict(init_state)
        model = model.to(dev)
        model.train()
        run = _wsd_loop(model, recipe, corpus, dev, report, progress, reference)
    finally:
        torch.set_num_threads(prev_threads)
    stored = sum(p.numel() for p in model.parameters())
    if dev.type == "cuda":  # a fork holds a second copy of model and optimizer: measured, it is in the peak
        peak, source = torch.cuda.max_memory_allocated(dev), "cuda_max_allocated"
    else:
        peak, source = acc.train_memory_bytes, "analytic"
    trained = run.main_steps + run.fork_steps
    train_s = max(1e-9, run.train_s - run.eval_s)  # the stable run's own training time
    val = run.val_loss if run.status != "failed" else None
    result = ForkResult(
        status=run.status, val_loss=val, val_bpc=None if val is None else val / math.log(2),
        train_loss=run.train_loss, steps_done=run.step, stored_params=stored,
        param_bytes=acc.param_bytes, peak_memory_bytes=int(peak), memory_source=source,
        rss_delta_bytes=max(0, _proxy._peak_rss_bytes() - rss0), flops_per_token=acc.flops_per_token,
        tokens_per_s=run.main_steps * recipe.tokens_per_step / train_s,
        wall_s=time.perf_counter() - t_start, curve=tuple(run.curve), failure_reason=run.reason,
        device=str(dev), config_hash=getattr(cfg, "hash", ""),
        val_bpb=to_bpb(val, eval_tokens_per_byte(corpus, recipe)),
        train_bpb=to_bpb(run.train_loss, 1.0 / corpus.bytes_per_token("train")),
        rung_losses=dict(run.rung_losses), steps_trained=trained,
    )
    log.info("wsd proxy %s %s: %s val_loss=%s rungs=%s steps=%d (+%d in forks) %.1fs", result.config_hash,
             recipe.name, result.status, "-" if val is None else f"{val:.4f}",
             {t: round(v, 4) for t, v in run.rung_losses.items()}, run.main_steps, run.fork_steps,
             result.wall_s)
    return model, result


def run_proxy(cfg: Any, recipe: Recipe, corpus: Corpus, report: Report | None = None,
              device: str | torch.device | None = None, progress: Progress | None = None,
              reference: Any = None, init_state: dict[str, torch.Tensor] | None = None) -> ProxyResult:
    """Train and score one allocation under its recipe's schedule; see ``train_model``."""
    return train_model(cfg, recipe, corpus, report=report, device=device, progress=progress,
                       reference=reference, init_state=init_state)[1]
