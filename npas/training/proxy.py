"""The proxy run's metrics and helpers, and the cosine schedule's strategy.

A proxy run trains one allocation briefly on real text and scores it on held-out text: its steps are
the one loop's (``npas.training.trainer.Trainer.advance``), driven by its schedule's strategy
(``run_cosine`` here, ``npas.training.forks.run_wsd``) from the one entry point
``npas.training.forks.train_model``. The host checks the losses for NaN/inf at every check point
(``check_window``: every ``min(eval_every, 50)`` steps and before each evaluation), where the progress
hook runs. A diverging run ends as ``status="failed"`` with its reason; no exception escapes, so a
worker process survives any candidate the search throws at it.
"""

from __future__ import annotations

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

from npas.errors import ConfigError
from npas.training.data import Corpus, Split
from npas.training.parameterization import optimizer_groups, param_groups
from npas.training.recipe import Recipe
from npas.training.trainer import CHECK_EVERY, OFFSET_BLOCK, Check, Stream, Trainer, autocast_for

__all__ = ["CHECK_EVERY", "OFFSET_BLOCK", "ProxyResult", "autocast_for", "check_compatible", "check_window", "eval_batches",
           "evaluate", "make_optimizer", "make_trainer", "param_groups", "peak_rss_bytes", "pick_device", "run_cosine", "RunLog", "to_bpb"]

log = logging.getLogger(__name__)

Status = Literal["ok", "failed", "stopped"]
Report = Callable[[int, float], bool | None]  # (step, val_loss) -> True to stop early
Progress = Callable[[int, float, float], None]  # (step, smoothed train loss, tokens/s)


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
    # per-token recursion (npas.training.recursion_eval): both rules' losses, the realised depth and its
    # FLOPs / KV cache per token; flops_per_token above is then the realised one. None otherwise
    recursion: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: non-finite numbers become None, the curve a list of [step, loss] pairs."""
        d = asdict(self)
        d["curve"] = [[s, _finite(v)] for s, v in self.curve]
        for k, v in d.items():
            if isinstance(v, float):
                d[k] = _finite(v)
        if d["recursion"] is None:  # results without recursion keep their keys
            del d["recursion"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ProxyResult:
        d = dict(d)
        d["curve"] = tuple((int(s), float("nan") if v is None else float(v)) for s, v in d.get("curve", ()))
        return cls(**d)


def _finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


@dataclass
class RunLog:
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


def make_trainer(model: nn.Module, recipe: Recipe, corpus: Any, dev: torch.device, reference: Any = None,
                 lr_factor: float = 1.0) -> Trainer:
    """A trainer at step 0 for ``model`` (built and initialised, on ``dev``): its optimizer from the
    recipe's parameterization against ``reference``, the train split on the device."""
    opt = make_optimizer(model, recipe, dev, reference)
    data = corpus.train.to(dev)  # uint8: the whole split lives on the device, batches are gathered there
    return Trainer(model, opt, Stream(len(data), recipe.batch_size, recipe.seq_len, recipe.seed, dev), recipe,
                   data, dev, lr_factor=lr_factor)


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
    c = cfg.chassis
    if recipe.seq_len > c.context:
        raise ConfigError(f"recipe {recipe.name!r} has seq_len={recipe.seq_len} but the chassis context is "
                          f"{c.context}; lower seq_len in the recipe or raise chassis.context")
    if c.vocab_size != corpus.vocab_size and not (padded and c.vocab_size > corpus.vocab_size):
        raise ConfigError(f"chassis vocab_size={c.vocab_size} but corpus {corpus.source} under tokenizer "
                          f"{corpus.tokenizer.name} has {corpus.vocab_size} tokens; set chassis.vocab_size: "
                          f"{corpus.vocab_size} or train on the data and tokenizer the allocation was searched on")
    corpus.check_fits(recipe.seq_len, recipe.batch_size)


def peak_rss_bytes() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024  # Linux reports KiB, macOS bytes


def run_cosine(tr: Trainer, evals: tuple[torch.Tensor, torch.Tensor], run: RunLog, report: Report | None,
               check: Check) -> None:
    """The cosine schedule's strategy: one run to ``steps``, scored on the validation windows every
    ``eval_every`` steps and at its end, each score told to ``report`` (which may stop the run)."""
    recipe = tr.recipe
    while tr.step < recipe.steps:
        done = min(recipe.steps, (tr.step // recipe.eval_every + 1) * recipe.eval_every)
        if tr.advance(done, recipe.steps, check):
            return
        if _evaluate(run, tr.model, evals, tr.device, recipe, report, done):
            return


def check_window(run: RunLog, losses: list[torch.Tensor], done: int, t0: float, recipe: Recipe,
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


def _evaluate(run: RunLog, model: nn.Module, evals: tuple[torch.Tensor, torch.Tensor], dev: torch.device,
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
