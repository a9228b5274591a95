"""From an asked Optuna trial to a runnable candidate, or to the reason it must not run.

Everything here is decided on the driver before any worker is involved: sampling (whatever raises
there ends the trial as FAIL with its reason instead of leaving it RUNNING), the budget fit, the
analytic accounting and the budget constraint, conditions that would make the worker raise on every
attempt (so Ray never retries them), and duplicates of a trial that already ran or runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import optuna

from npas.allocation.budget import count
from npas.allocation.config import ArchConfig
from npas.allocation.space import Space
from npas.service.search.samplers import baseline_fixed
from npas.service.study.record import Constraint, TrialAttr
from npas.service.study.studies import same_key, trial_key

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Runnable:
    config: dict[str, Any]  # what the Tune trainable receives
    accounting: dict[str, Any]


@dataclass(frozen=True)
class Skip:
    status: Literal["sample_error", "infeasible", "duplicate"]
    reason: str
    same_as: int | None = None  # for a duplicate: the trial whose result stands


def prepare(trial: optuna.Trial, space: Space, recipe: dict, fingerprint: str,
            twin_of: Callable[[str, int], int | None] | None = None) -> Runnable | Skip:
    """Sample, fit, account and record one candidate on the trial's user attributes.

    `twin_of(key, number)` finds another trial with the same key (the driver passes its incremental
    `StudyTally.twin`); without it the study's trials are read."""
    baseline = trial.user_attrs.get(TrialAttr.BASELINE)
    try:
        cand = space.sample(trial, fixed=baseline_fixed(trial, space, TrialAttr.BASELINE))
    except Exception as e:  # SampleError, or any bug in sampling
        log.warning("sampling trial %d failed: %s", trial.number, e)
        return Skip("sample_error", f"sampling raised {type(e).__name__}: {e}"[:2000])
    trial.set_user_attr(TrialAttr.KNOBS, cand.values)
    if not cand.feasible:
        return Skip("infeasible", cand.reason or "does not fit the budget")
    cfg = cand.config
    acc = count(cfg, batch_size=recipe["batch_size"], seq_len=recipe["seq_len"])
    key = trial_key(cfg, recipe, fingerprint)
    for attr, value in ((TrialAttr.ALLOC, cfg.to_dict()), (TrialAttr.HASH, cfg.hash),
                        (TrialAttr.ACCOUNTING, acc.to_dict()), (TrialAttr.KEY, key),
                        (TrialAttr.FILL, round(cand.fill, 6)), (TrialAttr.MAX_FIDELITY, recipe["steps"])):
        trial.set_user_attr(attr, value)
    trial.set_constraint(Constraint.BUDGET, float(space.budgeted(acc) - space.budget_params))
    if (reason := cannot_run(cfg, recipe)) is not None:
        return Skip("infeasible", reason)
    twin = twin_of(key, trial.number) if twin_of is not None else same_key(trial.study, key, trial.number)
    if twin is not None:
        return Skip("duplicate", f"same allocation, recipe and data as trial {twin}", same_as=twin)
    config = {"allocation": cfg.to_dict(), "recipe": recipe, "number": trial.number, "baseline": baseline}
    for attr, key in ((TrialAttr.LADDER_CHECKPOINT, "resume_from"), (TrialAttr.LADDER_DIR, "resume_dir"),
                      (TrialAttr.STEPS_BEFORE, "steps_before")):  # re-enqueued: where, and what, it had trained
        if (value := trial.user_attrs.get(attr)) is not None:
            config[key] = value
    return Runnable(config, acc.to_dict())


def cannot_run(cfg: ArchConfig, recipe: dict) -> str | None:
    """What would make the worker raise on every attempt, so it is refused before launch."""
    seq_len = int(recipe.get("seq_len", 0))
    if seq_len > cfg.chassis.context:
        return (f"the recipe trains at seq_len={seq_len} > this allocation's context {cfg.chassis.context}; "
                f"lower seq_len or raise the searched context")
    return None
