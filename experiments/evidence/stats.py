"""Seed statistics of the evidence: per-arm mean and spread, paired (same-seed) differences with their
95% t-interval, and the second edition's verdict rule ("reproduced" only when the interval excludes 0
in the paper's direction; parity claims against a 0.02-nat margin).

Seeds are the recipe seed: it sets the initialisation and the batch order, and the validation windows
are fixed, so arms that share a seed are scored on the same text and their difference is paired.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from report import fmt_interval


def mean_std(xs: Sequence[float]) -> tuple[float, float]:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return math.nan, math.nan
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else math.nan)


def by_name(results: Iterable[dict[str, Any]], split: str = "val_loss") -> dict[str, dict[int, float]]:
    """name -> seed -> loss on `split` ("val_loss", or "test_loss" where the run recorded it)."""
    out: dict[str, dict[int, float]] = {}
    for r in results:
        if r.get(split) is not None:
            out.setdefault(r["name"], {})[r["seed"]] = r[split]
    return out


def summarize(results: list[dict[str, Any]], names: Sequence[str], ref: str | None) -> list[dict[str, Any]]:
    """Per config: mean/std of val loss over seeds, and the paired (same-seed) difference to `ref`."""
    losses = by_name(results)
    walls: dict[str, list[float]] = {}
    for r in results:
        walls.setdefault(r["name"], []).append(r["wall_s"])
    rows = []
    for name in names:
        per_seed = losses.get(name, {})
        m, s = mean_std(list(per_seed.values()))
        row = {"name": name, "mean": m, "std": s, "n": len(per_seed), "per_seed": per_seed,
               "wall_s": statistics.fmean(walls.get(name, [math.nan]))}
        if ref is not None and ref in losses:
            diffs = [per_seed[k] - losses[ref][k] for k in per_seed if k in losses[ref]]
            row["delta_mean"], row["delta_std"] = mean_std(diffs)
            row["wins"] = sum(d < 0 for d in diffs)
        rows.append(row)
    return rows


# Claims of "on par" are tested one-sided against this margin: the arm may be worse by less than 0.02
# nats/char (about 1% of these models' loss, the size of an effect a seed claim calls "parity").
PARITY_MARGIN = 0.02


def paired_interval(results: Iterable[dict[str, Any]], name: str, ref: str, split: str = "val_loss"):
    """loss(name) - loss(ref) on `split` over the seeds both ran, with the 95% t-interval of
    `npas.service.study.fidelity.paired_delta` (negative = `name` better)."""
    from npas.service.study.fidelity import paired_delta

    losses = by_name(results, split)
    a, b = losses.get(name, {}), losses.get(ref, {})
    seeds = sorted(set(a) & set(b))
    return paired_delta([a[k] for k in seeds], [b[k] for k in seeds])


def claim_verdict(interval, kind: str, margin: float = PARITY_MARGIN) -> tuple[bool, str]:
    """Whether a paired difference reproduces a claim, and why, from its 95% interval only.

    kind "better": the arm beats the reference; reproduced only if the whole interval is below 0.
    kind "parity": the arm reaches the reference's loss; reproduced only if the whole interval is
    below +margin (non-inferiority: worse by less than the margin, at 95%; better by any amount counts).
    A mean without an interval (one seed) reproduces nothing."""
    if kind not in ("better", "parity"):
        raise ValueError(f"claim kind {kind!r}: use 'better' or 'parity'")
    bound = 0.0 if kind == "better" else margin
    at = "0" if bound == 0 else f"{bound:+.2f}"
    if interval.low is None or interval.high is None:
        return False, f"no interval from {interval.n} seed(s); run --seeds 2 or more"
    if interval.high < bound:
        return True, f"the interval is below {at}"
    if interval.low > bound:
        return False, f"contradicted: the interval is above {at}"
    return False, f"the interval covers {at}"


def verdict_of(interval, kind: str, margin: float = PARITY_MARGIN) -> str:
    """The report's verdict words for a claim: "reproduced", "contradicted", or "unresolved at this
    scale" with the interval's width (the second edition's rule, from `claim_verdict`)."""
    ok, why = claim_verdict(interval, kind, margin)
    if ok:
        return "reproduced"
    if why.startswith("contradicted"):
        return "contradicted"
    if interval.low is None or interval.high is None:
        return "unresolved (too few seeds)"
    return f"unresolved at this scale (interval width {interval.high - interval.low:.3f})"


def split_verdict(results: list[dict[str, Any]], name: str, ref: str, kind: str,
                  margin: float = PARITY_MARGIN) -> str:
    """`verdict_of` on the validation split, kept only if the test split (which every evidence run also
    scores, on text no run selects by) gives the same verdict; otherwise "unresolved", naming both.

    A verdict is a statement about the allocations, not about one set of windows: one whose interval
    clears its bound on one split and not on the other (atoms - sequential tying at lr x2: lower bound
    +0.0004 on validation, [-0.0007, +0.0224] on test) rests on where the text was cut. Runs without a
    test loss leave the validation verdict as it is."""
    val = verdict_of(paired_interval(results, name, ref), kind, margin)
    test_iv = paired_interval(results, name, ref, "test_loss")
    if test_iv.value is None:
        return val
    test = verdict_of(test_iv, kind, margin)
    if test.split(" (")[0] == val.split(" (")[0]:
        return val
    return f"unresolved (the splits disagree: validation {val.split(' (')[0]}; test {fmt_interval(test_iv)}, {test.split(' (')[0]})"


# The project's rule for a learning-rate check: an optimum counts as located only when it is interior to
# its grid. At an edge the loss may go on falling past the last point tried, so "x2 is best of x0.5, x1,
# x2" says the optimum is at x2 *or beyond*, and a comparison "at each arm's best rate" is then at a rate
# no arm was shown to be best at.
def optimum_located(best: float, grid: Sequence[float]) -> bool:
    return min(grid) < best < max(grid)


def optimum_words(best: float | None, grid: Sequence[float], base: float = 1.0) -> str:
    """The check's optimum as the tables print it: `x1`, or `x2 (moved; grid edge: not located)`."""
    if best is None:
        return "incomplete"
    notes = ([] if best == base else ["moved"]) + ([] if optimum_located(best, grid) else ["grid edge: not located"])
    return f"x{best:g}" + (f" ({'; '.join(notes)})" if notes else "")



def hypervolume_2d(points: Iterable[tuple[float, float]], ref: tuple[float, float]) -> float:
    """Area dominated by `points` (both objectives minimised) and bounded by `ref`."""
    pts = sorted((a, b) for a, b in points if a < ref[0] and b < ref[1])
    area, best_b = 0.0, ref[1]
    for a, b in pts:
        if b < best_b:
            area += (ref[0] - a) * (best_b - b)
            best_b = b
    return area


