"""What the driver needs to know about the whole study on every ask and tell, kept incrementally.

A driver decides, per trial: has the study reached its target (counting every driver's trials), did
another trial already run or start this allocation, and how big is the front now. Deriving those from
every trial of the study several times per trial made the driver's cost per trial grow with the study
(and `study.best_trials` deep-copies every trial). Optuna's cached storage already reads only new and
unfinished trials from the database; this tally does the same on its side: a finished trial never
changes, so it is looked at exactly once, and only trials that were unfinished (WAITING or RUNNING) at
the last refresh, or are new since, are looked at again, so a refresh costs what changed, not the study's size.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from npas.service.study.record import TrialAttr
from npas.service.study.studies import counts_toward_target, reached_top, was_evaluated


class StudyTally:
    """Study-wide counts, duplicate keys and front size, refreshed from what changed since last time."""

    def __init__(self, study: optuna.Study) -> None:
        self.study = study
        self._signs = [1.0 if d == StudyDirection.MINIMIZE else -1.0 for d in study.directions]
        self._seen = 0  # trials 0 .. _seen-1 have been looked at
        self._open: set[int] = set()  # unfinished at the last look: looked at again on every refresh
        self._counted_done: list[int] = []  # sorted numbers of finished trials that count toward the target
        self._running: dict[int, str | None] = {}  # RUNNING trial number -> its key (set after the ask)
        self._keys: dict[str, int] = {}  # key -> lowest number of an evaluated COMPLETE trial
        self._front: list[tuple[int, tuple[float, ...]]] = []  # (number, signed values), feasible, evaluated

    # ---- reading what changed --------------------------------------------------------------------
    def refresh(self) -> None:
        """One read of Optuna's cache (new and unfinished trials come from the database), then only
        the trials that are new or were unfinished are examined."""
        trials = self.study.get_trials(deepcopy=False)
        if any(trials[i].number != i for i in (0, len(trials) - 1) if trials):
            trials = _by_number(trials)  # numbers are 0..n-1 in Optuna's storages; never trust it blindly
        look = sorted(self._open) + list(range(self._seen, len(trials)))
        self._seen = len(trials)
        for number in look:
            self._look(trials[number])

    def _look(self, t: FrozenTrial) -> None:
        if t.state == TrialState.WAITING:
            self._open.add(t.number)
            return
        if t.state == TrialState.RUNNING:
            self._open.add(t.number)
            self._running[t.number] = t.user_attrs.get(TrialAttr.KEY)
            return
        self._open.discard(t.number)
        self._running.pop(t.number, None)
        if counts_toward_target(t):
            bisect.insort(self._counted_done, t.number)
        if was_evaluated(t):
            key = t.user_attrs.get(TrialAttr.KEY)
            if key is not None and (key not in self._keys or t.number < self._keys[key]):
                self._keys[key] = t.number
            if t.values is not None and all(v <= 0.0 for v in t.constraints.values()) and reached_top(t):
                self._add_to_front(t.number, t.values)

    def _add_to_front(self, number: int, values: Sequence[float]) -> None:
        """Pareto front by Optuna's rule: a point dominates another when no worse in every objective
        and better in one (equal points both stay)."""
        p = tuple(s * v for s, v in zip(self._signs, values, strict=True))
        if any(_dominates(q, p) for _, q in self._front):
            return
        self._front = [(n, q) for n, q in self._front if not _dominates(p, q)] + [(number, p)]

    # ---- what the driver asks ----------------------------------------------------------------------
    @property
    def seen(self) -> int:
        """Trials in the study at the last refresh."""
        return self._seen

    @property
    def counted(self) -> int:
        """Trials of the whole study that count toward the target (`counts_toward_target`)."""
        return len(self._counted_done) + len(self._running)

    def counted_before(self, number: int) -> int:
        """Counted trials numbered below `number`: whether a just-asked trial is within the target."""
        return bisect.bisect_left(self._counted_done, number) + sum(1 for n in self._running if n < number)

    def twin(self, key: str | None, number: int, running: bool = True) -> int | None:
        """Another trial with the same idempotency key: evaluated (COMPLETE), or also RUNNING."""
        if key is None:
            return None
        found = [n for n in (self._keys.get(key),) if n is not None and n != number]
        if running:
            found += [n for n, k in self._running.items() if k == key and n != number]
        return min(found) if found else None

    @property
    def front_size(self) -> int:
        return len(self._front)


def _dominates(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return all(x <= y for x, y in zip(a, b, strict=True)) and a != b


def _by_number(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """Index trials by number when the list is not already (a gap would be a storage bug: fail loudly)."""
    out = sorted(trials, key=lambda t: t.number)
    if [t.number for t in out] != list(range(len(out))):
        raise RuntimeError("trial numbers of the study are not 0..n-1; the storage is inconsistent")
    return out
