"""The statistics of a fidelity certificate: does the proxy's ranking survive longer training?

Pure functions over plain arrays, so they can be checked against known answers without training.
Inputs are the proxy losses of the validated allocations and their validated losses as an
``(allocations, seeds)`` array; seed ``s`` is the same fresh seed for every allocation, which makes
differences between allocations *paired* across seeds (a seed that happens to be lucky for one
allocation tends to be lucky for all, and the pairing cancels that part of the noise).

Why each number is there:
- Kendall tau and Spearman rho with seeded bootstrap intervals (resampling allocations): a point
  estimate on a dozen allocations says little without its interval.
- rank flips among front points: the front is where a user chooses, and a wide loss range over all
  trials makes tau easy; flips count the pairs of front points the proxy ordered the wrong way.
- signal-to-noise: the spread of allocations' seed-mean losses over the standard error of one such
  mean. Pure seed noise gives about 1; a ranking is only worth reading well above it.
- R^2 of size and compute alone: across unshared LMs parameter count alone ranks loss at
  Spearman rho ~0.95 (LiteTransformerSearch). At equal stored parameters the allocation changes
  materialised parameters and FLOPs per token; what those explain is not credit to the search.
- paired delta with a t-interval: what an allocation buys over a matched baseline, on shared seeds.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

BOOTSTRAP = 2000  # resamples; the interval's Monte Carlo error is ~0.01 at this count
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Interval:
    """A point estimate with its two-sided 95% interval (None where the data cannot give one)."""

    value: float | None
    low: float | None
    high: float | None
    n: int

    def covers(self, x: float) -> bool:
        return self.low is not None and self.high is not None and self.low <= x <= self.high

    def to_dict(self) -> dict:
        return asdict(self)


def _none_if_nan(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _tau(x: np.ndarray, y: np.ndarray) -> float:
    return float(stats.kendalltau(x, y).statistic)


def _rho(x: np.ndarray, y: np.ndarray) -> float:
    return float(stats.spearmanr(x, y).statistic)


def rank_correlation(proxy: list[float], validated: list[float], method: str = "kendall",
                     n_boot: int = BOOTSTRAP, seed: int = 0) -> Interval:
    """Kendall tau or Spearman rho between proxy and validated losses, with a 95% percentile
    bootstrap interval over allocations (seeded: the same data always gives the same interval).

    Resamples that draw one allocation only, or all-tied losses, have no correlation and are
    skipped. Fewer than 3 allocations give the point estimate (if any) and no interval.
    """
    x, y = np.asarray(proxy, float), np.asarray(validated, float)
    if x.shape != y.shape:
        raise ValueError(f"proxy and validated lengths differ: {x.shape} vs {y.shape}")
    n = len(x)
    fn = _tau if method == "kendall" else _rho
    if n < 2:
        return Interval(None, None, None, n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns on constant input and returns nan; those are skipped
        point = _none_if_nan(fn(x, y))
        if n < 3 or n_boot <= 0:  # n_boot=0: the point estimate alone
            return Interval(point, None, None, n)
        rng = np.random.default_rng(seed)
        draws = []
        for _ in range(n_boot):
            idx = rng.integers(0, n, n)
            v = fn(x[idx], y[idx])
            if math.isfinite(v):
                draws.append(v)
    if len(draws) < n_boot // 2:
        return Interval(point, None, None, n)
    alpha = (1 - CONFIDENCE) / 2
    lo, hi = np.quantile(draws, [alpha, 1 - alpha])
    return Interval(point, float(lo), float(hi), n)


def rank_flips(proxy: list[float], validated: list[float]) -> tuple[int, int]:
    """(discordant pairs, all pairs): pairs whose order by proxy loss is reversed after validation."""
    n = len(proxy)
    flips = sum(1 for i in range(n) for j in range(i + 1, n)
                if (proxy[i] - proxy[j]) * (validated[i] - validated[j]) < 0)
    return flips, n * (n - 1) // 2


def r_squared(y: list[float], *columns: list[float]) -> float | None:
    """R^2 of an ordinary least-squares fit of ``y`` on the columns plus an intercept."""
    yv = np.asarray(y, float)
    n = len(yv)
    if n < len(columns) + 2:
        return None
    X = np.column_stack([np.ones(n), *[np.asarray(c, float) for c in columns]])
    X[:, 1:] = (X[:, 1:] - X[:, 1:].mean(axis=0)) / np.where(X[:, 1:].std(axis=0) > 0, X[:, 1:].std(axis=0), 1.0)
    coef, *_ = np.linalg.lstsq(X, yv, rcond=None)
    resid = yv - X @ coef
    total = float(np.sum((yv - yv.mean()) ** 2))
    if total == 0.0:
        return None
    return float(max(0.0, 1.0 - float(np.sum(resid ** 2)) / total))


def size_and_compute(validated: list[float], flops: list[float], materialised: list[float]) -> dict:
    """How much of the validated loss FLOPs per token and materialised non-embedding parameters
    explain alone and together (stored parameters are equal by construction, so they explain nothing)."""
    log_f, log_m = np.log(flops), np.log(materialised)  # loss is ~linear in log size (scaling laws)
    return {"r2_flops": r_squared(validated, log_f), "r2_materialised": r_squared(validated, log_m),
            "r2_both": r_squared(validated, log_f, log_m), "n": len(validated)}


def paired_delta(a: list[float], b: list[float]) -> Interval:
    """mean(a_s - b_s) over shared seeds with a 95% t-interval; negative means a is better (lower loss)."""
    d = np.asarray(a, float) - np.asarray(b, float)
    n = len(d)
    if n == 0:
        return Interval(None, None, None, 0)
    mean = float(d.mean())
    if n < 2:
        return Interval(mean, None, None, n)
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1) * d.std(ddof=1) / math.sqrt(n))
    return Interval(mean, mean - half, mean + half, n)


def mean_interval(losses: list[float]) -> Interval:
    """The seed mean of one allocation with its 95% t-interval (the error bar of a validated point)."""
    return paired_delta(losses, [0.0] * len(losses))
