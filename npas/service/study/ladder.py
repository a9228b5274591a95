"""The promotion ladder's rule: which trials at a rung go on to the next one. Pure: no I/O, no Ray.

Trials start at the first rung (a WSD run's cooldown fork at horizon/16 by default,
``Recipe.fork_rungs``) and the best move up. The rule, one for every trial (baselines too), every
driver of a study and every resume:

  N is the search's trial target (baselines included; ``npas resume --trials N2`` makes it N2) and
  eta the ladder's eta (4). The k-th rung from the bottom (k = 1 for the first) promotes at most
  ``cap = floor(N / eta**k)`` trials in the whole search, and a trial only while it ranks in the top
  ``floor(n / eta)`` of the n results at that rung so far. Promotions are final and count toward the
  cap even if the trial later falls out of the top ``floor(n / eta)``. One exception keeps a search
  from ending with nobody at the top: a rung that no further result can reach (the search asked its
  last trial and nothing runs) and that promoted nobody promotes its best trial still waiting there.

So at N = 8 and eta = 4, at most 2 trials pass the first rung, and (``floor(8 / 16) = 0``) the better
of them goes on to the top only by the exception, once both have reported at the second rung. The
rule is asynchronous (ASHA, Li et al. 2020): a rung never waits to fill -- a trial that qualifies
goes on at once, one that does not pauses and may be promoted later, when more results have grown
the rung's quota (``floor(n / eta)``) and the cap still has room. The cap is what bounds the compute:
without it, asynchronous promotion of every "best so far" lets a search that meets its candidates in
a bad order promote most of them. Its price is the same order: a trial that would be in the top
``1 / eta`` of the full rung but arrives after the cap is used up does not go on.

Ranking is multi-objective, as the study is: non-dominated fronts (Deb et al.'s sort) on (rung loss,
the study's other objectives, all minimized), and within a front by rung loss -- a multi-objective
search must not promote only the lowest losses, or the front's cheap end never reaches the top rung.
Two losses within the seed noise are ranked like any others: run-to-run noise is never a reason to
promote a trial beyond the rule.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from npas.service.study.fidelity import Interval, rank_correlation, rank_flips

DEFAULT_ETA = 4  # each rung keeps its top quarter: the k-th sends on at most N/4**k of a search's N trials
MIN_TAU_PAIRS = 10  # a rung-to-rung tau over fewer trials is not shown (too few pairs to say anything)


@dataclass(frozen=True)
class RungResult:
    """One trial's result at one rung. ``objectives`` are the study's other objectives, oriented so
    that lower is better (negate a maximized one)."""

    trial: Hashable
    loss: float
    objectives: tuple[float, ...] = ()

    def key(self) -> tuple[float, ...]:
        """The point ranked: NaN (a diverged run) counts as +inf, so it is dominated by every finite one."""
        return tuple(math.inf if math.isnan(v) else v for v in (self.loss, *self.objectives))


@dataclass(frozen=True)
class Decision:
    """The outcome of ranking one rung: who goes on now, and why."""

    promote: tuple[Hashable, ...]  # newly promoted trials, best first
    quota: int  # floor(n / eta) of the rung's n results
    ranking: tuple[Hashable, ...]  # every result's trial, best first
    cap: int | None = None  # the most this rung promotes in the search; None: no search-wide cap


def _dominates(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return all(x <= y for x, y in zip(a, b, strict=True)) and a != b


def fronts(results: Sequence[RungResult]) -> list[list[RungResult]]:
    """Non-dominated fronts, best first; each front by loss (equal losses keep their arrival order)."""
    keys = [r.key() for r in results]
    left = list(range(len(results)))
    out: list[list[RungResult]] = []
    while left:
        front = [i for i in left if not any(_dominates(keys[j], keys[i]) for j in left if j != i)]
        out.append([results[i] for i in sorted(front, key=lambda i: (keys[i][0], i))])
        left = [i for i in left if i not in front]
    return out


def rank(results: Sequence[RungResult]) -> list[RungResult]:
    """The rung's results best first: by front, then by loss within a front."""
    return [r for front in fronts(results) for r in front]


def decide(results: Sequence[RungResult], promoted: Iterable[Hashable], eta: int = DEFAULT_ETA,
           cap: int | None = None) -> Decision:
    """Rank a rung's results so far and return the trials to promote now: those in the top
    ``floor(n / eta)`` not already promoted, best first, while fewer than ``cap`` have been promoted
    from the rung (``promoted``, final). A diverged (non-finite) result is never promoted."""
    if eta < 2:
        raise ValueError(f"eta must be >= 2 (the fraction 1/eta of a rung moves on), got {eta}")
    done = set(promoted)
    order = rank(results)
    quota = len(order) // eta
    room = math.inf if cap is None else cap - len(done)
    chosen: list[Hashable] = []
    for r in order[:quota]:
        if len(chosen) >= room:
            break
        if r.trial not in done and math.isfinite(r.loss):
            chosen.append(r.trial)
    return Decision(tuple(chosen), quota, tuple(r.trial for r in order), cap)


@dataclass
class Ladder:
    """The rung bookkeeping of one search: every result reported at every rung and who was promoted
    from where. ``report`` records a result and decides its rung; promotions are final. ``target``:
    the search's N, which sets each rung's cap; None (a replay of cached runs) caps nothing."""

    rungs: tuple[int, ...]
    eta: int = DEFAULT_ETA
    target: int | None = None
    results: dict[int, list[RungResult]] = field(default_factory=dict)
    promoted: dict[int, list[Hashable]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rungs = tuple(sorted(set(self.rungs)))
        if not self.rungs:
            raise ValueError("a ladder needs at least one rung")

    @property
    def top(self) -> int:
        return self.rungs[-1]

    def cap(self, rung: int) -> int | None:
        """The most trials ``rung`` promotes in the search: floor(N / eta**k) at the k-th rung from the
        bottom; None without a target, 0 at the top rung (it finishes trials)."""
        if rung == self.top:
            return 0
        if self.target is None:
            return None
        return self.target // self.eta ** (self.rungs.index(rung) + 1)

    def is_full(self, rung: int) -> bool:
        """Whether ``rung`` has promoted all it may: nothing that reaches it from now on goes on. A rung
        whose cap is 0 is not full before its close has sent one trial on (``close``)."""
        cap = self.cap(rung)
        return cap is not None and len(self.promoted.get(rung, [])) >= max(cap, 1)

    def report(self, rung: int, result: RungResult) -> Decision:
        """Record ``result`` at ``rung`` (a repeat of the same trial replaces its earlier result) and
        decide the rung. At the top rung nothing is promoted: the trial is finished."""
        if rung not in self.rungs:
            raise ValueError(f"{rung} is not a rung of this ladder ({', '.join(map(str, self.rungs))})")
        here = [r for r in self.results.get(rung, []) if r.trial != result.trial]
        self.results[rung] = [*here, result]
        return self.decide(rung)

    def decide(self, rung: int) -> Decision:
        results = self.results.get(rung, [])
        if rung == self.top:
            return Decision((), 0, tuple(r.trial for r in rank(results)), 0)
        d = decide(results, self.promoted.get(rung, []), self.eta, self.cap(rung))
        self.promoted.setdefault(rung, []).extend(d.promote)
        return d

    def close(self, rung: int, waiting: Iterable[Hashable]) -> Decision:
        """``rung`` gets no further result (the search asked its last trial and nothing runs): if it
        promoted nobody, its best finite result among ``waiting`` (the trials paused there, which can
        still go on) is promoted, so a search whose cap is 0 at a rung (N < eta**k) still reaches the
        top. Otherwise, or at the top rung, nobody."""
        order = rank(self.results.get(rung, []))
        ranking = tuple(r.trial for r in order)
        if rung == self.top or self.promoted.get(rung):
            return Decision((), len(order) // self.eta, ranking, self.cap(rung))
        free = set(waiting)
        best = next((r.trial for r in order if r.trial in free and math.isfinite(r.loss)), None)
        chosen = () if best is None else (best,)
        self.promoted.setdefault(rung, []).extend(chosen)
        return Decision(chosen, len(order) // self.eta, ranking, self.cap(rung))

    def is_promoted(self, trial: Hashable, rung: int) -> bool:
        return trial in self.promoted.get(rung, [])

    def next_rung(self, rung: int) -> int | None:
        later = [r for r in self.rungs if r > rung]
        return later[0] if later else None

    def rung_pairs(self, rung: int) -> list[tuple[float, float]]:
        """(loss here, loss at the next rung) of the trials that reached both: the rung-to-rung data of
        the rung-to-rung rank correlation."""
        up = self.next_rung(rung)
        if up is None:
            return []
        above = {r.trial: r.loss for r in self.results.get(up, [])}
        return [(r.loss, above[r.trial]) for r in self.results.get(rung, []) if r.trial in above]

    @classmethod
    def rebuild(cls, rungs: Sequence[int], rung_losses: Mapping[Hashable, Mapping[int, float]],
                eta: int = DEFAULT_ETA, objectives: Mapping[Hashable, tuple[float, ...]] | None = None,
                promoted: Mapping[Hashable, Iterable[int]] | None = None, target: int | None = None) -> Ladder:
        """The ladder of a study from what its trials recorded -- what a resumed driver, or a second
        driver on the same study, knows. A trial with a loss above a rung was promoted from it; so was
        one whose record says so (``promoted``: trial -> rungs it was promoted from, for a promotion
        decided but not yet trained: a driver must record it before resuming the trial, or another
        driver may decide it again). Those promotions count toward each rung's cap. Nothing is
        decided here: ``decide(rung)`` afterwards returns the promotions now due (paused trials whose
        rank qualifies them while the cap has room), never one already made."""
        ladder = cls(tuple(rungs), eta, target)
        for trial, losses in rung_losses.items():
            ladder.merge(trial, losses, (objectives or {}).get(trial, ()), (promoted or {}).get(trial, ()))
        return ladder

    def merge(self, trial: Hashable, losses: Mapping[int, float], objectives: tuple[float, ...] = (),
              promoted: Iterable[int] = ()) -> bool:
        """Add what another driver's trial recorded (its loss at each rung it reached, its other
        objectives, the rungs it was promoted from) without deciding anything; ``rebuild`` and a
        live exchange between drivers (``npas.service.search.rung_exchange``) both use it. A trial
        with a loss above a rung was promoted from it. Returns whether anything changed."""
        reached = sorted(int(t) for t in losses if int(t) in self.rungs)
        up = set(reached[:-1]) | {int(t) for t in promoted}
        changed = False
        for t in reached:
            result = RungResult(trial, float(losses[t]), tuple(objectives))
            here = self.results.setdefault(t, [])
            old = next((r for r in here if r.trial == trial), None)
            if old is None or old.key() != result.key():
                self.results[t] = [r for r in here if r.trial != trial] + [result]
                changed = True
        for t in sorted(up & set(self.rungs)):
            if trial not in self.promoted.setdefault(t, []):
                self.promoted[t].append(trial)
                changed = True
        return changed

    def went_on(self) -> dict[int, tuple[int, int]]:
        """Each rung below the top: (trials that went on from it, trials with a result there)."""
        return {r: (len(self.promoted.get(r, [])), len(self.results.get(r, []))) for r in self.rungs[:-1]}


@dataclass(frozen=True)
class RungAgreement:
    """How well a rung's order predicts the next rung's, over the trials promoted between them: the free
    certificate every promotion gives. ``tau`` is None below ``MIN_TAU_PAIRS``."""

    rung: int
    next_rung: int
    n: int  # trials with a loss at both rungs
    tau: Interval | None  # Kendall tau with its bootstrap interval over those trials
    flips: int  # pairs of them whose order the upper rung reversed
    pairs: int  # all pairs of them


def agreement(ladder: Ladder, rung: int) -> RungAgreement | None:
    """The rung-to-rung certificate from ``rung`` to the next one; None at the top rung. Only promoted
    trials have two rungs, so this is the agreement among the better trials -- the part of the ranking
    a search acts on, and a harder test than tau over all candidates."""
    up = ladder.next_rung(rung)
    if up is None:
        return None
    pairs = ladder.rung_pairs(rung)
    lower, upper = [x for x, _ in pairs], [y for _, y in pairs]
    tau = rank_correlation(lower, upper) if len(pairs) >= MIN_TAU_PAIRS else None
    flips, total = rank_flips(lower, upper)
    return RungAgreement(rung, up, len(pairs), tau, flips, total)
