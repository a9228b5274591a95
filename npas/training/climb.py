"""A WSD run that climbs its rungs one call at a time, so a promotion ladder can stop it between rungs.

``npas.training.forks`` runs a WSD proxy in one go (``train_model``). A ladder needs the same run cut
at its rungs: train the stable phase to the next rung's fork point, score the rung with a cooldown
fork, and then either go on or *pause* -- hand the stable state to a checkpoint
(``npas.training.checkpoint``) and resume it later, in another process, from exactly there. A
``Climb`` is that run: a ``Trainer`` (``npas.training.trainer``: the stable run), the fixed validation
windows, the losses of the rungs passed and the steps the forks cost. Its steps are
``Trainer.advance`` and ``forks.fork_loss`` themselves, so a climb to the top rung computes bit for
bit what ``forks.train_model`` computes (tests/training/test_checkpoint.py checks it).

Where a climb stands between rungs: at rung ``t`` short of the top, the stable run is at
``decay_start(t)`` (the fork point; the fork's decay ran on a discarded copy), which is where the
next rung's stable segment starts. The top rung ``steps`` decays the stable run itself, as
``forks.run_wsd`` does. So ``trained_steps`` -- the stable run's steps plus every fork's decay -- is
the top rung reached plus the decays of the forks below it, and no step is ever trained twice.

``lr_factor`` is the trainer's (``Trainer.lr_factor``): the whole schedule, warmup and floor
included, runs at ``factor`` x the recipe's fair rate for each group; a checkpoint carries it; at
factor 1 nothing changes (``mult * 1.0 == mult``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from npas.training import forks
from npas.training.data import Corpus
from npas.training.forks import build
from npas.training.proxy import check_compatible, eval_batches, evaluate, make_trainer, pick_device
from npas.training.recipe import Recipe
from npas.training.trainer import Trainer, stop_if_not_finite


@contextlib.contextmanager
def recipe_threads(recipe: Recipe, dev: torch.device) -> Iterator[None]:
    """Torch CPU threads as the recipe says while a climb trains (as ``forks.train_model`` sets them);
    restored after, so a worker that climbs several trials leaves torch as it found it."""
    prev = torch.get_num_threads()
    if dev.type == "cpu" and recipe.threads > 0:
        torch.set_num_threads(recipe.threads)
    try:
        yield
    finally:
        torch.set_num_threads(prev)


@dataclass
class Climb:
    """One WSD run between rungs: ``trainer`` is its stable run, ``rung_losses`` the finished-at-t
    losses of the rungs it passed, ``fork_steps`` the steps its forks' decays trained."""

    trainer: Trainer
    evals: tuple[torch.Tensor, torch.Tensor]
    rung_losses: dict[int, float] = field(default_factory=dict)
    fork_steps: int = 0
    lr_factor: float = 1.0
    failed: str | None = None  # why the climb cannot go on (a non-finite loss), else None
    # told the climb every few steps while it trains (each host sync of ``Trainer.advance``): a search
    # reports its steps so far, so steps lost with a crashed driver are still counted; not checkpointed
    on_progress: Callable[[Climb], None] | None = field(default=None, repr=False, compare=False)

    @property
    def recipe(self) -> Recipe:
        return self.trainer.recipe

    @property
    def rungs(self) -> tuple[int, ...]:
        return self.recipe.fork_rungs()

    @property
    def top(self) -> int:
        """The highest rung passed; 0 before the first."""
        return max(self.rung_losses, default=0)

    @property
    def next_rung(self) -> int | None:
        """The rung the next ``step_up`` scores; None when the climb is at the top or failed."""
        if self.failed is not None:
            return None
        return next((t for t in self.rungs if t > self.top), None)

    @property
    def trained_steps(self) -> int:
        """Optimizer steps actually run: the stable run's plus every fork's decay (= top rung + forks)."""
        return self.trainer.step + self.fork_steps

    def step_up(self) -> tuple[int, float]:
        """Train to the next rung and score it: (rung, its finished-at-t loss; NaN when it diverged)."""
        t = self.next_rung
        if t is None:
            raise ValueError(f"nothing to climb: {'failed: ' + self.failed if self.failed else 'at the top rung'}")
        tr, recipe, last = self.trainer, self.recipe, t == self.recipe.steps
        with recipe_threads(recipe, tr.device):
            # the stable segment: under the schedule of the whole run, flat until decay_start(steps)
            if tr.advance(recipe.steps if last else recipe.decay_start(t), recipe.steps, self._check):
                loss = math.nan
            elif last:  # the top rung decays the stable run itself
                loss = evaluate(tr.model, self.evals, tr.device, recipe)
            else:
                loss = forks.fork_loss(tr, t, self.evals)
                self.fork_steps += t - tr.step
        self.rung_losses[t] = loss
        if not math.isfinite(loss):
            self.failed = f"non-finite loss on the way to rung {t} ({loss}); lower lr or raise warmup"
        return t, loss

    def _check(self, done: int, losses: list[torch.Tensor]) -> bool:
        if self.on_progress is not None:
            self.on_progress(self)
        return stop_if_not_finite(done, losses)

    def climb(self, until: int | None = None) -> dict[int, float]:
        """Step up rung after rung to ``until`` (default: the top), stopping early on a failure."""
        end = self.rungs[-1] if until is None else until
        while self.next_rung is not None and self.next_rung <= end:
            self.step_up()
        return dict(self.rung_losses)


def start(cfg: Any, recipe: Recipe, corpus: Corpus, device: str | torch.device | None = None,
          reference: Any = None, lr_factor: float = 1.0, init_state: dict[str, torch.Tensor] | None = None
          ) -> Climb:
    """A fresh climb at step 0 of a ``wsd`` recipe."""
    if recipe.schedule != "wsd":
        raise ValueError(f"recipe {recipe.name!r} has schedule {recipe.schedule!r}; rungs and forks need "
                         "schedule: wsd")
    dev = pick_device(device)
    check_compatible(cfg, recipe, corpus)
    with recipe_threads(recipe, dev):
        model = build(cfg, recipe, reference, init_state).to(dev)
    model.train()
    tr = make_trainer(model, recipe, corpus, dev, reference, lr_factor=lr_factor)
    evals = tuple(t.to(dev) for t in eval_batches(corpus, recipe))
    return Climb(tr, evals, lr_factor=lr_factor)  # type: ignore[arg-type]
