"""How a finished proxy run becomes Optuna objective values and a fidelity constraint.

A trial stopped early by ASHA ends with its last intermediate report, not the worker's final
metrics, so every objective needs a value that does not depend on the proxy having finished:
losses come from the last evaluation, sizes from the analytic accounting, and the measured peak
memory falls back to the accounting's training-memory estimate (what the proxy itself reports on
CPU, where torch has no allocator statistics).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

# objective -> the accounting field that stands in for it when the proxy's measurement is missing
ANALYTIC_STAND_IN = {"peak_memory_bytes": "train_memory_bytes"}


def objective_values(objectives: Sequence[str], accounting: Mapping[str, Any], proxy: Mapping[str, Any] | None,
                     loss: float, tokens_per_byte: float | None = None) -> list[float]:
    """One value per objective, in the study's order; raises KeyError naming an objective nothing provides.

    ``tokens_per_byte`` is the validation windows' (``training.proxy.eval_tokens_per_byte``): bits per
    byte is derived from ``loss`` with it, so an early-stopped trial gets one from its last report.
    """
    metrics: dict[str, Any] = {**accounting, **(proxy or {}), "val_loss": loss, "val_bpc": loss / math.log(2)}
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
