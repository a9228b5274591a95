"""A learning rate located per candidate at a quarter of the run: a factor of the recipe's fair rate.

The fair parameterization keeps learning-rate optima close across allocations but not close enough
to rank them (at the proxy recipe one allocation gains 0.091 nats from x1 to x2 while
another is best at x1, more than twice the long-run spread of the candidates it must order). A
search that trains every candidate at one rate ranks rates as much as allocations. So each
candidate's stable-phase rate is chosen from a multiplicative grid around its fair rate (default
x0.5, x1, x2, x4): one WSD run per factor, each trained to the *locating rung* (``locate_rung``) and
scored there by its cooldown fork; the factor with the lowest loss wins. The grid is walked upwards,
and stops going up once a factor is clearly past the optimum (``next_factor``). An optimum at an edge
of the grid is not located, so the grid then extends one x2 step past that edge and tries again, at
most ``MAX_EXTENSIONS`` times (an optimum still at the edge after that is reported as such:
``Located.at_edge``).

Why a quarter of the run and not the first rung: the first version chose at the first rung (T/16,
where runs are cheapest), and on the frozen fidelity candidates the
factor chosen there was not the best at T on either of the first two held out; at T/16 the runs are
barely past warmup, the factors differ by less than run noise, and the lower rate wins where the
higher one wins at T. Scored at T/4, those two held runs' forks already ordered their rates as T did
(the T/4 rule's own check at T: docs/results/located-rate.md).

What it costs. Each located trial trains 2 to 6 runs to the locating rung (the grid's runs up to the
first clearly worse factor, and at most ``MAX_EXTENSIONS`` past an edge); all but the winner are the
grid's cost, 1 to 5 x T/4 steps. Only the trials that reach the locating rung pay it: under the
ladder's default rungs (T/16, T/4, T) that is the trials promoted from the first rung, at most
floor(N / eta) of a search's N (``npas.service.study.ladder``), so the grid adds at most
5/4 x T x N/eta steps, 0.31 N·T at eta = 4 (0.06 to 0.19 N·T for the usual 2 to 4 runs). Where the
locating rung is the first rung (a ladder whose second rung is above T/4), every trial locates.

The factor multiplies every parameter group's fair rate, warmup and floor included
(``npas.training.trainer.Trainer.lr_factor``): the fair rules between groups stay as they are and only the
candidate's overall rate moves. The winning run is not retrained: its climb, paused at the locating
rung, *is* the trial's run and goes on up the ladder, so its steps are the trial's ``trained_steps``;
the other grid runs' steps (the trial's own climb at x1 included, when another factor wins) are
counted apart as ``lr_grid_steps`` (and in the ladder's compute).

``next_factor`` is the rule alone (pure, on the losses seen so far); ``locate`` runs it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from npas.training import climb as _climb
from npas.training.data import Corpus
from npas.training.recipe import Recipe

DEFAULT_GRID = (0.5, 1.0, 2.0, 4.0)  # factors of the fair rate tried at the locating rung
LOCATE_AT = 0.25  # the grid is scored at the highest rung at or below this fraction of the run
STEP = 2.0  # an extension moves one x2 step past the edge
MAX_EXTENSIONS = 2
# nats: a factor whose loss at the locating rung is this much above the best so far is past the optimum, beyond run
# noise (twice the noise of a difference of two runs: 2 x sqrt(2) x 0.010, the long-run seed standard
# error of the frozen fidelity candidates); the grid's larger factors are then not trained
CLEARLY_WORSE = 0.028


def locate_rung(recipe: Recipe) -> int:
    """The rung whose cooldown fork scores the grid: the highest rung below the top at or below
    ``LOCATE_AT`` of the run (T/4 on the default ladder's T/16, T/4, T), else the first rung."""
    rungs = recipe.fork_rungs()
    return max((r for r in rungs[:-1] if r <= recipe.steps * LOCATE_AT), default=rungs[0])


def best_factor(losses: Mapping[float, float]) -> float:
    """The factor with the lowest loss; a non-finite loss (a diverged run) counts as +inf, and equal
    losses go to the factor nearest x1 (then the lower one): never move the rate for nothing."""
    if not losses:
        raise ValueError("no factor has been tried")
    return min(losses, key=lambda f: (losses[f] if math.isfinite(losses[f]) else math.inf,
                                      abs(math.log(f)), f))


def next_factor(losses: Mapping[float, float], grid: Sequence[float] = DEFAULT_GRID, step: float = STEP,
                max_extensions: int = MAX_EXTENSIONS) -> float | None:
    """The next factor to train to the locating rung, or None when the rate is located. First the grid's untried
    factors in order, except those above a factor that diverged or ended ``CLEARLY_WORSE`` than the
    best so far (the loss is unimodal in log-rate: the optimum is below it, and a larger rate only
    costs a run); then, while the best is at an edge of what was tried and fewer than
    ``max_extensions`` factors beyond the grid were tried, one ``step`` past that edge."""
    ceiling = math.inf  # the grid's factors from here up are past the optimum
    if losses:
        top = best_factor(losses)
        ceiling = min((f for f, v in losses.items()
                       if f > top and (not math.isfinite(v) or v > losses[top] + CLEARLY_WORSE)), default=math.inf)
    untried = [f for f in grid if f not in losses and f < ceiling]
    if untried:
        return untried[0]
    extensions = sum(1 for f in losses if f not in grid)
    if extensions >= max_extensions or len(losses) < 2:
        return None
    best, low, high = best_factor(losses), min(losses), max(losses)
    if best == high:
        return high * step
    if best == low:
        return low / step
    return None


@dataclass(frozen=True)
class Located:
    """The outcome of the rate search for one candidate."""

    factor: float  # the chosen factor of the fair rate: the trial's lr_factor
    losses: dict[float, float]  # loss at the locating rung of every factor tried, in the order tried
    at_edge: bool  # the best is still at an edge after every extension: not located, only bounded
    lr_grid_steps: int  # steps trained by the grid's runs that were not kept
    rung: int = 0  # the locating rung the losses were scored at (0: not said: ``search`` alone)

    def to_dict(self) -> dict[str, Any]:
        return {"lr_factor": self.factor, "lr_grid": {repr(f): (v if math.isfinite(v) else None)
                                                      for f, v in self.losses.items()},
                "lr_at_edge": self.at_edge, "lr_grid_steps": self.lr_grid_steps, "lr_rung": self.rung}


def search(try_factor: Callable[[float], tuple[float, int]], grid: Sequence[float] = DEFAULT_GRID,
           step: float = STEP, max_extensions: int = MAX_EXTENSIONS) -> Located:
    """Run the rule with ``try_factor(f) -> (loss at the locating rung, steps trained)``; the chosen factor's steps are
    left out of ``lr_grid_steps`` (they are the trial's own)."""
    losses: dict[float, float] = {}
    cost: dict[float, int] = {}
    while (f := next_factor(losses, grid, step, max_extensions)) is not None:
        losses[f], cost[f] = try_factor(f)
    best = best_factor(losses)
    edge = best in (min(losses), max(losses)) and len(losses) > 1
    return Located(best, losses, edge, sum(c for g, c in cost.items() if g != best))


def locate(cfg: Any, recipe: Recipe, corpus: Corpus, device: Any = None, reference: Any = None,
           grid: Sequence[float] = DEFAULT_GRID, step: float = STEP,
           max_extensions: int = MAX_EXTENSIONS, init_state: Any = None, rung: int | None = None,
           fair: _climb.Climb | None = None,
           on_progress: Callable[[_climb.Climb], None] | None = None) -> tuple[_climb.Climb, Located]:
    """Train one WSD run per factor to ``rung`` (default ``locate_rung``; its cooldown fork) and keep the
    best run: the returned climb is the trial's own run, paused at that rung at the located factor,
    ready to go on. ``fair``: the trial's climb at x1 so far (below the rung), which is the grid's x1
    run instead of a fresh one. ``init_state``: every fresh run starts from it (``--init-from``).
    ``on_progress``: each fresh run's ``Climb.on_progress`` (the fair one keeps its own)."""
    target = locate_rung(recipe) if rung is None else rung
    if target not in recipe.fork_rungs():
        raise ValueError(f"rung {target} is not one of the recipe's rungs {list(recipe.fork_rungs())}")
    if fair is not None and (fair.lr_factor != 1.0 or fair.top >= target):
        raise ValueError(f"the fair climb must run at x1 below rung {target} (x{fair.lr_factor:g} at {fair.top})")
    kept: dict[str, Any] = {}  # the best run so far and its loss: one model in memory beside the current

    def try_factor(f: float) -> tuple[float, int]:
        if f == 1.0 and fair is not None:
            c = fair
        else:
            c = _climb.start(cfg, recipe, corpus, device, reference, lr_factor=f, init_state=init_state)
            c.on_progress = on_progress
        c.climb(until=target)
        loss = c.rung_losses.get(target, math.nan) if c.failed is None else math.nan
        if not kept or best_factor({f: loss, kept["run"].lr_factor: kept["loss"]}) == f:
            kept.update(run=c, loss=loss)  # best_factor's order is total: the pairwise best is the best
        return loss, c.trained_steps

    located = search(try_factor, grid, step, max_extensions)
    return kept["run"], dataclasses.replace(located, rung=target)
