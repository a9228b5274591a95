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


def mean_std(xs: Sequence[float]) -> tuple[float, float]:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return math.nan, math.nan
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else math.nan)


def by_name(results: Iterable[dict[str, Any]]) -> dict[str, dict[int, float]]:
    """name -> seed -> val_loss."""
    out: dict[str, dict[int, float]] = {}
    for r in results:
        if r["val_loss"] is not None:
            out.setdefault(r["name"], {})[r["seed"]] = r["val_loss"]
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


def paired_interval(results: Iterable[dict[str, Any]], name: str, ref: str):
    """loss(name) - loss(ref) over the seeds both ran, with the 95% t-interval of
    `npas.service.fidelity.paired_delta` (negative = `name` better)."""
    from npas.service.fidelity import paired_delta

    losses = by_name(results)
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



def hypervolume_2d(points: Iterable[tuple[float, float]], ref: tuple[float, float]) -> float:
    """Area dominated by `points` (both objectives minimised) and bounded by `ref`."""
    pts = sorted((a, b) for a, b in points if a < ref[0] and b < ref[1])
    area, best_b = 0.0, ref[1]
    for a, b in pts:
        if b < best_b:
            area += (ref[0] - a) * (best_b - b)
            best_b = b
    return area


