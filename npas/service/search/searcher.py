"""A Ray Tune `Searcher` that asks and tells an Optuna study directly.

Why not Ray's `OptunaSearch`: it names every study "optuna", ignores constraints, drops intermediate
values in multi-objective runs and never prunes. This module is Tune's protocol and little else:
what each trial's tell writes lives in `recorder`, candidate preparation (infeasible and duplicate
asks, told at once, never reach a worker) in `admission`, heartbeats and orphan recovery in `faults`,
the sampler swap in `samplers`. The runner reports what the protocol does not carry (a failed
trial's error text, restarts after a lost node) through `record_error` / `record_retry`.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable

import optuna
from optuna.trial import TrialState

os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # before Tune loads: npas prints its own progress line
from ray.tune.search import Searcher  # noqa: E402

from npas.allocation.bounds import SKIPS_BEFORE_EXHAUSTED  # noqa: E402
from npas.allocation.space import Space  # noqa: E402
from npas.service.search.admission import Skip, objective_config, prepare  # noqa: E402
from npas.service.search.progress import Progress  # noqa: E402
from npas.service.search.recorder import TrialRecorder  # noqa: E402
from npas.service.search.samplers import learns_from_infeasible, random_when_stuck  # noqa: E402
from npas.service.study import (  # noqa: E402
    compute,
    faults,  # noqa: E402
    rungs,
)
from npas.service.study import optuna_adapter as adapter  # noqa: E402
from npas.service.study.record import TrialAttr  # noqa: E402
from npas.service.study.studies import is_full_fidelity, status, was_evaluated  # noqa: E402
from npas.service.study.tally import StudyTally  # noqa: E402

log = logging.getLogger(__name__)

MAX_SKIPPED_IN_A_ROW = SKIPS_BEFORE_EXHAUSTED  # infeasible or duplicate asks before the space is called exhausted


class NpasSearcher(Searcher):
    """Optuna ask/tell behind Ray Tune's Searcher protocol (suggest / on_trial_result / complete)."""

    def __init__(self, study: optuna.Study, space: Space, recipe: dict, fingerprint: str, target: int,
                 on_progress: Callable[[Progress], None] | None = None,
                 on_trial_done: Callable[[optuna.Study], None] | None = None,
                 tokens_per_byte: float | None = None, learn_infeasible: bool | None = None) -> None:
        super().__init__(metric="val_loss", mode="min")
        self.study, self.space, self.recipe, self.fingerprint = study, space, recipe, fingerprint
        self.target = target
        self.objectives = list(space.objectives)
        self.progress = Progress(target=target)
        self.tally = StudyTally(study)  # study-wide counts, keys and front, read incrementally
        self.learn_infeasible = learns_from_infeasible(study.sampler) if learn_infeasible is None else learn_infeasible
        self.recorder = TrialRecorder(study, self.objectives, recipe, self.tally, self.progress,
                                      self.learn_infeasible, tokens_per_byte, on_progress)
        self.on_trial_done = on_trial_done
        self.error: str | None = None  # set when the search must stop (space exhausted)
        self.finished = False  # set when suggest said FINISHED: the only way a run ends without an interrupt
        self._live: dict[str, optuna.Trial] = {}
        self._curves: dict[str, list[list[float]]] = {}
        self._errors: dict[str, str] = {}
        self._retries: dict[str, int] = {}
        self._skipped = 0
        self._lock = threading.Lock()
        # the ladder (SearchPlan.fidelity == "ladder"): the objectives its trials report at every rung, and
        # each live trial's last rung result -- a trial stopped while paused is told with it (Tune hands
        # the searcher no result for a trial it stops in PAUSED)
        self.ladder_objectives: list[str] | None = None
        self.admits: Callable[[set[str]], bool] | None = None  # the ladder's cap on running trials
        self._last: dict[str, dict] = {}
        self._count_earlier()
        self._checkpointed: dict[str, str] = {}  # live trial -> the checkpoint path recorded on it
        self._dirs: dict[str, str] = {}  # live ladder trial -> its directory in the run's storage, recorded on it
        self._steps: dict[str, int] = {}  # live ladder trial -> the steps it reported trained so far
        self._own: set[int] = set()  # numbers of every trial this driver handed to a worker

    def _count_earlier(self) -> None:
        """Start the progress line from the study's finished trials (a resume or a joining driver)."""
        done = stopped = failed = 0
        best = math.inf
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
            if is_full_fidelity(t):
                done += 1
                loss = (t.user_attrs.get(TrialAttr.PROXY) or {}).get("val_loss")
                best = min(best, float(loss)) if isinstance(loss, int | float) else best
            elif was_evaluated(t):
                stopped += 1
            elif status(t) == "failed":
                failed += 1
        self.tally.refresh()
        self.progress.start_from(done, stopped, failed, best, self.tally.front_size, self.tally.counted)

    # ---- what the runner tells the searcher, and asks of it ------------------------------------
    def record_error(self, trial_id: str, message: str) -> None:
        """The error text of a failed Tune trial (the protocol's on_trial_complete gets only a flag)."""
        self._errors[trial_id] = message

    def record_retry(self, trial_id: str) -> None:
        """Tune restarted the trial after its worker or node died (FailureConfig)."""
        self._retries[trial_id] = self._retries.get(trial_id, 0) + 1

    def record_checkpoint(self, trial_id: str, path: str) -> None:
        """A live trial's last climb checkpoint, kept on its Optuna trial: a driver stopped while the trial
        is paused re-enqueues it with this path, and the next driver resumes it from there."""
        with self._lock:
            trial = self._live.get(trial_id)
        if trial is not None:
            trial.set_user_attr(TrialAttr.LADDER_CHECKPOINT, path)
            self._checkpointed[trial_id] = path

    def record_trial_dir(self, trial_id: str, where: str) -> None:
        """A live ladder trial's directory in the run's storage, recorded as it starts (before it can
        write a checkpoint): a retry looks there for the newest one, the clean-up for every one."""
        with self._lock:
            trial = self._live.get(trial_id)
        if trial is not None and self._dirs.get(trial_id) != where:
            trial.set_user_attr(TrialAttr.LADDER_DIR, where)
            self._dirs[trial_id] = where

    def recorded_checkpoints(self) -> set[str]:
        """The checkpoint paths and trial directories recorded on live trials (what a re-enqueued trial
        resumes from)."""
        return set(self._checkpointed.values()) | set(self._dirs.values())

    def live_trial(self, trial_id: str) -> optuna.Trial | None:
        """The Optuna trial of a Tune trial running (or paused) for this driver."""
        with self._lock:
            return self._live.get(trial_id)

    def own_numbers(self) -> set[int]:
        """Numbers of the trials this driver ran or runs: the ladder's exchange reads everyone else's."""
        with self._lock:
            return set(self._own)

    def set_paused(self, n: int) -> None:
        """The ladder paused or resumed a trial: ``n`` of the running ones now wait at a rung."""
        self.progress.paused = n
        self.recorder.emit()

    def live_trial_ids(self) -> list[int]:
        """Storage ids of the trials running for this driver (what the heartbeat beats for)."""
        with self._lock:
            return [adapter.trial_id(t) for t in self._live.values()]

    @property
    def has_live(self) -> bool:
        with self._lock:
            return bool(self._live)

    def accounting_of(self, number: int) -> dict:
        """The accounting of a trial handed to a worker (its memory and size objectives)."""
        return self.recorder.accounting[number]

    # ---- Tune's checkpointing: the database is the state ----------------------------------------
    def save(self, checkpoint_path: str) -> None:
        """Nothing to save: every ask and tell is already in the study's database."""

    def restore(self, checkpoint_path: str) -> None:
        """Nothing to restore: `npas resume` rebuilds the run from the database."""

    def __getstate__(self) -> dict:
        """Tune pickles its search algorithm into the (scratch) experiment directory. The study and
        its engine cannot travel and need not: the database is the state."""
        return {"target": self.target, "objectives": self.objectives}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._live = {}
        self._lock = threading.Lock()

    # ---- Searcher protocol ---------------------------------------------------------------------
    def suggest(self, trial_id: str) -> dict | None:
        if self.admits is not None and not self.finished:
            with self._lock:
                live = set(self._live)
            if not self.admits(live):
                return None  # every worker is taken (paused trials hold none): Tune asks again later
        config = self._suggest(trial_id)
        if config is Searcher.FINISHED:
            self.finished = True
        return config

    def _suggest(self, trial_id: str) -> dict | None:
        while True:
            if self.error is not None:
                return Searcher.FINISHED
            if not self.recorder.fresh:  # refreshed as the last trial was told, a moment ago: nothing changed
                self.tally.refresh()
            self.recorder.fresh = False
            if self.tally.counted >= self.target:  # a cheap early stop; the check after the ask is the exact one
                return Searcher.FINISHED
            with random_when_stuck(self.study, self._skipped, seed=self.tally.seen):
                trial = self.study.ask()
                # claim it at once: a driver killed from here on leaves a trial that resume can attribute
                faults.claim(self.study, trial)
                self.tally.refresh()
                if self.tally.counted_before(trial.number) >= self.target:  # another driver got there first
                    self.recorder.skip(trial, "surplus", "the study reached its target while this trial was asked")
                    return Searcher.FINISHED
                config = self._prepare(trial)
            if config is not None:
                with self._lock:
                    self._live[trial_id] = trial
                    self._own.add(trial.number)
                self.progress.running += 1
                self.recorder.emit()
                return config
            self._skipped += 1
            if self._skipped >= MAX_SKIPPED_IN_A_ROW:
                self.error = (f"{self._skipped} candidates in a row were infeasible or already evaluated at "
                              f"budget {self.space.budget_params:,}; raise the budget or widen the space")
                return Searcher.FINISHED

    def _prepare(self, trial: optuna.Trial) -> dict | None:
        """The worker's config, or None once the trial was told why it must not run."""
        prepared = prepare(trial, self.space, self.recipe, self.fingerprint, twin_of=self._twin)
        if isinstance(prepared, Skip):
            if prepared.status == "duplicate":
                self.recorder.duplicate(trial, prepared.same_as, prepared.reason)
                return None
            if prepared.status == "sample_error":
                self.progress.failed += 1
            else:
                self.progress.infeasible += 1
            self.recorder.skip(trial, prepared.status, prepared.reason)
            return None
        self._skipped = 0
        self.recorder.accounting[trial.number] = prepared.accounting
        if self.ladder_objectives is not None:  # what the ladder ranks on beside the rung loss
            prepared.config["ladder_objectives"] = objective_config(self.ladder_objectives, prepared.accounting)
        return prepared.config

    def _twin(self, key: str, number: int) -> int | None:
        """A trial with the same key that ran or runs, read just before this one would start: other
        drivers' keys appear as their candidates are fitted, after this trial's ask."""
        self.tally.refresh()
        return self.tally.twin(key, number)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if not result.get("final") and math.isfinite(result.get("val_loss", math.inf)):
            self._curves.setdefault(trial_id, []).append([int(result["step"]), float(result["val_loss"])])
        if "rung" in result and "proxy" in result:  # a ladder trial's record at the rung it reached
            self._last[trial_id] = result
        if (steps := result.get("trained_steps")) is not None and self._steps.get(trial_id) != steps:
            # a ladder trial's steps so far, at each rung and between them: what a driver that dies now
            # leaves on record for the retry to count (climber.PROGRESS_EVERY_S)
            with self._lock:
                trial = self._live.get(trial_id)
            if trial is not None:
                trial.set_user_attr(TrialAttr.TRAINED_STEPS, int(steps))
                self._steps[trial_id] = steps

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        with self._lock:
            trial = self._live.pop(trial_id, None)
        last = self._last.pop(trial_id, None)
        if trial is None:
            return
        if not error and (not result or "proxy" not in result) and last is not None:
            result = last  # stopped while paused at a rung (or between reports): its last rung's report
        if trial_id in self._checkpointed:  # removed as the trial stops: nothing left to resume from
            del self._checkpointed[trial_id]
            trial.set_user_attr(TrialAttr.LADDER_CHECKPOINT, None)
        self._dirs.pop(trial_id, None)  # kept on the trial: the clean-up at the search's end looks there
        self._steps.pop(trial_id, None)
        self.progress.running -= 1
        self.recorder.curve(trial, self._curves.pop(trial_id, []), self._retries.pop(trial_id, None))
        if error or not result:
            self.recorder.fail(trial, self._errors.pop(trial_id, "worker error: the trial raised or its worker died"))
        else:
            try:
                self.recorder.finish(trial, result)
            except Exception as e:  # a result npas cannot record must end the trial, not leave it RUNNING
                log.warning("recording trial %d failed: %s", trial.number, e)
                self.recorder.fail(trial, f"its result could not be recorded: {type(e).__name__}: {e}")
        self.recorder.emit(refresh_front=True)
        if self.ladder_objectives is not None:  # the rung-to-rung certificate and the spend, for every caller
            try:
                rungs.record(self.study)
                compute.record(self.study)
            except Exception as e:  # a summary that fails to compute must never stop a search
                log.warning("rung agreement or ladder compute not recorded: %s", e)
        if self.on_trial_done is not None:
            try:
                self.on_trial_done(self.study)
            except Exception as e:  # a report that fails to render must never stop a search
                log.warning("trial-done hook failed: %s", e)

    def abandon_live(self, status: str, reason: str) -> list[int]:
        """Fail every trial still running here (interrupt), re-enqueueing each with its exact params."""
        with self._lock:
            live, self._live = list(self._live.values()), {}
        numbers = []
        for trial in live:
            frozen = adapter.storage_of(self.study).get_trial(adapter.trial_id(trial))
            self.recorder.skip(trial, status, reason)
            faults.requeue(self.study, frozen)
            numbers.append(trial.number)
        return numbers
