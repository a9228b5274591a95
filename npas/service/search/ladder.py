"""The promotion ladder's rule: which trials at a rung go on to the next one. Pure: no I/O, no Ray.

Trials start at the first rung (a WSD run's cooldown fork at horizon/16 by default,
``Recipe.fork_rungs``) and the best move up. The rule is asynchronous successive halving (ASHA, Li et
al. 2020): a rung never waits to fill. Whenever a trial reports at a rung, the rung's ``n`` results so
far are ranked and its top ``n // eta`` are promoted -- those not yet promoted go on now, the others
stay paused and may be promoted later, when more trials have reached the rung and the quota has
grown. Promotions are never taken back. So workers never idle waiting for a rung to fill, and a
trial that would be in the top 1/eta of the finished rung is promoted by the time the rung is full.

Ranking is multi-objective, as the study is: non-dominated fronts (Deb et al.'s sort) on (rung loss,
the study's other objectives, all minimized), and within a front by rung loss -- a multi-objective
search must not promote only the lowest losses, or the front's cheap end never reaches the top rung.

Ties at the boundary. Two losses closer than the seed noise are not told apart by one run, so the
rule does not let run-to-run noise alone decide the last place: the trial ranked right after the
boundary (the last one inside the quota) is promoted with it when the two losses differ by at most
``NOISE_SIGMAS`` (2, as ``npas.service.study.noise``) times the noise of their difference,
sqrt(std_a^2 + std_b^2). That is one extra trial per decision at most, so noise can cost at most one
promotion more than the quota.

Where the noise comes from (``estimate_noise``). Each result may carry its own ``std``: with
``--repeats R`` the loss is the seed mean and its std is the trial's seed std / sqrt(R). Without it
(``--repeats 1``), in order of preference:
  1. ``seeds``: the pooled seed std of the study's trials that did train several seeds (earlier
     ``--repeats`` runs, or ``--init-from`` trials), each weighted by its degrees of freedom;
  2. ``residual``: once at least ``MIN_RESIDUAL_PAIRS`` trials have losses at two rungs, the std of the
     residuals of a least-squares line from the lower rung's losses to the upper's, over sqrt(2). It
     holds both rungs' noise and any genuine reordering, so it is an upper bound on the seed noise:
     it errs towards calling a boundary a tie, which the one-extra cap bounds;
  3. ``default``: ``DEFAULT_SEED_STD`` = 0.010 nats, the long-run seed standard error measured on
     ``bench/proxy_fidelity.py``'s cached runs (issue #33: 12 candidates at 400k stored params, two
     seeds; twice the noise of a gap, 0.028 nats, is what separated resolvable pairs there).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from npas.service.certify.fidelity import Interval, rank_correlation, rank_flips
from npas.service.study.noise import NOISE_SIGMAS

DEFAULT_ETA = 4  # the default rungs are 4x apart (horizon/16, /4, /1): keep the top quarter of each
DEFAULT_SEED_STD = 0.010  # nats; see the module docstring (issue #33's long-run seed standard error)
MIN_RESIDUAL_PAIRS = 10  # fewer trials with two rungs give a residual std too loose to use
MIN_TAU_PAIRS = 10  # a rung-to-rung tau over fewer trials is not shown (issue #34: suppressed below 10)


@dataclass(frozen=True)
class RungResult:
    """One trial's result at one rung. ``objectives`` are the study's other objectives, oriented so
    that lower is better (negate a maximized one); ``std`` is the standard error of ``loss`` when the
    trial knows it (its seed std / sqrt(repeats)), else None and the rung's noise estimate is used."""

    trial: Hashable
    loss: float
    objectives: tuple[float, ...] = ()
    std: float | None = None

    def key(self) -> tuple[float, ...]:
        """The point ranked: NaN (a diverged run) counts as +inf, so it is dominated by every finite one."""
        return tuple(math.inf if math.isnan(v) else v for v in (self.loss, *self.objectives))


@dataclass(frozen=True)
class Noise:
    """The per-run noise of a rung loss (nats) and where it came from."""

    std: float
    source: Literal["given", "seeds", "residual", "default"]
    n: int = 0  # what it was estimated from: seed degrees of freedom, or rung pairs


@dataclass(frozen=True)
class Decision:
    """The outcome of ranking one rung: who goes on now, and why."""

    promote: tuple[Hashable, ...]  # newly promoted trials, best first
    quota: int  # n // eta of the rung's n results
    ranking: tuple[Hashable, ...]  # every result's trial, best first
    boundary: Hashable | None = None  # the last trial inside the quota
    tie: Hashable | None = None  # the trial after the boundary promoted with it, being within the noise


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


def _sigma(r: RungResult, noise: Noise) -> float:
    return noise.std if r.std is None else r.std


def within_noise(a: RungResult, b: RungResult, noise: Noise) -> bool:
    """Whether two finite rung losses differ by at most NOISE_SIGMAS std of their difference."""
    if not (math.isfinite(a.loss) and math.isfinite(b.loss)):
        return False
    return abs(a.loss - b.loss) <= NOISE_SIGMAS * math.hypot(_sigma(a, noise), _sigma(b, noise))


def decide(results: Sequence[RungResult], promoted: Iterable[Hashable], eta: int = DEFAULT_ETA,
           noise: Noise | None = None) -> Decision:
    """Rank a rung's results so far and return the trials to promote now: the top ``n // eta`` not
    already promoted, plus the next one when its loss is within the noise of the boundary's. A
    diverged (non-finite) result is never promoted."""
    if eta < 2:
        raise ValueError(f"eta must be >= 2 (the fraction 1/eta of a rung moves on), got {eta}")
    noise = noise or Noise(DEFAULT_SEED_STD, "default")
    done = set(promoted)
    order = rank(results)
    quota = len(order) // eta
    chosen = [r for r in order[:quota] if math.isfinite(r.loss)]
    boundary = chosen[-1] if chosen else None
    tie = None
    if boundary is not None and quota < len(order) and within_noise(boundary, order[quota], noise):
        tie = order[quota]
        chosen.append(tie)
    return Decision(
        promote=tuple(r.trial for r in chosen if r.trial not in done), quota=quota,
        ranking=tuple(r.trial for r in order), boundary=None if boundary is None else boundary.trial,
        tie=None if tie is None or tie.trial in done else tie.trial)


def estimate_noise(seed_stds: Sequence[tuple[float, int]] = (), rung_pairs: Sequence[tuple[float, float]] = (),
                   default: float = DEFAULT_SEED_STD) -> Noise:
    """The per-run noise of a rung loss when the results carry none (``--repeats 1``); see the module
    docstring. ``seed_stds``: (std over a trial's seeds, its number of seeds) for the study's trials
    that trained several; ``rung_pairs``: (loss at a rung, loss at the next) of promoted trials."""
    dof = [(s, n - 1) for s, n in seed_stds if n >= 2 and math.isfinite(s)]
    if dof:
        total = sum(d for _, d in dof)
        return Noise(math.sqrt(sum(d * s * s for s, d in dof) / total), "seeds", total)
    pairs = [(x, y) for x, y in rung_pairs if math.isfinite(x) and math.isfinite(y)]
    if len(pairs) >= MIN_RESIDUAL_PAIRS:
        xs, ys = zip(*pairs, strict=True)
        if statistics.pvariance(xs) > 0:
            slope, intercept = statistics.linear_regression(xs, ys)
            resid = [y - (slope * x + intercept) for x, y in pairs]
            return Noise(math.sqrt(sum(e * e for e in resid) / (len(pairs) - 2)) / math.sqrt(2), "residual",
                         len(pairs))
    return Noise(default, "default")


@dataclass
class Ladder:
    """The rung bookkeeping of one search: every result reported at every rung and who was promoted
    from where. ``report`` records a result and decides its rung; promotions are final."""

    rungs: tuple[int, ...]
    eta: int = DEFAULT_ETA
    noise: Noise = field(default_factory=lambda: Noise(DEFAULT_SEED_STD, "default"))
    results: dict[int, list[RungResult]] = field(default_factory=dict)
    promoted: dict[int, list[Hashable]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rungs = tuple(sorted(set(self.rungs)))
        if not self.rungs:
            raise ValueError("a ladder needs at least one rung")

    @property
    def top(self) -> int:
        return self.rungs[-1]

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
            return Decision((), 0, tuple(r.trial for r in rank(results)))
        d = decide(results, self.promoted.get(rung, []), self.eta, self.noise)
        self.promoted.setdefault(rung, []).extend(d.promote)
        return d

    def is_promoted(self, trial: Hashable, rung: int) -> bool:
        return trial in self.promoted.get(rung, [])

    def next_rung(self, rung: int) -> int | None:
        later = [r for r in self.rungs if r > rung]
        return later[0] if later else None

    def rung_pairs(self, rung: int) -> list[tuple[float, float]]:
        """(loss here, loss at the next rung) of the trials that reached both: the rung-to-rung data of
        a residual noise estimate and of the rung-to-rung rank correlation."""
        up = self.next_rung(rung)
        if up is None:
            return []
        above = {r.trial: r.loss for r in self.results.get(up, [])}
        return [(r.loss, above[r.trial]) for r in self.results.get(rung, []) if r.trial in above]

    @classmethod
    def rebuild(cls, rungs: Sequence[int], rung_losses: Mapping[Hashable, Mapping[int, float]],
                eta: int = DEFAULT_ETA, noise: Noise | None = None,
                objectives: Mapping[Hashable, tuple[float, ...]] | None = None,
                promoted: Mapping[Hashable, Iterable[int]] | None = None) -> Ladder:
        """The ladder of a study from what its trials recorded -- what a resumed driver, or a second
        driver on the same study, knows. A trial with a loss above a rung was promoted from it; so was
        one whose record says so (``promoted``: trial -> rungs it was promoted from, for a promotion
        decided but not yet trained: a driver must record it before resuming the trial, or another
        driver may decide it again). Nothing is decided here: ``decide(rung)`` afterwards returns the
        promotions now due (paused trials whose rank qualifies them), never one already made."""
        ladder = cls(tuple(rungs), eta, noise or Noise(DEFAULT_SEED_STD, "default"))
        for trial, losses in rung_losses.items():
            ladder.merge(trial, losses, (objectives or {}).get(trial, ()), (promoted or {}).get(trial, ()))
        return ladder

    def merge(self, trial: Hashable, losses: Mapping[int, float], objectives: tuple[float, ...] = (),
              promoted: Iterable[int] = (), stds: Mapping[int, float] | None = None) -> bool:
        """Add what another driver's trial recorded (its loss at each rung it reached, its other
        objectives, the rungs it was promoted from, the standard error of a rung's loss when it knows
        one) without deciding anything; ``rebuild`` and a
        live exchange between drivers (``npas.service.search.rung_exchange``) both use it. A trial
        with a loss above a rung was promoted from it. Returns whether anything changed."""
        reached = sorted(int(t) for t in losses if int(t) in self.rungs)
        up = set(reached[:-1]) | {int(t) for t in promoted}
        changed = False
        for t in reached:
            result = RungResult(trial, float(losses[t]), tuple(objectives), (stds or {}).get(t))
            here = self.results.setdefault(t, [])
            old = next((r for r in here if r.trial == trial), None)
            if old is None or (old.key(), old.std) != (result.key(), result.std):
                self.results[t] = [r for r in here if r.trial != trial] + [result]
                changed = True
        for t in sorted(up & set(self.rungs)):
            if trial not in self.promoted.setdefault(t, []):
                self.promoted[t].append(trial)
                changed = True
        return changed

    def update_noise(self, seed_stds: Sequence[tuple[float, int]] = ()) -> Noise:
        """Re-estimate the noise from the study's seed stds and every rung-to-rung pair so far
        (``estimate_noise``); a search calls this as results arrive, so later decisions use more data."""
        pairs = [p for r in self.rungs for p in self.rung_pairs(r)]
        self.noise = estimate_noise(seed_stds, pairs, self.noise.std if self.noise.source == "given"
                                    else DEFAULT_SEED_STD)
        return self.noise


@dataclass(frozen=True)
class RungAgreement:
    """How well a rung's order predicts the next rung's, over the trials promoted between them: the free
    certificate every promotion gives (issue #34 item 5). ``tau`` is None below ``MIN_TAU_PAIRS``."""

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
