"""A Ray Tune `Searcher` that asks and tells an Optuna study directly.

Why not Ray's `OptunaSearch`: it names every study "optuna", ignores constraints, drops
intermediate values in multi-objective runs and never prunes (all reported on its tracker). This searcher keeps the
bookkeeping npas needs: infeasible candidates are told at once and never reach a worker, the budget
and the reached fidelity become Optuna constraints, duplicates of a finished trial are not run
twice, and only this driver process writes to the database.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import TrialState

os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # before Tune loads: npas prints its own progress line
from ray.tune.search import Searcher  # noqa: E402

from npas.allocation.budget import count
from npas.allocation.space import Space
from npas.service import study as S
from npas.service.samplers import T_BASELINE_FIXED, baseline_fixed
from npas.service.storage import HEARTBEAT_S

log = logging.getLogger(__name__)

MAX_SKIPPED_IN_A_ROW = 200  # infeasible or duplicate asks before the space is called exhausted
RANDOM_AFTER_SKIPS = 3  # skipped asks in a row after which the next ask is a random one


@dataclass
class Progress:
    """What the progress line shows; counts are this driver's unless named study_*."""

    done: int = 0
    running: int = 0
    failed: int = 0
    infeasible: int = 0
    stopped: int = 0
    duplicates: int = 0
    best_loss: float = math.inf
    front_size: int = 0
    study_counted: int = 0  # trials of the whole study that count toward the target
    target: int = 0
    started: float = field(default_factory=time.time)

    @property
    def elapsed(self) -> float:
        return time.time() - self.started

    def eta(self) -> float | None:
        finished = self.done + self.failed + self.stopped
        left = self.target - self.study_counted + self.running
        return None if finished == 0 else self.elapsed / finished * max(left, 0)


def driver_id() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid()}


class NpasSearcher(Searcher):
    """Optuna ask/tell behind Ray Tune's Searcher protocol (suggest / on_trial_result / complete)."""

    def __init__(self, study: optuna.Study, space: Space, recipe: dict, fingerprint: str, target: int,
                 on_progress: Callable[[Progress], None] | None = None,
                 on_trial_done: Callable[[optuna.Study], None] | None = None) -> None:
        super().__init__(metric="val_loss", mode="min")
        self.study, self.space, self.recipe, self.fingerprint = study, space, recipe, fingerprint
        self.target = target
        self.objectives = list(space.objectives)
        self.live: dict[str, optuna.Trial] = {}
        self.curves: dict[str, list[list[float]]] = {}
        self.accounting: dict[str, dict] = {}
        self.errors: dict[str, str] = {}  # filled by the runner's Tune callback
        self.retries: dict[str, int] = {}  # restarts after a worker or node died (Tune FailureConfig)
        self.progress = Progress(target=target)
        self.on_progress = on_progress
        self.on_trial_done = on_trial_done
        self.error: str | None = None  # set when the search must stop (space exhausted)
        self._skipped = 0
        self._lock = threading.Lock()
        self._beat_stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, name="npas-heartbeat", daemon=True)
        self._beat.start()

    # ---- heartbeats, so a resume can tell our trials from a dead driver's ---------------------
    def _heartbeat(self) -> None:
        storage = self.study._storage
        while not self._beat_stop.wait(HEARTBEAT_S):
            with self._lock:
                ids = [t._trial_id for t in self.live.values()]
            for tid in ids:
                try:
                    storage.record_heartbeat(tid)
                except Exception as e:  # a flaky database must not kill the search; the next beat retries
                    log.warning("heartbeat failed: %s", e)

    def close(self) -> None:
        self._beat_stop.set()

    def save(self, checkpoint_path: str) -> None:
        """Nothing to save: every ask and tell is already in the study's database."""

    def restore(self, checkpoint_path: str) -> None:
        """Nothing to restore: `npas resume` rebuilds the run from the database."""

    def __getstate__(self) -> dict:
        """Tune pickles its search algorithm into the (scratch) experiment directory. The study, its
        engine and the heartbeat thread cannot travel and need not: the database is the state."""
        return {"target": self.target, "objectives": self.objectives}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.live = {}

    # ---- counting toward the study-wide target -------------------------------------------------
    def _counted(self, before: int | None = None) -> int:
        trials = self.study.get_trials(deepcopy=False)
        return sum(S.counts_toward_target(t) for t in trials if before is None or t.number < before)

    # ---- Searcher protocol ---------------------------------------------------------------------
    def suggest(self, trial_id: str) -> dict | None:
        while True:
            if self.error is not None or self._counted() >= self.target:
                return Searcher.FINISHED
            with self._sampler_for_next_ask():
                trial = self.study.ask()
                # claim it at once: a driver killed from here on leaves a trial that resume can attribute
                trial.set_user_attr(S.T_DRIVER, driver_id())
                self.study._storage.record_heartbeat(trial._trial_id)
                if self._counted(before=trial.number) >= self.target:  # another driver got there first
                    self._tell_skip(trial, "surplus", "the study reached its target while this trial was asked")
                    return Searcher.FINISHED
                config = self._prepare(trial)
            if config is not None:
                with self._lock:
                    self.live[trial_id] = trial
                self.progress.running += 1
                self._emit()
                return config
            self._skipped += 1
            if self._skipped >= MAX_SKIPPED_IN_A_ROW:
                self.error = (f"{self._skipped} candidates in a row were infeasible or already evaluated at "
                              f"budget {self.space.budget_params:,}; raise the budget or widen the space")
                return Searcher.FINISHED

    @contextlib.contextmanager
    def _sampler_for_next_ask(self):
        """The study's sampler; after a few skipped candidates in a row, a seeded random one.

        Optuna's model-based samplers ignore FAIL trials, so on a small or mostly infeasible space
        they propose the same skipped candidate again and again. A random ask breaks the loop
        without telling the sampler anything false about the skipped ones. The swap spans the ask
        and the suggestions, since a trial consults `study.sampler` at each suggest call.
        """
        if self._skipped < RANDOM_AFTER_SKIPS:
            yield
            return
        model = self.study.sampler
        self.study.sampler = optuna.samplers.RandomSampler(seed=len(self.study.get_trials(deepcopy=False)))
        try:
            yield
        finally:
            self.study.sampler = model

    def _prepare(self, trial: optuna.Trial) -> dict | None:
        """Sample, fit and record one candidate; None if it must not reach a worker."""
        cand = self.space.sample(trial, fixed=baseline_fixed(trial, self.space, S.T_BASELINE))
        trial.set_user_attr(S.T_KNOBS, cand.values)
        if not cand.feasible:
            self.progress.infeasible += 1
            self._tell_skip(trial, "infeasible", cand.reason or "does not fit the budget")
            return None
        cfg = cand.config
        acc = count(cfg, batch_size=self.recipe["batch_size"], seq_len=self.recipe["seq_len"])
        key = S.trial_key(cfg, self.recipe, self.fingerprint)
        for attr, value in ((S.T_ALLOC, cfg.to_dict()), (S.T_HASH, cfg.hash), (S.T_ACCOUNTING, acc.to_dict()),
                            (S.T_KEY, key), (S.T_FILL, round(cand.fill, 6)),
                            (S.T_MAX_FIDELITY, self.recipe["steps"])):
            trial.set_user_attr(attr, value)
        trial.set_constraint(S.C_BUDGET, float(acc.stored_params - self.space.budget_params))
        twin = self._same_key(key, trial.number)
        if twin is not None:
            self._tell_duplicate(trial, twin, f"same allocation, recipe and data as trial {twin}")
            return None
        self._skipped = 0
        self.accounting[str(trial.number)] = acc.to_dict()
        return {"allocation": cfg.to_dict(), "recipe": self.recipe, "number": trial.number,
                "baseline": trial.user_attrs.get(S.T_BASELINE)}

    def _same_key(self, key: str | None, number: int,
                  states: tuple[TrialState, ...] = (TrialState.COMPLETE, TrialState.RUNNING)) -> int | None:
        for t in self.study.get_trials(deepcopy=False, states=states):
            if t.number != number and t.user_attrs.get(S.T_KEY) == key:
                return t.number
        return None

    def _tell_duplicate(self, trial: optuna.Trial, twin: int, reason: str) -> None:
        self.progress.duplicates += 1
        trial.set_user_attr(S.T_SAME_AS, twin)
        self._tell_skip(trial, "duplicate", reason)

    def _tell_skip(self, trial: optuna.Trial, status: str, reason: str) -> None:
        trial.set_user_attr(S.T_STATUS, status)
        trial.set_user_attr(S.T_REASON, reason)
        self.study.tell(trial, state=TrialState.FAIL)
        self._emit()

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if not result.get("final") and math.isfinite(result.get("val_loss", math.inf)):
            self.curves.setdefault(trial_id, []).append([int(result["step"]), float(result["val_loss"])])

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        with self._lock:
            trial = self.live.pop(trial_id, None)
        if trial is None:
            return
        self.progress.running -= 1
        curve = self.curves.pop(trial_id, [])
        trial.set_user_attr(S.T_CURVE, curve)
        if trial_id in self.retries:
            trial.set_user_attr(S.T_RETRIES, self.retries.pop(trial_id))
        if error or not result:
            self._fail(trial, self.errors.get(trial_id, "worker error: the trial raised or its worker died"))
        else:
            self._finish(trial, result)
        self._emit(refresh_front=True)
        if self.on_trial_done is not None:
            try:
                self.on_trial_done(self.study)
            except Exception as e:  # a report that fails to render must never stop a search
                log.warning("trial-done hook failed: %s", e)

    def _fail(self, trial: optuna.Trial, reason: str) -> None:
        self.progress.failed += 1
        trial.set_user_attr(S.T_STATUS, "failed")
        trial.set_user_attr(S.T_REASON, reason[:2000])
        self.study.tell(trial, state=TrialState.FAIL)

    def _finish(self, trial: optuna.Trial, result: dict) -> None:
        proxy = json.loads(result["proxy"]) if isinstance(result.get("proxy"), str) else None
        steps = int(result.get("step", 0))
        max_steps = int(self.recipe["steps"])
        if proxy is not None and proxy.get("status") == "failed":
            trial.set_user_attr(S.T_PROXY, proxy)
            self._fail(trial, proxy.get("failure_reason") or "proxy run failed")
            return
        loss = proxy.get("val_loss") if proxy else result.get("val_loss")
        if loss is None or not math.isfinite(loss):
            self._fail(trial, f"non-finite validation loss at step {steps}")
            return
        if proxy is not None:
            trial.set_user_attr(S.T_PROXY, proxy)
            trial.set_user_attr(S.T_NODE, result.get("node"))
            if proxy.get("curve"):  # the worker's own record includes the last evaluation
                trial.set_user_attr(S.T_CURVE, proxy["curve"])
            steps = int(proxy.get("steps_done", steps))
        twin = self._same_key(trial.user_attrs.get(S.T_KEY), trial.number, states=(TrialState.COMPLETE,))
        if twin is not None:  # another driver ran the same candidate concurrently: keep one result
            self._tell_duplicate(trial, twin, f"ran concurrently with trial {twin}, whose result is kept")
            return
        full = steps >= max_steps
        trial.set_user_attr(S.T_FIDELITY, steps)
        trial.set_user_attr(S.T_STATUS, "ok" if full else "stopped")
        trial.set_constraint(S.C_FIDELITY, 0.0 if full else (max_steps - steps) / max_steps)
        acc = self.accounting.pop(str(trial.number), {})
        metrics = {**acc, **(proxy or {}), "val_loss": loss, "val_bpc": loss / math.log(2)}
        values = [float(metrics[name]) for name in self.objectives]
        self.study.tell(trial, values)
        if full:
            self.progress.done += 1
            self.progress.best_loss = min(self.progress.best_loss, loss)
        else:
            self.progress.stopped += 1

    def _emit(self, refresh_front: bool = False) -> None:
        if refresh_front:
            self.progress.front_size = len(self.study.best_trials)
        self.progress.study_counted = self._counted()
        if self.on_progress is not None:
            self.on_progress(self.progress)

    def abandon_live(self, status: str, reason: str) -> list[int]:
        """Fail every trial still running here (interrupt), re-enqueueing each with its exact params."""
        with self._lock:
            live, self.live = list(self.live.values()), {}
        numbers = []
        for trial in live:
            frozen = self.study._storage.get_trial(trial._trial_id)
            self._tell_skip(trial, status, reason)
            requeue(self.study, frozen)
            numbers.append(trial.number)
        return numbers


def requeue(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
    """Enqueue a trial's exact parameters again (and its baseline name) so a later driver re-runs it."""
    attrs = {S.T_RETRY_OF: trial.number}
    for key in (S.T_BASELINE, T_BASELINE_FIXED):
        if key in trial.user_attrs:
            attrs[key] = trial.user_attrs[key]
    study.enqueue_trial(trial.params, user_attrs=attrs, skip_if_exists=False)

