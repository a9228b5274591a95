"""Seed noise of a front: per-seed losses of trials run with `npas search --repeats R`, and whether
one front point's loss advantage over another is larger than that noise.

Every trial of a study trains seed index r on the same seed (`npas.service.execution.outcome.repeat_seeds`),
so the same batches in the same order: two trials' losses are compared seed by seed (paired), which
removes the part of the noise both runs share. An advantage counts as resolved when the mean of the
per-seed differences exceeds `NOISE_SIGMAS` times their standard deviation (ddof=1). A study run
with one seed per trial knows no noise at all, and says so rather than calling anything resolved.

The same statistics over a matrix of losses (allocations x seeds: `pooled_seed_std`, `paired_std`,
`signal_to_noise`) are what the fidelity certificate reports: this module is the one home of
seed-noise statistics, per trial and pooled.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from optuna.trial import FrozenTrial

from npas.service.study.record import TrialAttr

NOISE_SIGMAS = 2.0  # an advantage inside 2 paired std is not told apart from seed noise


def seed_values(t: FrozenTrial, objective: str = "val_loss") -> list[float]:
    """The trial's per-seed losses in the unit of `objective` (nats for val_loss, bits for
    val_bpc); empty for a trial recorded without them (a study from before `--repeats`)."""
    losses = [float(v) for v in t.user_attrs.get(TrialAttr.SEED_LOSSES) or ()]
    return [v / math.log(2) for v in losses] if objective == "val_bpc" else losses


def seed_std(t: FrozenTrial, objective: str = "val_loss") -> float | None:
    """Sample std (ddof=1) over the trial's seeds; None with fewer than two."""
    values = seed_values(t, objective)
    return statistics.stdev(values) if len(values) >= 2 else None


def seeds_per_trial(trials: Sequence[FrozenTrial]) -> int:
    """The fewest seeds any of these trials trained on (1 for trials recorded without seeds)."""
    return min((max(1, len(t.user_attrs.get(TrialAttr.SEED_LOSSES) or ())) for t in trials), default=1)


@dataclass(frozen=True)
class Gap:
    """How much lower `better`'s loss is than `other`'s, paired over their common seeds."""

    better: int  # trial numbers
    other: int
    advantage: float  # mean over seeds of other - better (in the objective's unit); > 0: better is lower
    paired_std: float | None  # std (ddof=1) of the per-seed differences; None with fewer than two seeds
    seeds: int  # seeds paired

    @property
    def resolved(self) -> bool | None:
        """True: beyond the noise; False: inside it; None: the noise is unknown (one seed)."""
        if self.paired_std is None:
            return None
        return self.advantage > NOISE_SIGMAS * self.paired_std


def paired_gap(better: FrozenTrial, other: FrozenTrial, loss_index: int, objective: str = "val_loss") -> Gap:
    """The loss gap between two trials, paired seed index by seed index where both trained the same
    seed; without per-seed losses (one seed) it is the gap of the objective values, noise unknown."""
    a, b = seed_values(better, objective), seed_values(other, objective)
    sa, sb = better.user_attrs.get(TrialAttr.SEEDS) or [], other.user_attrs.get(TrialAttr.SEEDS) or []
    diffs = [y - x for i, (x, y) in enumerate(zip(a, b, strict=False))
             if i >= len(sa) or i >= len(sb) or sa[i] == sb[i]]
    if len(diffs) < 2:
        return Gap(better.number, other.number, other.values[loss_index] - better.values[loss_index], None,
                   max(1, len(diffs)))
    return Gap(better.number, other.number, statistics.fmean(diffs), statistics.stdev(diffs), len(diffs))


def next_best(chosen: FrozenTrial, pool: Sequence[FrozenTrial], loss_index: int) -> FrozenTrial | None:
    """The point of `pool` ranked right after `chosen` by loss (ties: the lower trial number), or None
    when `chosen` has the highest loss there."""
    rest = [t for t in pool if t.number != chosen.number
            and (t.values[loss_index], t.number) > (chosen.values[loss_index], chosen.number)]
    return min(rest, key=lambda t: (t.values[loss_index], t.number), default=None)


def describe(gap: Gap, objective: str, decides: str | None) -> str:
    """One line on whether `gap` is beyond the seed noise. `decides` names a pick that chose by this
    loss (min-loss, max-memory=...): a pick the data cannot resolve starts with "unresolved:"."""
    what = (f"trial {gap.better}'s {objective} is {gap.advantage:.4f} below trial {gap.other}'s "
            f"(the next-best front point by {objective})")
    if gap.resolved is None:
        head = "unresolved" if decides else "noise unknown"
        why = (f"{what}, but the study trained each trial on one seed, so its seed noise is unknown; "
               f"search with --repeats 2 or more to tell")
    elif gap.resolved:
        head = "resolved"
        why = f"{what}, beyond {NOISE_SIGMAS:g} paired std ({NOISE_SIGMAS:g} × {gap.paired_std:.4f} over {gap.seeds} seeds)"
    else:
        head = "unresolved" if decides else "inside noise"
        why = (f"{what}, inside {NOISE_SIGMAS:g} paired std ({NOISE_SIGMAS:g} × {gap.paired_std:.4f} over "
               f"{gap.seeds} seeds): the two are not told apart")
    if decides and gap.resolved is not True:
        why += f"; --pick {decides} chose trial {gap.better} anyway (see also --pick trial={gap.other})"
    return f"{head}: {why}"


# ---- pooled over a matrix of losses: allocations x seeds (the fidelity certificate) ----------
def _losses(losses) -> np.ndarray:
    a = np.asarray(losses, float)
    if a.ndim != 2:
        raise ValueError(f"losses must be (allocations, seeds), got shape {a.shape}")
    return a


def pooled_seed_std(losses) -> float | None:
    """Pooled within-allocation std across seeds: the noise of one run (needs >= 2 seeds)."""
    a = _losses(losses)
    if a.shape[1] < 2 or a.shape[0] < 1:
        return None
    return float(math.sqrt(np.mean(np.var(a, axis=1, ddof=1))))


def paired_std(losses) -> float | None:
    """Std across seeds of the difference between two allocations, pooled over all pairs.

    This is the noise a seed-paired comparison of two allocations sees; it is below
    ``sqrt(2) * pooled_seed_std`` when seeds move all allocations together.
    """
    a = _losses(losses)
    k, s = a.shape
    if k < 2 or s < 2:
        return None
    var = [np.var(a[i] - a[j], ddof=1) for i in range(k) for j in range(i + 1, k)]
    return float(math.sqrt(np.mean(var)))


def signal_to_noise(losses) -> float | None:
    """std across allocations of their seed-mean loss / (within-allocation seed std / sqrt(S)).

    Under pure noise the seed means scatter by exactly one standard error, so the ratio is ~1;
    an SNR of 3 means allocations differ three times more than seed noise can explain.
    """
    a = _losses(losses)
    k, s = a.shape
    noise = pooled_seed_std(a)
    if k < 2 or noise is None:
        return None
    signal = float(np.std(a.mean(axis=1), ddof=1))
    if noise == 0.0:
        return math.inf if signal > 0 else None
    return signal / (noise / math.sqrt(s))
