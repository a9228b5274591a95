"""The promotion ladder as a Ray Tune scheduler: pause at a rung, resume the promoted from their checkpoint.

Ray Tune's ASHA stops the trials it does not promote, and a stopped trial never continues
(ray-project/ray#32634): a trial promoted late has to start again from step 0. This scheduler keeps
them instead. A trial reports at every rung (``tune.report`` with the rung in ``time_attr``, its loss
in ``metric``, and a checkpoint of its stable-phase state, ``npas.training.checkpoint``). Then
``on_trial_result`` asks ``npas.service.study.ladder.Ladder`` (whose module docstring states the rule):

  - promoted at this rung            -> CONTINUE: train on to the next rung, no checkpoint round trip;
  - the rung has promoted its cap    -> STOP: nothing can promote it any more;
  - not (yet) promoted               -> PAUSE: Tune keeps the checkpoint the trial just reported
                                        (a function trainable's save is its last reported result) and
                                        frees the worker;
  - at the top rung                  -> CONTINUE: the trainable ends by itself.

A result at a rung may promote other, *paused* trials (the rung's quota grew). ``choose_trial_to_run``
hands those back to Tune first, in the order they were promoted; Tune restarts them with their
checkpoint (``tune.get_checkpoint()`` in the trainable), so they resume at their rung's fork point and
no step is trained twice. Pending (new) trials come next. Paused trials at a rung that has reached
its cap are stopped there.

When nothing runs and nothing is pending, paused trials that were not promoted can only be promoted
by results that will never come. Once the searcher is finished, the lowest rung holding paused trials
is closed (``Ladder.close``: if it promoted nobody, its best paused trial goes on) and its other
paused trials are stopped; a rung above waits for what the closed rung sends up. While the searcher
is not finished, the worst-ranked paused trial at the lowest rung is stopped, one per call -- a
searcher that counts paused trials against a concurrency limit would else wait forever for a slot,
and that trial is the one least likely to be promoted. That only keeps the search moving: paused
trials that hold every slot starve the upper rungs (tests/service/test_ladder_scheduler.py,
max_concurrent_trials=2), so a search should limit *running* trials (Tune's resources, or a searcher
that does not count paused ones), not live ones. ``_supports_buffered_results`` is False (as Tune's
HyperBand): a buffered trial would train past a rung before the decision at that rung is made.

Only Tune's scheduler interface is used (``TrialScheduler``; the controller's ``get_trials``,
``search_alg`` and ``stop_trial`` that Tune hands schedulers); tests/service/test_ladder_scheduler.py
runs it under a real Tune run.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ray.tune.experiment import Trial
from ray.tune.schedulers import TrialScheduler

from npas.service.study.ladder import DEFAULT_ETA, Ladder, RungResult, rank

if TYPE_CHECKING:
    from ray.tune.execution.tune_controller import TuneController

log = logging.getLogger(__name__)


class LadderScheduler(TrialScheduler):
    """Asynchronous multi-objective promotion over ``rungs``, pausing instead of stopping.

    ``metric``/``mode``: the rung loss (default from ``TuneConfig``); ``objectives``: the study's other
    objectives as (result key, "min" | "max"); ``time_attr``: the result key holding the rung;
    ``target``: the search's trial target N, which caps each rung's promotions (None: no cap)."""

    _supports_buffered_results = False

    def __init__(self, rungs: Sequence[int], eta: int = DEFAULT_ETA, metric: str | None = None,
                 mode: str | None = None, objectives: Sequence[tuple[str, str]] = (), time_attr: str = "rung",
                 target: int | None = None) -> None:
        super().__init__()
        for key, m in ((metric, mode), *objectives):
            if m not in (None, "min", "max"):
                raise ValueError(f"mode of {key!r} must be 'min' or 'max', got {m!r}")
        self._metric, self._mode = metric, mode
        self.objectives = tuple(objectives)
        self.time_attr = time_attr
        self.ladder = Ladder(tuple(rungs), eta, target)
        self.to_resume: list[str] = []  # paused trials promoted since they paused, oldest first
        self.rung_of: dict[str, int] = {}  # trial id -> the last rung it reported
        self.finished: set[str] = set()

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        if (self._metric and metric) or (self._mode and mode):
            return False
        self._metric = self._metric or metric
        self._mode = self._mode or mode or "min"
        return True

    def _result(self, trial_id: str, result: dict) -> RungResult:
        sign = -1.0 if self._mode == "max" else 1.0
        objs = tuple((-1.0 if m == "max" else 1.0) * float(result[k]) for k, m in self.objectives)
        return RungResult(trial_id, sign * float(result[self._metric]), objs)

    def on_trial_add(self, tune_controller: TuneController, trial: Trial) -> None:
        if self._metric is None:
            raise ValueError("LadderScheduler needs a metric: pass metric= or TuneConfig(metric=..., mode=...)")

    def on_trial_result(self, tune_controller: TuneController, trial: Trial, result: dict) -> str:
        rung = result.get(self.time_attr)
        if rung not in self.ladder.rungs:
            return TrialScheduler.CONTINUE  # a progress report between rungs: nothing to decide
        tid = trial.trial_id
        self.rung_of[tid] = rung
        decision = self.ladder.report(rung, self._result(tid, result))
        for other in decision.promote:
            if other != tid and other not in self.to_resume:
                self.to_resume.append(other)  # paused at this rung, promoted now
        if rung == self.ladder.top or self.ladder.is_promoted(tid, rung):
            log.debug("trial %s at rung %s: continue (quota %d)", tid, rung, decision.quota)
            return TrialScheduler.CONTINUE
        if self.ladder.is_full(rung):
            log.debug("trial %s at rung %s: stop (the rung promoted its cap, %s)", tid, rung, decision.cap)
            return TrialScheduler.STOP
        log.debug("trial %s at rung %s: pause (quota %d)", tid, rung, decision.quota)
        return TrialScheduler.PAUSE

    def on_trial_complete(self, tune_controller: TuneController, trial: Trial, result: dict) -> None:
        self.finished.add(trial.trial_id)

    def on_trial_error(self, tune_controller: TuneController, trial: Trial) -> None:
        self.finished.add(trial.trial_id)

    def on_trial_remove(self, tune_controller: TuneController, trial: Trial) -> None:
        self.finished.add(trial.trial_id)
        if trial.trial_id in self.to_resume:
            self.to_resume.remove(trial.trial_id)

    def choose_trial_to_run(self, tune_controller: TuneController) -> Trial | None:
        self._stop_at_full_rungs(tune_controller)
        if (trial := self._next_promoted(tune_controller)) is not None:
            return trial
        trials = tune_controller.get_trials()
        for t in trials:
            if t.status == Trial.PENDING:
                return t
        if not any(t.status in (Trial.RUNNING, Trial.PENDING) for t in trials):
            self._stop_stranded(tune_controller, [t for t in trials if t.status == Trial.PAUSED])
            return self._next_promoted(tune_controller)  # a closed rung's promotion
        return None

    def _next_promoted(self, tune_controller: TuneController) -> Trial | None:
        """The paused trial promoted longest ago, dropping those no longer paused."""
        by_id = {t.trial_id: t for t in tune_controller.get_trials()}
        for tid in list(self.to_resume):
            t = by_id.get(tid)
            if t is None or t.status in (Trial.TERMINATED, Trial.ERROR):
                self.to_resume.remove(tid)
            elif t.status == Trial.PAUSED:
                self.to_resume.remove(tid)
                log.debug("resuming promoted trial %s from rung %s", tid, self.rung_of.get(tid))
                return t
        return None

    def _stop_at_full_rungs(self, tune_controller: TuneController) -> None:
        """Stop the paused trials of rungs that have promoted their cap: nothing can promote them."""
        for t in tune_controller.get_trials():
            rung = self.rung_of.get(t.trial_id)
            if (t.status == Trial.PAUSED and t.trial_id not in self.to_resume and rung is not None
                    and rung != self.ladder.top and self.ladder.is_full(rung)):
                log.debug("stopping trial %s at rung %s: the rung promoted its cap", t.trial_id, rung)
                tune_controller.stop_trial(t)

    def _stop_stranded(self, tune_controller: TuneController, paused: list[Trial]) -> None:
        """Nothing runs: close the lowest rung, or stop its worst paused trial (see the docstring)."""
        paused = [t for t in paused if t.trial_id not in self.to_resume]
        if not paused:
            return
        low = min(self.rung_of.get(t.trial_id, 0) for t in paused)
        here = {t.trial_id: t for t in paused if self.rung_of.get(t.trial_id, 0) == low}
        if tune_controller.search_alg.is_finished():
            closed = self.ladder.close(low, here) if low in self.ladder.rungs else None
            for tid, t in here.items():
                if closed is not None and tid in closed.promote:
                    log.debug("rung %s closed: promoting its best waiting trial %s", low, tid)
                    self.to_resume.append(tid)
                else:
                    log.debug("stopping trial %s at rung %s: not promoted", tid, low)
                    tune_controller.stop_trial(t)
            return
        order = [r.trial for r in rank(self.ladder.results.get(low, [])) if r.trial in here]
        worst = here[order[-1]] if order else next(iter(here.values()))
        tune_controller.stop_trial(worst)

    def debug_string(self) -> str:
        parts = []
        for r in self.ladder.rungs:
            n = len(self.ladder.results.get(r, []))
            parts.append(f"rung {r}: {n} reported, {len(self.ladder.promoted.get(r, []))} promoted")
        return "Ladder (eta={}): {}".format(self.ladder.eta, "; ".join(parts))

    def rung_losses(self, trial_id: str) -> dict[int, float]:
        """The trial's loss at every rung it reported, as the metric was reported (mode applied back)."""
        sign = -1.0 if self._mode == "max" else 1.0
        out = {}
        for rung, results in self.ladder.results.items():
            for r in results:
                if r.trial == trial_id:
                    out[rung] = sign * r.loss if math.isfinite(r.loss) else r.loss
        return dict(sorted(out.items()))
