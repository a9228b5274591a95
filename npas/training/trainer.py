"""`Trainer`: one run's state between steps, and the one training loop every run steps through.

Every schedule's run -- a cosine proxy, a WSD run with its cooldown forks, a ladder's climb, a rate
grid's runs, ``npas train`` -- is a ``Trainer`` (model, optimizer, data stream, step) moved forward by
``Trainer.advance``, which trains from its step to a given step under the rate schedule of a run of a
given length. The schedule itself is the recipe's (``Recipe.lr_at``: cosine, or warmup-stable-decay);
what a run does between segments -- evaluate every ``eval_every`` steps, or fork a decay at each rung
-- is the schedule's strategy (``npas.training.proxy.run_cosine``, ``npas.training.forks.run_wsd``).

The loop is kept as lean as a hand-written nanoGPT loop (the proxy-efficiency benchmark holds it to
>= 0.95x of one): batch offsets are drawn in bulk, the learning rate comes from a table per run
length, and the host syncs with the device only at check points (every ``min(eval_every,
CHECK_EVERY)`` steps and at the segment's end), where ``check`` sees the losses.

The data order: batch offsets drawn ``OFFSET_BLOCK`` steps at a time from a generator seeded ``seed
+ 1`` (the seed itself draws the init). Whole blocks are drawn whatever the run's length, so step s's
batch is a function of the seed alone (CPU ``randint`` draws prefix-consistently, so a run cut short
reads the same batches as a longer one), and a copied stream draws what the original would.

``lr_factor`` multiplies every parameter group's rate, the whole schedule included: a candidate's
located rate (``npas.training.located_rate``) or the factor ``npas train`` trains an export at. The
loop reads it, at each segment, as ``lr * (lr_mult * lr_factor)``: every group keeps the fair rule
between groups, and factor 1 changes no bit.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from npas.training.recipe import Recipe

CHECK_EVERY = 50  # host-device syncs at most this often (NaN check, progress), besides evaluations
OFFSET_BLOCK = 1024  # batch offsets are drawn this many steps at a time

Check = Callable[[int, list[torch.Tensor]], bool]  # (steps done, losses since the last check) -> stop


def autocast_for(device: torch.device, recipe: Recipe) -> contextlib.AbstractContextManager:
    """bf16 autocast on GPUs that support it when the recipe asks; CPU always runs float32, since
    CPU bf16 is slower than fp32 on most machines without AMX and would skew a study's timings."""
    if device.type == "cuda" and recipe.dtype == "bfloat16" and torch.cuda.is_bf16_supported():
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


class Stream:
    """A run's data order (see the module docstring); steps are read in order, block after block."""

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
    """One run's state between steps: ``step`` optimizer steps are done."""

    model: nn.Module
    opt: torch.optim.Optimizer
    stream: Stream
    recipe: Recipe
    data: torch.Tensor  # the train split on the device
    device: torch.device
    step: int = 0
    lr_factor: float = 1.0  # x the recipe's fair rate, every group and the whole schedule (module docstring)
    _rates: dict[int, list[float]] = field(default_factory=dict, repr=False)  # run length -> its lr table

    def __post_init__(self) -> None:
        if not (self.lr_factor > 0 and math.isfinite(self.lr_factor)):
            raise ValueError(f"lr_factor must be a finite number > 0, got {self.lr_factor!r}")

    def rates(self, length: int) -> list[float]:
        """The schedule's rate at every step of a run of ``length`` steps, computed once per length."""
        if length not in self._rates:
            self._rates[length] = [self.recipe.lr_at(s, length) for s in range(length)]
        return self._rates[length]

    def branch(self) -> Trainer:
        """A copy to train on and discard: model and optimizer deep-copied together (so the copied
        optimizer's state is keyed on the copied parameters) and the data stream copied."""
        model, opt = copy.deepcopy((self.model, self.opt))
        return Trainer(model, opt, self.stream.copy(), self.recipe, self.data, self.device, self.step,
                       self.lr_factor, self._rates)

    def advance(self, until: int, length: int, check: Check | None = None) -> bool:
        """Train from ``step`` to ``until`` under the schedule of a run of ``length`` steps (a WSD run is
        stable as long as ``until <= decay_start(length)``). ``check`` sees the losses every
        ``min(eval_every, CHECK_EVERY)`` steps and at ``until`` (one host sync each) and may stop the
        segment; returns True when it did."""
        recipe, dev = self.recipe, self.device
        groups = self.opt.param_groups
        mults = [g["lr_mult"] * self.lr_factor for g in groups]
        params = [p for g in groups for p in g["params"]]
        lrs = self.rates(length)
        window = torch.arange(recipe.seq_len + 1, device=dev)
        amp = autocast_for(dev, recipe)
        clip = recipe.grad_clip
        every = min(recipe.eval_every, CHECK_EVERY)
        model, opt, data, stream = self.model, self.opt, self.data, self.stream
        losses: list[torch.Tensor] = []
        step = self.step
        while step < until:
            lr = lrs[step]
            for g, mult in zip(groups, mults, strict=True):
                g["lr"] = lr * mult  # per-group rule applied on top of the schedule at every step
            xy = data[stream.at(step) + window].long()  # (B, T+1)
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
            step += 1
            self.step = step
            if step % every == 0 or step == until:
                if check is not None and check(step, losses):
                    return True
                losses = []
        return False


def stop_if_not_finite(done: int, losses: list[torch.Tensor]) -> bool:
    return not bool(torch.isfinite(torch.stack(losses).float()).all())
