"""Telling the study what became of each trial: skipped before it ran, failed, stopped or finished.

This is the bookkeeping beside Tune's `Searcher` protocol (`npas.service.search.searcher`): the
searcher decides *when* a trial is told, the recorder *what* is written (its status, reason, curve,
seeds, rungs, fidelity and objective values) and keeps the progress line's counts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import optuna
from optuna.trial import TrialState

from npas.service.execution.outcome import (
    fidelity_constraint,
    objective_values,
    rung_attrs,
    rung_losses_attr,
    seed_attrs,
)
from npas.service.search.progress import Progress
from npas.service.study.record import Constraint, TrialAttr
from npas.service.study.tally import StudyTally

# What a trial stopped below the recipe's length (ASHA's stop, or the ladder's stop at a lower rung) is
# told, as the sampler sees it. "constraint" (the default): COMPLETE with its last loss and a violated
# `fidelity` constraint, so TPE models it as infeasible: its region is learnt as worse than any trial at
# T, without its shorter-run loss being compared with losses at T. "fail": FAIL, ignored by every
# sampler (and not counted toward the target). "plain": COMPLETE with its last loss as if at T (a
# pessimistic loss: shorter runs end higher). While a search runs, a paused trial is RUNNING, so what it
# is told matters only to a later driver extending the study. The default is "constraint": no shorter
# run's loss is ever read as a loss at T, and the sampler still learns that the region did not make the
# cut; the others stay selectable so the choice can be compared (docs/results/ladder.md).
STOPPED_AS = ("constraint", "fail", "plain")


class TrialRecorder:
    """Writes each trial's outcome into the study and counts it for the progress line."""

    def __init__(self, study: optuna.Study, objectives: list[str], recipe: dict, tally: StudyTally,
                 progress: Progress, learn_infeasible: bool, tokens_per_byte: float | None,
                 on_progress: Callable[[Progress], None] | None) -> None:
        self.study, self.objectives, self.recipe = study, objectives, recipe
        self.tally, self.progress = tally, progress
        self.learn_infeasible = learn_infeasible  # tell infeasible asks COMPLETE with a violated `fit`, or FAIL
        self.tokens_per_byte = tokens_per_byte  # of the validation windows: turns any loss into bits per byte
        self.on_progress = on_progress
        self.accounting: dict[int, dict] = {}  # of trials handed to a worker: their memory and size objectives
        self.fresh = False  # the tally was refreshed after the last tell
        # what the sampler is told of a trial stopped below the recipe's length (`STOPPED_AS`); the search
        # uses the default; the others are there to be compared
        self.stopped_as = "constraint"

    def skip(self, trial: optuna.Trial, status: str, reason: str) -> None:
        trial.set_user_attr(TrialAttr.STATUS, status)
        trial.set_user_attr(TrialAttr.REASON, reason)
        if status == "infeasible" and self.learn_infeasible:
            # Optuna's samplers ignore FAIL trials, so TPE kept proposing from infeasible corners. A COMPLETE
            # trial with a violated constraint is what TPE models as infeasible; its values are the worst
            # possible and never read: it is not evaluated (`study.was_evaluated`), so it never counts toward
            # the target, never reaches the front (Optuna's best_trials drop violated constraints) or a pick.
            trial.set_constraint(Constraint.FIT, 1.0)
            worst = [math.inf if d == optuna.study.StudyDirection.MINIMIZE else -math.inf
                     for d in self.study.directions]
            self.study.tell(trial, worst)
        else:
            self.study.tell(trial, state=TrialState.FAIL)
        self.emit()

    def duplicate(self, trial: optuna.Trial, twin: int, reason: str) -> None:
        self.progress.duplicates += 1
        trial.set_user_attr(TrialAttr.SAME_AS, twin)
        self.skip(trial, "duplicate", reason)

    def fail(self, trial: optuna.Trial, reason: str) -> None:
        self.progress.failed += 1
        self.accounting.pop(trial.number, None)
        trial.set_user_attr(TrialAttr.STATUS, "failed")
        trial.set_user_attr(TrialAttr.REASON, reason[:2000])
        self.study.tell(trial, state=TrialState.FAIL)

    def curve(self, trial: optuna.Trial, curve: list[list[float]], retries: int | None) -> None:
        """What Tune reported along the way, kept whatever the outcome."""
        trial.set_user_attr(TrialAttr.CURVE, curve)
        if self.recipe.get("schedule") == "wsd" and curve:  # a wsd trial reports its rungs' finished losses:
            trial.set_user_attr(TrialAttr.RUNG_LOSSES, rung_losses_attr(curve))  # kept even if ASHA stops it
        if retries:
            trial.set_user_attr(TrialAttr.RETRIES, retries)

    def finish(self, trial: optuna.Trial, result: dict[str, Any]) -> None:
        proxy = json.loads(result["proxy"]) if isinstance(result.get("proxy"), str) else None
        steps = int(result.get("step", 0))
        max_steps = int(self.recipe["steps"])
        if proxy is not None and proxy.get("status") == "failed":
            trial.set_user_attr(TrialAttr.PROXY, proxy)
            if proxy.get("steps_trained") is not None:  # the ladder: what it trained before it failed
                trial.set_user_attr(TrialAttr.TRAINED_STEPS, int(proxy["steps_trained"]))
            self.fail(trial, proxy.get("failure_reason") or "proxy run failed")
            return
        loss = proxy.get("val_loss") if proxy else result.get("val_loss")
        if loss is None or not math.isfinite(loss):
            self.fail(trial, f"non-finite validation loss at step {steps}")
            return
        if proxy is not None:
            proxy, per_seed = seed_attrs(proxy)  # the seeds and their losses (`--repeats`) get their own keys
            proxy, rungs = rung_attrs(proxy)  # and a wsd run's finished loss at every rung
            for attr, value in {**per_seed, **rungs}.items():
                trial.set_user_attr(attr, value)
            if proxy.get("steps_trained") is not None:  # wsd: top rung + forks, every seed's (+ steps lost)
                trial.set_user_attr(TrialAttr.TRAINED_STEPS, int(proxy["steps_trained"]))
            if proxy.get("lost_steps"):  # the ladder: trained by earlier attempts past their checkpoint
                trial.set_user_attr(TrialAttr.LOST_STEPS, int(proxy["lost_steps"]))
            for attr in (TrialAttr.LR_FACTOR, TrialAttr.LR_GRID_STEPS):  # --locate-lr: the factor and its cost
                if proxy.get(attr) is not None:
                    trial.set_user_attr(attr, proxy[attr])
            if rungs.get(TrialAttr.RUNG_LOSSES):
                trial.set_user_attr(TrialAttr.TOP_RUNG, max(int(t) for t in rungs[TrialAttr.RUNG_LOSSES]))
            trial.set_user_attr(TrialAttr.PROXY, proxy)
            trial.set_user_attr(TrialAttr.NODE, result.get("node"))
            if proxy.get("curve"):  # the worker's own record includes the last evaluation
                trial.set_user_attr(TrialAttr.CURVE, proxy["curve"])
            steps = int(proxy.get("steps_done", steps))
        self.tally.refresh()
        twin = self.tally.twin(trial.user_attrs.get(TrialAttr.KEY), trial.number, running=False)
        if twin is not None:  # another driver ran the same candidate concurrently: keep one result
            self.accounting.pop(trial.number, None)
            self.duplicate(trial, twin, f"ran concurrently with trial {twin}, whose result is kept")
            return
        values = objective_values(self.objectives, self.accounting.get(trial.number, {}), proxy, loss,
                                  self.tokens_per_byte)
        full = steps >= max_steps
        trial.set_user_attr(TrialAttr.FIDELITY, steps)
        trial.set_user_attr(TrialAttr.STATUS, "ok" if full else "stopped")
        if not full and self.stopped_as == "fail":
            self.study.tell(trial, state=TrialState.FAIL)
        else:
            trial.set_constraint(Constraint.FIDELITY, 0.0 if self.stopped_as == "plain"
                                 else fidelity_constraint(steps, max_steps))
            self.study.tell(trial, values)
        self.accounting.pop(trial.number, None)
        if full:
            self.progress.done += 1
            self.progress.best_loss = min(self.progress.best_loss, loss)
        else:
            self.progress.stopped += 1

    def emit(self, refresh_front: bool = False) -> None:
        if refresh_front:  # after a trial finished; a skipped ask changes neither the front nor the count
            self.tally.refresh()
            self.fresh = True
            self.progress.front_size = self.tally.front_size
        self.progress.study_counted = self.tally.counted
        if self.on_progress is not None:
            self.on_progress(self.progress)
