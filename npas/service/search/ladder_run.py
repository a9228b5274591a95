"""The promotion ladder inside `npas search`: its scheduler, its checkpoints and what a study tells it.

``SearchPlan.fidelity == "ladder"`` (a ``wsd`` recipe, early stopping on) makes the runner use these:

- ``SearchLadder``: ``LadderScheduler`` on the trials' rung reports (``npas.service.execution.climber``),
  ranking on the rung loss and the study's other objectives, each rung capped by the search's trial
  target (``npas.service.study.ladder``: the rule; the enqueued baselines follow it like every
  other trial). On top, at most ``workers`` trials *run*: Tune counts paused trials against
  ``max_concurrent_trials``, so a search that capped live trials there would let paused trials
  starve the upper rungs. The runner sets no ``max_concurrent_trials``; the cap is applied to
  running trials only, where new trials are created (the searcher asks ``admits``: Tune starts
  every pending trial its resources allow) and where paused ones resume (``choose_trial_to_run``),
  promoted trials first.
- ``Checkpoints``: a Tune callback that records each trial's directory as it starts
  (``TrialAttr.LADDER_DIR``) and its last climb checkpoint (``TrialAttr.LADDER_CHECKPOINT``) on its
  Optuna trial -- a driver stopped while the trial is paused re-enqueues it with both, and ``npas
  resume`` continues it from the newest checkpoint there (``climb_store.restore``) -- and removes a
  trial's checkpoints when it stops, finished or stopped below the top rung. ``sweep`` removes, at
  the search's end, those no trial will resume from, wherever the trials recorded them.
- ``rebuild``: the ladder of the study's trials already told (a resumed driver's rungs start where the
  stopped driver's were, so a resumed paused trial is ranked against every earlier result, and the
  promotions already made count toward each rung's cap); while it runs, ``rung_exchange`` keeps it
  level with the other drivers of the same study.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import TrialState
from ray import tune
from ray.tune.experiment import Trial
from ray.tune.schedulers import TrialScheduler

from npas.service.execution.climb_store import checkpoint_uri, checkpoints_in, filesystem, name_of, remove
from npas.service.execution.trial import OBJECTIVE_PREFIX
from npas.service.search.admission import ranked_objectives
from npas.service.search.ladder_scheduler import LadderScheduler
from npas.service.search.rung_exchange import RungExchange
from npas.service.study.ladder import DEFAULT_ETA, Ladder, RungAgreement, agreement
from npas.service.study.record import TrialAttr

if TYPE_CHECKING:
    from npas.service.search.searcher import NpasSearcher

log = logging.getLogger(__name__)


class SearchLadder(LadderScheduler):
    """``LadderScheduler`` with the search's cap on running trials and its exchange between drivers
    (see the module docstring). ``target``: the search's trial target N (the rungs' caps)."""

    def __init__(self, rungs: Sequence[int], objectives: Sequence[str], max_running: int,
                 eta: int = DEFAULT_ETA, target: int | None = None) -> None:
        super().__init__(rungs, eta, metric="val_loss", mode="min", time_attr="rung", target=target,
                         objectives=[(OBJECTIVE_PREFIX + o, "min") for o in ranked_objectives(objectives)])
        self.max_running = max_running
        self.paused: set[str] = set()  # trials paused at a rung, waiting for a promotion or a stop
        # the other drivers' rung results on the same study (``rung_exchange``); None: this driver's only
        self.exchange: RungExchange | None = None
        self.on_paused: Callable[[int], None] | None = None  # told the number of paused trials when it changes

    def _set_paused(self, change: Callable[[set[str]], None]) -> None:
        before = len(self.paused)
        change(self.paused)
        if self.on_paused is not None and len(self.paused) != before:
            self.on_paused(len(self.paused))

    def _promote_paused(self) -> None:
        """Decide every rung below the top again (the union of results grew by another driver's) and
        queue this driver's paused trials that now rank inside their rung's quota."""
        for r in self.ladder.rungs[:-1]:
            for tid in self.ladder.decide(r).promote:
                if tid in self.paused and tid not in self.to_resume:
                    self.to_resume.append(tid)

    def _pull(self, force: bool) -> None:
        if self.exchange is not None and self.exchange.pull(self.ladder, force=force):
            self._promote_paused()
            self.exchange.publish_promotions(self.ladder)

    def admits(self, live: set[str]) -> bool:
        """Whether the searcher may start a new trial now: fewer than ``max_running`` of its live trials
        run (paused ones hold no worker), and no promoted trial waits for a worker (promotions first).
        Tune starts every pending trial its resources allow, whatever the scheduler says, so the
        cap on running trials is applied where trials are created."""
        if any(t in self.paused for t in self.to_resume):
            return False
        return len(live - self.paused) < self.max_running

    def _result(self, trial_id: str, result: dict):
        # an objective its accounting could not give ranks the trial last on it, never a KeyError mid-search
        return super()._result(trial_id, {k: math.inf for k, _ in self.objectives} | result)

    def on_trial_result(self, tune_controller: Any, trial: Trial, result: dict) -> str:
        rung = result.get(self.time_attr)
        if rung in self.ladder.rungs:
            self._pull(force=True)  # decide on every driver's results at this rung
        action = super().on_trial_result(tune_controller, trial, result)
        if self.exchange is not None and rung in self.ladder.rungs:
            mine = next((r for r in self.ladder.results.get(rung, []) if r.trial == trial.trial_id), None)
            if mine is not None:
                self.exchange.publish(trial.trial_id, rung, mine)
            self.exchange.publish_promotions(self.ladder)
        if action == TrialScheduler.PAUSE:
            self._set_paused(lambda p: p.add(trial.trial_id))
        return action

    def choose_trial_to_run(self, tune_controller: Any) -> Trial | None:
        if sum(t.status in (Trial.RUNNING, Trial.PENDING) for t in tune_controller.get_trials()) >= self.max_running:
            return None  # every worker is taken: a promoted trial resumes when one is free
        if self.paused:
            self._pull(force=False)  # another driver's results may have promoted a paused trial
        trial = super().choose_trial_to_run(tune_controller)
        if trial is not None:
            self._set_paused(lambda p: p.discard(trial.trial_id))
        return trial

    def _stop_stranded(self, tune_controller: Any, paused: list[Trial]) -> None:
        """Before stopping paused trials nothing here can promote, read the other drivers' results once
        more: a trial they promote resumes instead (the next ``choose_trial_to_run``). Results another
        driver reports after this can no longer promote a trial stopped here."""
        if self.exchange is not None and paused:
            self._pull(force=True)
            if any(t.trial_id in self.to_resume for t in paused):
                return
        super()._stop_stranded(tune_controller, paused)

    def _stopped(self, trial: Trial) -> None:
        self._set_paused(lambda p: p.discard(trial.trial_id))
        if self.exchange is not None:
            self.exchange.forget(trial.trial_id)

    def on_trial_complete(self, tune_controller: Any, trial: Trial, result: dict) -> None:
        self._stopped(trial)
        super().on_trial_complete(tune_controller, trial, result)

    def on_trial_remove(self, tune_controller: Any, trial: Trial) -> None:
        self._stopped(trial)
        super().on_trial_remove(tune_controller, trial)

    def on_trial_error(self, tune_controller: Any, trial: Trial) -> None:
        self._stopped(trial)
        super().on_trial_error(tune_controller, trial)

    def agreement(self) -> list[RungAgreement]:
        """The rung-to-rung certificate of every rung below the top (``ladder.agreement``)."""
        return [a for r in self.ladder.rungs if (a := agreement(self.ladder, r)) is not None]


def rebuild(study: optuna.Study, rungs: Sequence[int], objectives: Sequence[str], eta: int = DEFAULT_ETA,
            target: int | None = None) -> Ladder:
    """The ladder of the study's told trials (COMPLETE or failed, with rung losses), keyed ``"study:<number>"``:
    what a resumed or joining driver's scheduler starts from, capped by ``target`` (the search's N
    now: a resume with another ``--trials`` caps by the new one). Read as a running driver reads the
    others' (``RungExchange.pull``), by a reader that owns no trial."""
    names = list(objectives)
    ladder = Ladder(tuple(rungs), eta, target)
    RungExchange(study, lambda _: None, set, [names.index(o) for o in ranked_objectives(names)]).pull(
        ladder, states=(TrialState.COMPLETE, TrialState.FAIL))
    return ladder


class Checkpoints(tune.Callback):
    """Records each trial's directory as it starts and its last checkpoint as Tune confirms it on its
    Optuna trial; removes a trial's checkpoints when it stops."""

    def __init__(self, searcher: NpasSearcher) -> None:
        self.searcher = searcher

    def on_trial_start(self, iteration: int, trials: list, trial: Trial, **info: Any) -> None:
        # before the trial can write a checkpoint: one written just before a crash is found there
        where = checkpoint_uri(trial.storage.storage_filesystem, trial.storage.trial_fs_path)
        if where is not None:
            self.searcher.record_trial_dir(trial.trial_id, where)

    def on_checkpoint(self, iteration: int, trials: list, trial: Trial, checkpoint: Any, **info: Any) -> None:
        # a local path, or the URI of Ray's storage (--checkpoint-storage s3://...): what a later driver resumes from
        where = checkpoint_uri(checkpoint.filesystem, checkpoint.path)
        if where is not None:
            self.searcher.record_checkpoint(trial.trial_id, where)

    def on_trial_complete(self, iteration: int, trials: list, trial: Trial, **info: Any) -> None:
        remove_checkpoints(trial)

    def on_trial_error(self, iteration: int, trials: list, trial: Trial, **info: Any) -> None:
        remove_checkpoints(trial)


def remove_checkpoints(trial: Trial) -> None:
    """Delete every checkpoint a trial left in the run's storage (local path or Ray's storage URI)."""
    from pyarrow.fs import FileSelector, FileType

    try:
        fs, root = trial.storage.storage_filesystem, trial.storage.trial_fs_path
        for info in fs.get_file_info(FileSelector(root, allow_not_found=True)):
            if info.type == FileType.Directory and info.base_name.startswith("checkpoint_"):
                fs.delete_dir(info.path)
    except Exception as e:  # scratch space: a failed clean-up must not fail the search
        log.warning("could not remove the checkpoints of trial %s: %s", trial.trial_id, e)


def pending_checkpoints(study: optuna.Study) -> set[str]:
    """The checkpoints and trial directories the study's live or re-enqueued trials (RUNNING, WAITING)
    may still resume from, whichever driver recorded them."""
    states = (TrialState.RUNNING, TrialState.WAITING)
    return {p for t in study.get_trials(deepcopy=False, states=states)
            for attr in (TrialAttr.LADDER_CHECKPOINT, TrialAttr.LADDER_DIR) if (p := t.user_attrs.get(attr))}


def sweep(study: optuna.Study, storage: str, keep: set[str]) -> list[str]:
    """Remove the checkpoints the study's runs left, except those a trial may still resume from
    (``keep``: checkpoints, and trial directories whose newest checkpoint a retry takes): a trial that
    reported a rung just as its driver was stopped or killed has a checkpoint no study record points
    to. Looked for in every trial directory a trial of the study recorded (``TrialAttr.LADDER_DIR``:
    whichever driver ran it, from whatever working directory, on whatever storage) and in this run's
    storage (``storage``: a path or URI) under the study's experiment directories, for trials that
    recorded none. Returns the checkpoints removed."""
    def named(where: str) -> str:
        return name_of(*filesystem(where))

    kept = {named(p) for p in keep}
    dirs = {named(d) for t in study.get_trials(deepcopy=False) if (d := t.user_attrs.get(TrialAttr.LADDER_DIR))}
    dirs |= {d for e in experiments(storage, study.study_name) for d in subdirectories(e)}
    removed = []
    for d in sorted(dirs - kept):
        for ckpt in checkpoints_in(d):
            if ckpt not in kept:
                remove(ckpt)
                removed.append(ckpt)
    return removed


def experiments(storage: str, study_name: str) -> list[str]:
    """The study's Tune experiment directories in ``storage`` (``<study>-<unix time>``, as the runner names them)."""
    prefix = f"{study_name}-"
    return [d for d in subdirectories(storage)
            if (base := d.rstrip("/").rsplit("/", 1)[-1]).startswith(prefix) and base[len(prefix):].isdigit()]


def subdirectories(where: str) -> list[str]:
    """The directories directly in ``where`` (a path or URI), as recorded locations; none if it is gone."""
    from pyarrow.fs import FileSelector, FileType

    try:
        fs, root = filesystem(where)
        return [name_of(fs, i.path) for i in fs.get_file_info(FileSelector(root, allow_not_found=True))
                if i.type == FileType.Directory]
    except (OSError, ValueError) as e:
        log.warning("cannot list %s (%s)", where, e)
        return []
