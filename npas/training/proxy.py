"""The proxy run: train one allocation briefly on real text and score it on held-out text.

This loop runs once per trial, thousands of times per study, so it is kept as lean as a hand-written
nanoGPT loop (``bench/proxy_efficiency.py`` holds it to >= 0.95x of one): batches are drawn in bulk,
the learning rate comes from a precomputed table, and the host syncs with the device only at check
points (every ``min(eval_every, 50)`` steps), where losses are inspected for NaN/inf, the progress
hook runs and validation happens. A diverging run ends as ``status="failed"`` with its reason; no
exception escapes, so a worker process survives any candidate the search throws at it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from npas.training.data import Corpus, Split
from npas.training.parameterization import apply_init, optimizer_groups
from npas.training.recipe import Recipe

log = logging.getLogger(__name__)

Status = Literal["ok", "failed", "stopped"]
Report = Callable[[int, float], bool | None]  # (step, val_loss) -> True to stop early
Progress = Callable[[int, float, float], None]  # (step, smoothed train loss, tokens/s)
CHECK_EVERY = 50  # host-device syncs at most this often (NaN check, progress), besides evaluations
OFFSET_BLOCK = 1024  # batch offsets are drawn this many steps at a time


@dataclass(frozen=True)
class ProxyResult:
    """Metrics of one proxy run. Losses are in nats per token; ``val_bpc`` = nats / ln 2 (bits per
    token, which is per character under a character tokenizer); ``*_bpb`` are bits per UTF-8 byte of
    the scored text, the unit that compares models across tokenizers."""

    status: Status
    val_loss: float | None  # final validation loss; None when the run failed
    val_bpc: float | None
    train_loss: float | None  # mean training loss over the last check window
    steps_done: int  # fidelity actually reached: < recipe.steps when stopped or failed
    stored_params: int  # sum of numel over model.parameters() (shared tensors once)
    param_bytes: int
    peak_memory_bytes: int  # CUDA: measured max allocated; CPU: analytic estimate (memory_source)
    memory_source: Literal["cuda_max_allocated", "analytic"]
    rss_delta_bytes: int  # growth of the process's peak RSS during the run (CPU diagnostic; often 0)
    flops_per_token: int  # forward FLOPs per token from npas.count (training costs ~3x)
    tokens_per_s: float  # training tokens per second, evaluation time excluded
    wall_s: float  # whole run: build, train, evaluate
    curve: tuple[tuple[int, float], ...] = ()  # (step, val_loss) at every evaluation
    failure_reason: str | None = None
    device: str = "cpu"
    config_hash: str = ""
    val_bpb: float | None = None  # bits per byte of the validation text (None in results from older npas)
    train_bpb: float | None = None  # train_loss over the train split's mean bytes per token

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: non-finite numbers become None, the curve a list of [step, loss] pairs."""
        d = asdict(self)
        d["curve"] = [[s, _finite(v)] for s, v in self.curve]
        for k, v in d.items():
            if isinstance(v, float):
                d[k] = _finite(v)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ProxyResult:
        d = dict(d)
        d["curve"] = tuple((int(s), float("nan") if v is None else float(v)) for s, v in d.get("curve", ()))
        return cls(**d)


def _finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


@dataclass
class _Run:
    """Mutable bookkeeping of one run, kept out of the hot loop."""

    step: int = 0
    status: Status = "ok"
    reason: str | None = None
    train_loss: float | None = None
    val_loss: float | None = None
    curve: list[tuple[int, float]] = field(default_factory=list)
    eval_s: float = 0.0
    train_s: float = 0.0


def pick_device(device: str | torch.device | None = None) -> torch.device:
    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def autocast_for(device: torch.device, recipe: Recipe) -> contextlib.AbstractContextManager:
    """bf16 autocast on GPUs that support it when the recipe asks; CPU always runs float32, since
    CPU bf16 is slower than fp32 on most machines without AMX and would skew a study's timings."""
    if device.type == "cuda" and recipe.dtype == "bfloat16" and torch.cuda.is_bf16_supported():
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """The model's own groups when it has them, else decay only >= 2-D parameters (matrices)."""
    if hasattr(model, "param_groups"):
        return model.param_groups(weight_decay)
    params = list(model.parameters())
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def make_optimizer(model: nn.Module, recipe: Recipe, device: torch.device,
                   reference: Any = None) -> torch.optim.Optimizer:
    """AdamW, fused where torch supports it on this device (one kernel for all parameters).

    Groups come from the recipe's parameterization; each carries ``lr_mult``, which the loop
    multiplies the schedule's rate by at every step. ``reference`` is the chassis the base rate was
    tuned on (default: the model's own).
    """
    groups = optimizer_groups(model, recipe.weight_decay, recipe.parameterization, reference)
    for g in groups:
        g["lr"] = recipe.lr * g["lr_mult"]
    kwargs: dict[str, Any] = {"lr": recipe.lr, "betas": recipe.betas}
    try:
        return torch.optim.AdamW(groups, fused=True, **kwargs)
    except (RuntimeError, TypeError, ValueError):
        log.debug("fused AdamW unavailable on %s; using foreach", device)
        return torch.optim.AdamW(groups, foreach=True, **kwargs)


def eval_batches(corpus: Corpus, recipe: Recipe, split: Split = "val") -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed evaluation batches of ``split`` ("val" for a search, "test" for a final
    validation), (eval_batches, B, T) each: evenly spaced windows over the split, with no seed, so
    every evaluation of every trial and every seed on this corpus sees the same text."""
    if split == "train":
        raise ValueError("evaluation reads a held-out split, 'val' or 'test', not 'train'")
    n, B, T = recipe.eval_batches, recipe.batch_size, recipe.seq_len
    x, y = corpus.fixed_windows(split, n * B, T)
    return x.view(n, B, T), y.view(n, B, T)


def eval_tokens_per_byte(corpus: Corpus, recipe: Recipe, split: Split = "val") -> float:
    """Scored tokens per UTF-8 byte of the fixed evaluation windows: a mean loss in nats times this,
    over ln 2, is bits per byte. The windows depend on the corpus and recipe alone, so the driver
    converts an early-stopped trial's last reported loss with the same factor as the worker."""
    y = eval_batches(corpus, recipe, split)[1]
    return y.numel() / max(1, corpus.scored_bytes(y))


def to_bpb(loss_nats_per_token: float | None, tokens_per_byte: float) -> float | None:
    return None if loss_nats_per_token is None else loss_nats_per_token * tokens_per_byte / math.log(2)


@torch.no_grad()
def evaluate(model: nn.Module, batches: tuple[torch.Tensor, torch.Tensor], device: torch.device,
             recipe: Recipe) -> float:
    """Mean validation loss (nats) over the fixed batches; one host sync."""
    was_training = model.training
    model.eval()
    xs, ys = batches
    total = torch.zeros((), device=device)
    with autocast_for(device, recipe):
        for x, y in zip(xs.to(device), ys.to(device), strict=True):
            total += model(x, y)[1].float()
    model.train(was_training)
    return total.item() / len(xs)


def check_compatible(cfg: Any, recipe: Recipe, corpus: Corpus, padded: bool = False) -> None:
    """Refuse a recipe/corpus/allocation mismatch before any work, naming the fix. `padded` (training
    continues from given weights) accepts a chassis vocabulary larger than the tokenizer's: a Hugging
    Face checkpoint's embedding padded past its tokenizer's ids, whose extra rows are never targets."""
    from npas.errors import ConfigError

    c = cfg.chassis
    if recipe.seq_len > c.context:
        raise ConfigError(f"recipe {recipe.name!r} has seq_len={recipe.seq_len} but the chassis context is "
                          f"{c.context}; lower seq_len in the recipe or raise chassis.context")
    if c.vocab_size != corpus.vocab_size and not (padded and c.vocab_size > corpus.vocab_size):
        raise ConfigError(f"chassis vocab_size={c.vocab_size} but corpus {corpus.source} under tokenizer "
                          f"{corpus.tokenizer.name} has {corpus.vocab_size} tokens; set chassis.vocab_size: "
                          f"{corpus.vocab_size} or train on the data and tokenizer the allocation was searched on")
    corpus.check_fits(recipe.seq_len, recipe.batch_size)


def _peak_rss_bytes() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024  # Linux reports KiB, macOS bytes


def train_model(cfg: Any, recipe: Recipe, corpus: Corpus, report: Report | None = None,
                device: str | torch.device | None = None, progress: Progress | None = None,
                reference: Any = None, init_state: dict[str, torch.Tensor] | None = None
                ) -> tuple[nn.Module, ProxyResult]:
    """Build ``cfg``, train it under ``recipe`` and return the trained module with its metrics.

    Memory: on CUDA ``peak_memory_bytes`` is ``torch.cuda.max_memory_allocated`` over the run. On CPU
    torch has no allocator statistics and the process's peak RSS is a high-water mark shared with
    everything the process did before (a worker's second trial usually adds 0), so the figure is
    the analytic ``npas.count(...).train_memory_bytes`` and the measured peak-RSS growth is kept
    beside it as ``rss_delta_bytes`` for sanity checks only. ``reference`` is the chassis whose
    untied model ``recipe.lr`` is tuned for (default ``cfg.chassis``; ``bench/lr_transfer.py`` moves
    width and depth away from it). ``init_state`` starts training from given weights (a model
    converted from a trained one, ``npas.conversion``) instead of the recipe's fresh init.
    """
    from npas.allocation.budget import count
    from npas.allocation.transformer import build_model

    t_start = time.perf_counter()
    dev = pick_device(device)
    check_compatible(cfg, recipe, corpus, padded=init_state is not None)
    acc = count(cfg, batch_size=recipe.batch_size, seq_len=recipe.seq_len)
    prev_threads = torch.get_num_threads()
    if dev.type == "cpu" and recipe.threads > 0:
        torch.set_num_threads(recipe.threads)
    rss0 = _peak_rss_bytes()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    try:
        torch.manual_seed(recipe.seed)  # init is reproducible from the recipe alone
        model = build_model(cfg).float()  # fp32 master weights at any cfg.dtype
        apply_init(model, recipe.parameterization, reference)
        if init_state is not None:
            model.load_state_dict(init_state)
        model = model.to(dev)
        model.train()
        run = _loop(model, recipe, corpus, dev, report, progress, reference)
    finally:
        torch.set_num_threads(prev_threads)
    stored = sum(p.numel() for p in model.parameters())
    if dev.type == "cuda":
        peak, source = torch.cuda.max_memory_allocated(dev), "cuda_max_allocated"
    else:
        peak, source = acc.train_memory_bytes, "analytic"
    wall = time.perf_counter() - t_start
    train_s = max(1e-9, run.train_s - run.eval_s)
    val = run.val_loss if run.status != "failed" else None
    result = ProxyResult(
        status=run.status, val_loss=val, val_bpc=None if val is None else val / math.log(2),
        train_loss=run.train_loss, steps_done=run.step, stored_params=stored,
        param_bytes=acc.param_bytes, peak_memory_bytes=int(peak), memory_source=source,
        rss_delta_bytes=max(0, _peak_rss_bytes() - rss0), flops_per_token=acc.flops_per_token,
        tokens_per_s=run.step * recipe.tokens_per_step / train_s, wall_s=wall, curve=tuple(run.curve),
        failure_reason=run.reason, device=str(dev), config_hash=getattr(cfg, "hash", ""),
        val_bpb=to_bpb(val, eval_tokens_per_byte(corpus, recipe)),
        train_bpb=to_bpb(run.train_loss, 1.0 / corpus.bytes_per_token("train")),
    )
    log.info("proxy %s %s: %s val_loss=%s steps=%d %.0f tok/s %.1fs", result.config_hash, recipe.name,
             result.status, "-" if val is None else f"{val:.4f}", run.step, result.tokens_per_s, wall)
    return model, result


def run_proxy(cfg: Any, recipe: Recipe, corpus: Corpus, report: Report | None = None,
              device: str | torch.device | None = None, progress: Progress | None = None,
              reference: Any = None, init_state: dict[str, torch.Tensor] | None = None) -> ProxyResult:
    """Train and score one allocation; see ``train_model``. ``report(step, val_loss)`` is called at
    every evaluation and may return True to stop the run early (ASHA-style early stopping)."""
    return train_model(cfg, recipe, corpus, report=report, device=device, progress=progress,
                       reference=reference, init_state=init_state)[1]


def _loop(model: nn.Module, recipe: Recipe, corpus: Corpus, dev: torch.device, report: Report | None,
          progress: Progress | None, reference: Any = None) -> _Run:
    run = _Run()
    B, T, steps = recipe.batch_size, recipe.seq_len, recipe.steps
    opt = make_optimizer(model, recipe, dev, reference)
    groups = opt.param_groups
    mults = [g["lr_mult"] for g in groups]
    params = [p for g in groups for p in g["params"]]
    lrs = [recipe.lr_at(s) for s in range(steps)]
    data = corpus.train.to(dev)  # uint8: the whole split lives on the device, batches are gathered there
    window = torch.arange(T + 1, device=dev)
    gen = torch.Generator().manual_seed(recipe.seed + 1)  # batch order (seed itself draws the init)
    evals = tuple(t.to(dev) for t in eval_batches(corpus, recipe))
    amp = autocast_for(dev, recipe)
    clip = recipe.grad_clip
    check = min(recipe.eval_every, CHECK_EVERY)
    losses: list[torch.Tensor] = []
    offsets = torch.empty(0)
    t0 = time.perf_counter()
    try:
        for step in range(steps):
            if step % OFFSET_BLOCK == 0:
                n = min(OFFSET_BLOCK, steps - step)
                offsets = torch.randint(len(data) - T, (n, B, 1), generator=gen).to(dev)
            lr = lrs[step]
            for g, mult in zip(groups, mults, strict=True):
                g["lr"] = lr * mult  # per-group rule applied on top of the schedule at every step
            xy = data[offsets[step % OFFSET_BLOCK] + window].long()  # (B, T+1)
            with amp:
                _, loss = model(xy[:, :-1], xy[:, 1:])
            # expert pools' weighted load-balancing loss (0 without experts) trains with the LM loss;
            # the logged and evaluated losses stay the LM loss alone
            aux = getattr(model, "aux_loss", None)
            (loss if aux is None else loss + aux).backward()
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(params, clip, foreach=True)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.detach())
            done = step + 1
            is_eval = done % recipe.eval_every == 0 or done == steps
            if done % check == 0 or is_eval:
                if _check(run, losses, done, t0, recipe, progress):
                    break
                losses = []
                if is_eval and _evaluate(run, model, evals, dev, recipe, report, done):
                    break
    except torch.cuda.OutOfMemoryError as err:  # a too-large candidate fails; the worker lives on
        run.status, run.reason = "failed", f"out of memory after step {run.step}: {str(err).splitlines()[0]}"
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    run.train_s = time.perf_counter() - t0
    return run


def _check(run: _Run, losses: list[torch.Tensor], done: int, t0: float, recipe: Recipe,
           progress: Progress | None) -> bool:
    """Inspect the window's losses (one sync); True when the run must end because one was not finite."""
    window = torch.stack(losses).float().cpu()
    finite = torch.isfinite(window)
    first = done - len(losses)
    if not bool(finite.all()):
        bad = int((~finite).nonzero()[0, 0])
        run.step = first + bad + 1
        run.status = "failed"
        run.reason = f"non-finite loss at step {run.step} ({window[bad].item()}); lower lr or raise warmup"
        run.train_loss = None
        return True
    run.step = done
    run.train_loss = window.mean().item()
    if progress is not None:
        elapsed = max(1e-9, time.perf_counter() - t0 - run.eval_s)
        progress(done, run.train_loss, done * recipe.tokens_per_step / elapsed)
    return False


def _evaluate(run: _Run, model: nn.Module, evals: tuple[torch.Tensor, torch.Tensor], dev: torch.device,
              recipe: Recipe, report: Report | None, done: int) -> bool:
    """Score the fixed validation batches and ask ``report``; True when the run should stop."""
    t = time.perf_counter()
    val = evaluate(model, evals, dev, recipe)
    run.eval_s += time.perf_counter() - t
    run.curve.append((done, val))
    run.val_loss = val
    if not math.isfinite(val):
        run.status, run.reason = "failed", f"non-finite validation loss at step {done} ({val})"
        return True
    if report is not None and report(done, val) and done < recipe.steps:
        run.status = "stopped"
        log.debug("stop requested at step %d (val_loss %.4f)", done, val)
        return True
    return False
