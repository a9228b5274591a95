"""How a finished proxy run becomes Optuna objective values and a fidelity constraint.

A trial stopped early by ASHA ends with its last intermediate report, not the worker's final
metrics, so every objective needs a value that does not depend on the proxy having finished:
losses come from the last evaluation, sizes from the analytic accounting, and the measured peak
memory falls back to the accounting's training-memory estimate (what the proxy itself reports on
CPU, where torch has no allocator statistics).

With `npas search --repeats R` a trial trains its allocation on R seeds (`repeat_seeds`) and
`combine_repeats` makes one proxy record of them: the loss objective is the mean over the seeds, and
the per-seed losses travel beside it to the trial's user attributes (`seed_attrs`), where `npas
front` and `npas export` read the seed noise.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from npas.errors import StudyError
from npas.service.study.record import TrialAttr

# Repeat r trains from seed `recipe.seed + SEED_STRIDE * r`. A proxy run draws its init from its seed
# s and its batch order from s + 1 (npas.training.proxy), so a stride of 2 keeps every repeat's two
# random streams apart from every other repeat's. Seed index r is the same seed in every trial of a
# study, which is what lets `npas export` pair two trials' losses seed by seed.
SEED_STRIDE = 2
MAX_REPEATS = 64  # a bound on `--repeats` far above any useful R (each seed is one more proxy run)

# objective -> the accounting field that stands in for it when the proxy's measurement is missing
ANALYTIC_STAND_IN = {"peak_memory_bytes": "train_memory_bytes"}


def objective_values(objectives: Sequence[str], accounting: Mapping[str, Any], proxy: Mapping[str, Any] | None,
                     loss: float, tokens_per_byte: float | None = None) -> list[float]:
    """One value per objective, in the study's order; raises KeyError naming an objective nothing provides.

    ``tokens_per_byte`` is the validation windows' (``training.proxy.eval_tokens_per_byte``): bits per
    byte is derived from ``loss`` with it, so an early-stopped trial gets one from its last report.
    """
    metrics: dict[str, Any] = {**accounting, **(proxy or {}), "val_loss": loss, "val_bpc": loss / math.log(2)}
    if (proxy or {}).get("recursion"):  # per-token recursion: the KV cache at the causal rule's realised depth
        metrics["kv_cache_bytes_per_token"] = proxy["recursion"]["kv_cache_bytes_per_token"]
    if tokens_per_byte is not None:
        metrics["val_bpb"] = loss * tokens_per_byte / math.log(2)
    for objective, stand_in in ANALYTIC_STAND_IN.items():
        if metrics.get(objective) is None and stand_in in accounting:
            metrics[objective] = accounting[stand_in]
    missing = [o for o in objectives if metrics.get(o) is None]
    if missing:
        raise KeyError(f"no value for objective(s) {', '.join(missing)}")
    return [float(metrics[o]) for o in objectives]


def fidelity_constraint(steps: int, max_steps: int) -> float:
    """0 at full fidelity, else the fraction of the recipe's steps not trained (> 0 is infeasible)."""
    return 0.0 if steps >= max_steps else (max_steps - steps) / max_steps


def check_repeats(repeats: int | None) -> None:
    """Seeds per trial, checked before the database or Ray is touched (None: the study's or 1)."""
    if repeats is not None and (isinstance(repeats, bool) or not isinstance(repeats, int)
                                or not 1 <= repeats <= MAX_REPEATS):
        raise StudyError(f"--repeats must be a whole number from 1 to {MAX_REPEATS}, got {repeats!r}; "
                         f"e.g. --repeats 3 trains each trial on 3 seeds")


def repeat_seeds(seed: int, repeats: int) -> tuple[int, ...]:
    """The training seeds of a trial's R repeats: the recipe's own seed first, so R=1 trains exactly
    what a study without repeats trained."""
    return tuple(int(seed) + SEED_STRIDE * r for r in range(int(repeats)))


def loss_std(losses: Sequence[float]) -> float | None:
    """Sample standard deviation (ddof=1) of per-seed losses; None with fewer than two."""
    return statistics.stdev(losses) if len(losses) >= 2 else None


def combine_repeats(runs: Sequence[Mapping[str, Any]], seeds: Sequence[int]) -> dict[str, Any]:
    """One trial's proxy record from its seeds' completed runs (`ProxyResult.to_dict()` each, status ok).

    Losses (val_loss, val_bpc, train_loss) are means over the seeds, and so is the curve, point by
    point at the steps every seed evaluated, so the curve ends at the objective value. Memory is the
    maximum over seeds: the same allocation under the same recipe needs the same memory on every
    seed (the CPU figure is analytic and identical), and where CUDA's measurement differs by a few
    allocator blocks the maximum never understates what a run needs. `steps_done` is the least any
    seed reached, `wall_s` the sum (what the trial cost) and `tokens_per_s` the mean. The seeds and
    their losses are added as `seeds` and `seed_losses` for `seed_attrs` to move to the trial.
    """
    if not runs or len(runs) != len(seeds):
        raise ValueError(f"{len(runs)} runs for {len(seeds)} seeds")
    out = dict(runs[0])
    losses = [float(r["val_loss"]) for r in runs]

    def mean_of(key: str) -> float | None:
        vals = [r.get(key) for r in runs]
        return None if any(v is None for v in vals) else statistics.fmean(vals)

    out["val_loss"] = statistics.fmean(losses)
    out["val_bpc"] = out["val_loss"] / math.log(2)
    out["train_loss"] = mean_of("train_loss")
    out["tokens_per_s"] = mean_of("tokens_per_s")
    out["steps_done"] = min(int(r["steps_done"]) for r in runs)
    out["wall_s"] = sum(float(r.get("wall_s") or 0.0) for r in runs)
    for key in ("peak_memory_bytes", "rss_delta_bytes"):
        out[key] = max(int(r.get(key) or 0) for r in runs)
    curves = [{int(s): v for s, v in r.get("curve") or ()} for r in runs]
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    out["curve"] = [[s, None if any(c[s] is None for c in curves) else statistics.fmean(c[s] for c in curves)]
                    for s in steps]
    if any("rung_losses" in r for r in runs):  # WSD: each rung's finished loss, meaned like the curve
        rungs = [{int(t): v for t, v in (r.get("rung_losses") or {}).items()} for r in runs]
        out["rung_losses"] = {t: None if any(g[t] is None for g in rungs) else statistics.fmean(g[t] for g in rungs)
                              for t in sorted(set.intersection(*(set(g) for g in rungs)))}
        out["steps_trained"] = sum(int(r.get("steps_trained") or 0) for r in runs)  # the trial's cost, like wall_s
    if all(r.get("recursion") for r in runs):  # both rules' losses, the realised depth and its costs: seed means
        out["recursion"] = {k: [statistics.fmean(x) for x in zip(*(r["recursion"][k] for r in runs), strict=True)]
                            if isinstance(v, list) else statistics.fmean(r["recursion"][k] for r in runs)
                            for k, v in runs[0]["recursion"].items()}
        out["flops_per_token"] = round(out["recursion"]["flops_per_token"])
    out["seeds"] = [int(s) for s in seeds]
    out["seed_losses"] = losses
    return out


def rung_attrs(proxy: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split a WSD proxy record's ``rung_losses`` ({t: loss of a WSD run of length t}, the losses the
    ladder ranked on) off into the trial's own `rung_losses` attribute, keyed by the step as text (what
    JSON storage keeps), and a located run's own losses (``--locate-lr``) into `located_rung_losses`;
    a cosine record has neither and passes through unchanged."""
    keys = {"rung_losses": TrialAttr.RUNG_LOSSES, "located_rung_losses": TrialAttr.LOCATED_RUNG_LOSSES}
    rest = {k: v for k, v in proxy.items() if k not in keys}
    return rest, {attr: rung_losses_attr(proxy[k].items()) for k, attr in keys.items() if k in proxy}


def rung_losses_attr(points: Any) -> dict[str, float | None]:
    """``{"t": loss}`` in ascending t from (t, loss) pairs; non-finite losses become None."""
    return {str(int(t)): (float(v) if v is not None and math.isfinite(float(v)) else None)
            for t, v in sorted(points, key=lambda p: int(p[0]))}


def seed_attrs(proxy: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split a proxy record into the record kept as the trial's `proxy` attribute and the per-seed
    user attributes (seeds, per-seed losses, their std). A record without seeds (a worker of an
    older npas) gives no per-seed attributes."""
    rest = {k: v for k, v in proxy.items() if k not in ("seeds", "seed_losses")}
    if "seed_losses" not in proxy:
        return rest, {}
    losses = [float(v) for v in proxy["seed_losses"]]
    return rest, {TrialAttr.SEEDS: list(proxy["seeds"]), TrialAttr.SEED_LOSSES: losses,
                  TrialAttr.LOSS_STD: loss_std(losses)}
