"""A Ray Tune `Searcher` that asks and tells an Optuna study directly.

Why not Ray's `OptunaSearch`: it names every study "optuna", ignores constraints, drops
intermediate values in multi-objective runs and never prunes. This searcher keeps the bookkeeping
npas needs: infeasible candidates are told at once and never reach a worker, the budget and the
reached fidelity become Optuna constraints, duplicates of a finished trial are not run twice, and
only this driver process writes to the database.

It is the Tune protocol and nothing else. The runner reports what Tune's protocol does not carry
(a failed trial's error text, restarts after a lost node) through `record_error`/`record_retry`;
candidate preparation lives in `npas.service.search.candidate`, heartbeats and orphan recovery in
`npas.service.search.faults`, objective values in `npas.service.search.outcome`, the sampler swap in
`npas.service.search.samplers`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
from collections.abc import Callable

import optuna
from optuna.trial import TrialState

os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # before Tune loads: npas prints its own progress line
from ray.tune.search import Searcher  # noqa: E402

from npas.allocation.space import Space  # noqa: E402
from npas.service.search import faults  # noqa: E402
from npas.service.search.candidate import Skip, prepare  # noqa: E402
from npas.service.search.outcome import (  # noqa: E402
    fidelity_constraint,
    objective_values,
    rung_attrs,
    rung_losses_attr,
    seed_attrs,
)
from npas.service.search.progress import Progress  # noqa: E402
from npas.service.search.samplers import learns_from_infeasible, random_when_stuck  # noqa: E402
from npas.service.study import optuna_adapter as adapter  # noqa: E402
from npas.service.study.record import Constraint, TrialAttr  # noqa: E402
from npas.service.study.tally import StudyTally  # noqa: E402

log = logging.getLogger(__name__)

MAX_SKIPPED_IN_A_ROW = 200  # infeasible or duplicate asks before the space is called exhausted


class NpasSearcher(Searcher):
    """Optuna ask/tell behind Ray Tune's Searcher protocol (suggest / on_trial_result / complete)."""

    def __init__(self, study: optuna.Study, space: Space, recipe: dict, fingerprint: str, target: int,
                 on_progress: Callable[[Progress], None] | None = None,
                 on_trial_done: Callable[[optuna.Study], None] | None = None,
                 tokens_per_byte: float | None = None, learn_infeasible: bool | None = None) -> None:
        super().__init__(metric="val_loss", mode="min")
        self.tokens_per_byte = tokens_per_byte  # of the validation windows: turns any loss into bits per byte
        self.study, self.space, self.recipe, self.fingerprint = study, space, recipe, fingerprint
        self.target = target
        self.objectives = list(space.objectives)
        self.progress = Progress(target=target)
        self.tally = StudyTally(study)  # study-wide counts, keys and front, read incrementally
        # tell infeasible asks COMPLETE with a violated `fit` constraint (TPE learns from them) or FAIL
        self.learn_infeasible = learns_from_infeasible(study.sampler) if learn_infeasible is None else learn_infeasible
        self.on_progress = on_progress
        self.on_trial_done = on_trial_done
        self.error: str | None = None  # set when the search must stop (space exhausted)
        self.finished = False  # set when suggest said FINISHED: the only way a run ends without an interrupt
        self._live: dict[str, optuna.Trial] = {}
        self._curves: dict[str, list[list[float]]] = {}
        self._accounting: dict[int, dict] = {}
        self._errors: dict[str, str] = {}
        self._retries: dict[str, int] = {}
        self._skipped = 0
        self._fresh = False  # the tally was refreshed after this driver's last tell
        self._lock = threading.Lock()

    # ---- what the runner tells the searcher, and asks of it ------------------------------------
    def record_error(self, trial_id: str, message: str) -> None:
        """The error text of a failed Tune trial (the protocol's on_trial_complete gets only a flag)."""
        self._errors[trial_id] = message

    def record_retry(self, trial_id: str) -> None:
        """Tune restarted the trial after its worker or node died (FailureConfig)."""
        self._retries[trial_id] = self._retries.get(trial_id, 0) + 1

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
        return self._accounting[number]

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
        config = self._suggest(trial_id)
        if config is Searcher.FINISHED:
            self.finished = True
        return config

    def _suggest(self, trial_id: str) -> dict | None:
        while True:
            if self.error is not None:
                return Searcher.FINISHED
            if not self._fresh:  # refreshed as the last trial was told, a moment ago: nothing changed here since
                self.tally.refresh()
            self._fresh = False
            if self.tally.counted >= self.target:  # a cheap early stop; the check after the ask is the exact one
                return Searcher.FINISHED
            with random_when_stuck(self.study, self._skipped, seed=self.tally.seen):
                trial = self.study.ask()
                # claim it at once: a driver killed from here on leaves a trial that resume can attribute
                faults.claim(self.study, trial)
                self.tally.refresh()
                if self.tally.counted_before(trial.number) >= self.target:  # another driver got there first
                    self._tell_skip(trial, "surplus", "the study reached its target while this trial was asked")
                    return Searcher.FINISHED
                config = self._prepare(trial)
            if config is not None:
                with self._lock:
                    self._live[trial_id] = trial
                self.progress.running += 1
                self._emit()
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
                self._tell_duplicate(trial, prepared.same_as, prepared.reason)
                return None
            if prepared.status == "sample_error":
                self.progress.failed += 1
            else:
                self.progress.infeasible += 1
            self._tell_skip(trial, prepared.status, prepared.reason)
            return None
        self._skipped = 0
        self._accounting[trial.number] = prepared.accounting
        return prepared.config

    def _twin(self, key: str, number: int) -> int | None:
        """A trial with the same key that ran or runs, read just before this one would start: other
        drivers' keys appear as their candidates are fitted, after this trial's ask."""
        self.tally.refresh()
        return self.tally.twin(key, number)

    def _tell_duplicate(self, trial: optuna.Trial, twin: int, reason: str) -> None:
        self.progress.duplicates += 1
        trial.set_user_attr(TrialAttr.SAME_AS, twin)
        self._tell_skip(trial, "duplicate", reason)

    def _tell_skip(self, trial: optuna.Trial, status: str, reason: str) -> None:
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
        self._emit()

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if not result.get("final") and math.isfinite(result.get("val_loss", math.inf)):
            self._curves.setdefault(trial_id, []).append([int(result["step"]), float(result["val_loss"])])

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        with self._lock:
            trial = self._live.pop(trial_id, None)
        if trial is None:
            return
        self.progress.running -= 1
        curve = self._curves.pop(trial_id, [])
        trial.set_user_attr(TrialAttr.CURVE, curve)
        if self.recipe.get("schedule") == "wsd" and curve:  # a wsd trial reports its rungs' finished losses:
            trial.set_user_attr(TrialAttr.RUNG_LOSSES, rung_losses_attr(curve))  # kept even if ASHA stops it
        if trial_id in self._retries:
            trial.set_user_attr(TrialAttr.RETRIES, self._retries.pop(trial_id))
        if error or not result:
            self._fail(trial, self._errors.pop(trial_id, "worker error: the trial raised or its worker died"))
        else:
            try:
                self._finish(trial, result)
            except Exception as e:  # a result npas cannot record must end the trial, not leave it RUNNING
                log.warning("recording trial %d failed: %s", trial.number, e)
                self._fail(trial, f"its result could not be recorded: {type(e).__name__}: {e}")
        self._emit(refresh_front=True)
        if self.on_trial_done is not None:
            try:
                self.on_trial_done(self.study)
            except Exception as e:  # a report that fails to render must never stop a search
                log.warning("trial-done hook failed: %s", e)

    def _fail(self, trial: optuna.Trial, reason: str) -> None:
        self.progress.failed += 1
        self._accounting.pop(trial.number, None)
        trial.set_user_attr(TrialAttr.STATUS, "failed")
        trial.set_user_attr(TrialAttr.REASON, reason[:2000])
        self.study.tell(trial, state=TrialState.FAIL)

    def _finish(self, trial: optuna.Trial, result: dict) -> None:
        proxy = json.loads(result["proxy"]) if isinstance(result.get("proxy"), str) else None
        steps = int(result.get("step", 0))
        max_steps = int(self.recipe["steps"])
        if proxy is not None and proxy.get("status") == "failed":
            trial.set_user_attr(TrialAttr.PROXY, proxy)
            self._fail(trial, proxy.get("failure_reason") or "proxy run failed")
            return
        loss = proxy.get("val_loss") if proxy else result.get("val_loss")
        if loss is None or not math.isfinite(loss):
            self._fail(trial, f"non-finite validation loss at step {steps}")
            return
        if proxy is not None:
            proxy, per_seed = seed_attrs(proxy)  # the seeds and their losses (`--repeats`) get their own keys
            proxy, rungs = rung_attrs(proxy)  # and a wsd run's finished loss at every rung
            for attr, value in {**per_seed, **rungs}.items():
                trial.set_user_attr(attr, value)
            trial.set_user_attr(TrialAttr.PROXY, proxy)
            trial.set_user_attr(TrialAttr.NODE, result.get("node"))
            if proxy.get("curve"):  # the worker's own record includes the last evaluation
                trial.set_user_attr(TrialAttr.CURVE, proxy["curve"])
            steps = int(proxy.get("steps_done", steps))
        self.tally.refresh()
        twin = self.tally.twin(trial.user_attrs.get(TrialAttr.KEY), trial.number, running=False)
        if twin is not None:  # another driver ran the same candidate concurrently: keep one result
            self._accounting.pop(trial.number, None)
            self._tell_duplicate(trial, twin, f"ran concurrently with trial {twin}, whose result is kept")
            return
        values = objective_values(self.objectives, self._accounting.get(trial.number, {}), proxy, loss,
                                  self.tokens_per_byte)
        full = steps >= max_steps
        trial.set_user_attr(TrialAttr.FIDELITY, steps)
        trial.set_user_attr(TrialAttr.STATUS, "ok" if full else "stopped")
        trial.set_constraint(Constraint.FIDELITY, fidelity_constraint(steps, max_steps))
        self.study.tell(trial, values)
        self._accounting.pop(trial.number, None)
        if full:
            self.progress.done += 1
            self.progress.best_loss = min(self.progress.best_loss, loss)
        else:
            self.progress.stopped += 1

    def _emit(self, refresh_front: bool = False) -> None:
        if refresh_front:  # after a trial finished; a skipped ask changes neither the front nor the count
            self.tally.refresh()
            self._fresh = True
            self.progress.front_size = self.tally.front_size
        self.progress.study_counted = self.tally.counted
        if self.on_progress is not None:
            self.on_progress(self.progress)

    def abandon_live(self, status: str, reason: str) -> list[int]:
        """Fail every trial still running here (interrupt), re-enqueueing each with its exact params."""
        with self._lock:
            live, self._live = list(self._live.values()), {}
        numbers = []
        for trial in live:
            frozen = adapter.storage_of(self.study).get_trial(adapter.trial_id(trial))
            self._tell_skip(trial, status, reason)
            faults.requeue(self.study, frozen)
            numbers.append(trial.number)
        return numbers
