"""Rung results shared, live, among the drivers of one study, so several drivers on one PostgreSQL
study share rung decisions.

Each driver runs its own ``SearchLadder`` (a Ray Tune scheduler lives in one driver process), so
without this every driver would promote on its own trials only: two drivers with eight trials each at
a rung would each keep their top two, where one driver with sixteen keeps its top four -- the same
trials only by luck. The study is the one place every driver reaches, so it carries the rungs:

- **publish**: when one of this driver's trials reports a rung, its loss goes on its Optuna trial at
  once (``rung_losses``, the attribute a told trial keeps), with what a rung decision ranks beside it
  (user attr ``ladder``: its other objectives and the rungs it was promoted from -- a promotion is
  recorded before the trial resumes, so no other driver counts it as waiting, and every driver
  counts it toward the rung's cap);
- **pull**: before deciding a rung (and, throttled, while choosing what to run next), the driver
  reads the other drivers' RUNNING and COMPLETE trials and merges their rung results into its ladder
  (``Ladder.merge``, keyed ``"study:<number>"`` as ``ladder_run.rebuild`` keys those of earlier
  drivers). Its own paused trials that the grown rungs now rank inside the quota are promoted.

Every driver then applies the same rule (``ladder.decide``) to the same union of results, so a trial
is promoted when it ranks in the top 1/eta of every result the study holds at its rung, whichever
driver trained it, while the rung's cap has room; each driver acts only on its own trials (it holds
their checkpoints). The union a driver sees lags the others' by at most one pull: a decision made
just before another driver's result lands is not taken back (promotions never are, as within one
driver), so two drivers deciding the same rung within that lag can each take its last place -- the
cap holds up to one promotion per other driver deciding at the same moment. Trials of a study with
one driver are unaffected: there is nobody else's result to pull.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import optuna
from optuna.trial import TrialState

from npas.service.execution.outcome import rung_losses_attr
from npas.service.study.ladder import Ladder, RungResult
from npas.service.study.record import TrialAttr
from npas.service.study.rungs import NOT_RESULTS, RETRIED

log = logging.getLogger(__name__)

PULL_EVERY_S = 5.0  # while choosing a trial to run (Tune asks many times a second), read the study at most this often


def foreign_key(number: int) -> str:
    """How a ladder names another driver's trial (``ladder_run.rebuild`` names earlier drivers' the same way)."""
    return f"study:{number}"


def _losses(raw: Mapping[str, Any] | None) -> dict[int, float]:
    out = {}
    for k, v in (raw or {}).items():
        try:
            out[int(k)] = math.nan if v is None else float(v)
        except (TypeError, ValueError):
            continue
    return out


class RungExchange:
    """One driver's side of the exchange. ``trial_of`` maps this driver's Tune trial ids to their live
    Optuna trials; ``own`` gives the numbers of every Optuna trial this driver asked (live or told),
    whose results its ladder already holds under their Tune ids; ``others`` are the indices of the
    study's objectives the ladder ranks on beside the loss (``ladder_run.ranked_objectives``), read
    from a told trial's values when it published none."""

    def __init__(self, study: optuna.Study, trial_of: Callable[[str], optuna.Trial | None],
                 own: Callable[[], set[int]], others: Iterable[int] = (), pull_every_s: float = PULL_EVERY_S) -> None:
        self.study, self.trial_of, self.own = study, trial_of, own
        self.others = tuple(others)
        self.pull_every_s = pull_every_s
        self._pulled = -math.inf
        self._mine: dict[str, dict[int, RungResult]] = {}  # Tune id -> rung -> its published result
        self._promoted: dict[str, set[int]] = {}  # Tune id -> rungs it was promoted from, as published

    # ---- publish --------------------------------------------------------------------------------
    def publish(self, trial_id: str, rung: int, result: RungResult) -> None:
        """This driver's trial reported ``rung``: store its loss there and its ranking data on its
        Optuna trial (the search's ladder minimizes the loss, so it is stored as reported)."""
        self._mine.setdefault(trial_id, {})[int(rung)] = result
        self._write(trial_id)

    def publish_promotions(self, ladder: Ladder) -> None:
        """Record each of this driver's trials promoted since the last call on its Optuna trial."""
        for rung, trials in ladder.promoted.items():
            for tid in trials:
                if isinstance(tid, str) and tid in self._mine and rung not in self._promoted.get(tid, set()):
                    self._promoted.setdefault(tid, set()).add(rung)
                    self._write(tid)

    def _write(self, trial_id: str) -> None:
        trial = self.trial_of(trial_id)
        if trial is None:
            return
        rungs = self._mine.get(trial_id, {})
        trial.set_user_attr(TrialAttr.RUNG_LOSSES, rung_losses_attr((t, r.loss) for t, r in rungs.items()))
        last = rungs[max(rungs)] if rungs else None
        trial.set_user_attr(TrialAttr.LADDER, {
            "objectives": [] if last is None else list(last.objectives),
            "promoted": sorted(self._promoted.get(trial_id, set())),
        })

    def forget(self, trial_id: str) -> None:
        """The trial stopped: its record is told by the searcher from here on."""
        self._mine.pop(trial_id, None)
        self._promoted.pop(trial_id, None)

    # ---- pull -----------------------------------------------------------------------------------
    def pull(self, ladder: Ladder, force: bool = True,
             states: tuple[TrialState, ...] = (TrialState.RUNNING, TrialState.COMPLETE, TrialState.FAIL)) -> bool:
        """Merge the other drivers' rung results into ``ladder``; returns whether anything changed.
        Without ``force`` the study is read at most every ``pull_every_s`` seconds. ``states``: the
        trials read (``ladder_run.rebuild`` reads the told ones only). A trial that failed above a rung
        was promoted from it (its promotion counts toward the cap); one stopped with its driver is
        skipped: its re-enqueued retry reports its rungs again."""
        now = time.monotonic()
        if not force and now - self._pulled < self.pull_every_s:
            return False
        self._pulled = now
        own = self.own()
        changed: list[int] = []
        for t in self.study.get_trials(deepcopy=False, states=states):
            if t.number in own or t.user_attrs.get(TrialAttr.STATUS) in (*NOT_RESULTS, *RETRIED):
                continue
            losses = _losses(t.user_attrs.get(TrialAttr.RUNG_LOSSES))
            if not losses:
                continue
            info = t.user_attrs.get(TrialAttr.LADDER) or {}
            objs = tuple(float(v) for v in info.get("objectives") or ())
            if len(objs) != len(self.others):  # published none: a told trial's values, else ranked last
                objs = (tuple(float(t.values[i]) for i in self.others) if t.values is not None
                        else (math.inf,) * len(self.others))
            losses = {k: v if math.isfinite(v) else math.inf for k, v in losses.items()}
            if ladder.merge(foreign_key(t.number), losses, objs, info.get("promoted") or ()):
                changed.append(t.number)
        if changed:
            log.debug("rung exchange: merged the rung results of trials %s of other drivers", changed)
        return bool(changed)
