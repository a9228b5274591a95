"""What a promotion-ladder search spent, read from its study: how many trials went on at each rung, and
the compute in steps and in FLOPs as a multiple of N·T.

N·T is what the same search without the ladder would have spent: each of its N trials (those that ran:
`counts_toward_target`) trained to T, the recipe's steps, on each of its ``--repeats`` seeds. The
ladder's spend is every optimizer step a trial trained -- the stable run, every cooldown fork's decay,
every seed, the rate grid's discarded runs under ``--locate-lr`` (``lr_grid_steps``) and the steps an
earlier attempt trained and lost when its driver stopped (carried by the retry's ``trained_steps``).
FLOPs weigh each step by its candidate's analytic forward FLOPs per token (``npas.count``, in the
trial's accounting) times the tokens of a step; training's ~3x of the forward pass cancels in the
ratio. So ``0.25 N·T steps`` with ``0.40 N·T FLOPs`` says the trials that went on were the larger ones.

``record`` stores it on the study (user attr ``ladder_compute``) for `npas front`, the dashboard and
readers with plain Optuna; a search refreshes it after every finished trial. Pure reading otherwise:
no Ray, no training.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from npas.errors import NpasError
from npas.service.study.ladder import DEFAULT_ETA, Ladder
from npas.service.study.record import StudyAttr, TrialAttr
from npas.service.study.rungs import NOT_RESULTS, RETRIED, rung_losses
from npas.service.study.studies import counts_toward_target, status
from npas.training.recipe import Recipe

LADDER_COMPUTE_ATTR = "ladder_compute"  # study user attr: LadderCompute.to_dict(), written by `record`


@dataclass(frozen=True)
class LadderCompute:
    """How a ladder search moved its trials up and what it spent."""

    rungs: tuple[int, ...]
    eta: int
    went_on: tuple[tuple[int, int, int], ...]  # (rung, trials that went on from it, trials with a result there)
    trials: int  # N: the trials that ran
    top: int  # T: the recipe's steps
    steps: int  # optimizer steps trained (see the module docstring)
    flops: float  # forward FLOPs of those steps
    nt_steps: int  # N·T in steps: each of the N trials trained to T, every seed
    nt_flops: float  # N·T in forward FLOPs, each trial at its own FLOPs per token

    @property
    def steps_x(self) -> float:
        return self.steps / self.nt_steps if self.nt_steps else 0.0

    @property
    def flops_x(self) -> float:
        return self.flops / self.nt_flops if self.nt_flops else 0.0

    def line(self) -> str:
        """One line: ``ladder (rungs 12, 50, 200; eta 4): rung 12 -> 2 of 8 went on, rung 50 -> 1 of 2;
        compute 0.41 N·T steps, 0.44 N·T FLOPs (N = 8 trials, T = 200 steps)``."""
        moved = ", ".join(f"rung {r:,} -> {up} of {n}" + (" went on" if i == 0 else "")
                          for i, (r, up, n) in enumerate(self.went_on))
        return (f"ladder (rungs {', '.join(f'{r:,}' for r in self.rungs)}; eta {self.eta}): {moved}; compute "
                f"{self.steps_x:.2f} N·T steps, {self.flops_x:.2f} N·T FLOPs (N = {self.trials} trials, "
                f"T = {self.top:,} steps)")

    def to_dict(self) -> dict[str, Any]:
        return {"rungs": list(self.rungs), "eta": self.eta,
                "went_on": [{"rung": r, "went_on": up, "results": n} for r, up, n in self.went_on],
                "trials": self.trials, "top": self.top, "steps": self.steps, "flops": self.flops,
                "nt_steps": self.nt_steps, "nt_flops": self.nt_flops,
                "steps_x_nt": round(self.steps_x, 4), "flops_x_nt": round(self.flops_x, 4)}


def spent_steps(t: FrozenTrial) -> int:
    """Optimizer steps a trial's record accounts for: its own (``trained_steps``) and its rate grid's."""
    return int(t.user_attrs.get(TrialAttr.TRAINED_STEPS) or 0) + int(t.user_attrs.get(TrialAttr.LR_GRID_STEPS) or 0)


def _flops_per_token(t: FrozenTrial) -> float:
    return float((t.user_attrs.get(TrialAttr.ACCOUNTING) or {}).get("flops_per_token") or 0)


def _went_on(rungs: tuple[int, ...], eta: int, trials: Iterable[FrozenTrial]) -> tuple[tuple[int, int, int], ...]:
    losses, promoted = {}, {}
    for t in trials:
        if status(t) in NOT_RESULTS or not (got := rung_losses(t)):
            continue
        losses[t.number] = got
        promoted[t.number] = (t.user_attrs.get(TrialAttr.LADDER) or {}).get("promoted") or ()
    ladder = Ladder.rebuild(rungs, losses, eta, promoted=promoted)
    return tuple((r, up, n) for r, (up, n) in ladder.went_on().items())


def ladder_compute(study: optuna.Study, eta: int = DEFAULT_ETA) -> LadderCompute | None:
    """The study's ladder and its spend; None for a study that did not search under the ladder (a
    cosine recipe, ``--no-early-stop``, or a study without npas's recipe record: read from the
    attributes alone, so `npas front` shows any study)."""
    attrs = study.user_attrs
    stored = attrs.get(StudyAttr.RECIPE)
    if not (isinstance(stored, dict) and stored.get("schedule") == "wsd" and attrs.get(StudyAttr.EARLY_STOP, True)):
        return None
    try:
        recipe = Recipe.from_dict(dict(stored))
    except NpasError:  # a damaged record: nothing to read the rungs from
        return None
    trials = study.get_trials(deepcopy=False)
    ran = [t for t in trials if counts_toward_target(t) and status(t) not in RETRIED]
    rungs = tuple(recipe.fork_rungs())
    top, tokens, seeds = recipe.steps, recipe.tokens_per_step, max(1, int(attrs.get(StudyAttr.REPEATS) or 1))
    spent = [t for t in trials if status(t) not in RETRIED]
    return LadderCompute(
        rungs=rungs, eta=eta, went_on=_went_on(rungs, eta, ran), trials=len(ran), top=top,
        steps=sum(spent_steps(t) for t in spent),
        flops=float(sum(spent_steps(t) * tokens * _flops_per_token(t) for t in spent)),
        nt_steps=len(ran) * top * seeds, nt_flops=float(sum(top * seeds * tokens * _flops_per_token(t) for t in ran)))


def record(study: optuna.Study, eta: int = DEFAULT_ETA) -> LadderCompute | None:
    """Store ``ladder_compute`` on the study (a study that did not search under the ladder is left as it was)."""
    c = ladder_compute(study, eta)
    if c is not None:
        study.set_user_attr(LADDER_COMPUTE_ATTR, c.to_dict())
    return c
