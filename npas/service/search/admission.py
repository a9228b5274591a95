"""From an asked Optuna trial to a runnable candidate, or to the reason it must not run.

Everything here is decided on the driver before any worker is involved: sampling (whatever raises
there ends the trial as FAIL with its reason instead of leaving it RUNNING), the budget fit, the
analytic accounting and the budget constraint, conditions that would make the worker raise on every
attempt (so Ray never retries them), and duplicates of a trial that already ran or runs.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import optuna

from npas.allocation.budget import count
from npas.allocation.config import ArchConfig
from npas.allocation.space import LOSS_OBJECTIVES, Space
from npas.service.execution.outcome import objective_values
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
    kept, version = kept_allocation(trial)
    if kept is None and not cand.feasible:
        return Skip("infeasible", cand.reason or "does not fit the budget")
    cfg = ArchConfig.from_dict(kept) if kept is not None else cand.config
    version = version if kept is not None else cand.fit_version
    acc = count(cfg, batch_size=recipe["batch_size"], seq_len=recipe["seq_len"])
    key = trial_key(cfg, recipe, fingerprint)
    fill = space.budgeted(acc) / space.budget_params
    for attr, value in ((TrialAttr.ALLOC, cfg.to_dict()), (TrialAttr.HASH, cfg.hash),
                        (TrialAttr.ACCOUNTING, acc.to_dict()), (TrialAttr.KEY, key),
                        (TrialAttr.FILL, round(fill, 6)), (TrialAttr.FIT_VERSION, version),
                        (TrialAttr.MAX_FIDELITY, recipe["steps"])):
        trial.set_user_attr(attr, value)
    if kept is None and cand.short:
        trial.set_user_attr(TrialAttr.SHORT, cand.short)
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


def kept_allocation(trial: optuna.Trial) -> tuple[dict | None, int]:
    """The allocation a re-run must train, and the fit version that made it; (None, 0) for a new trial.

    A re-run trains what its first attempt was fitted with, whatever the current fit would make of
    the same knobs: a paused ladder trial resumes from a checkpoint of those shapes, and a study's
    results stay comparable with what it already ran. `faults.requeue` carries the allocation; a
    re-run enqueued by an npas that did not is found through the trial it retries."""
    ua = trial.user_attrs
    if TrialAttr.ALLOC in ua:
        return ua[TrialAttr.ALLOC], int(ua.get(TrialAttr.FIT_VERSION, 1))
    retried = ua.get(TrialAttr.RETRY_OF)
    if retried is None:
        return None, 0
    first = next((t for t in trial.study.get_trials(deepcopy=False) if t.number == retried), None)
    if first is None or TrialAttr.ALLOC not in first.user_attrs:
        return None, 0  # its first attempt stopped before it was fitted: the current fit makes it
    return first.user_attrs[TrialAttr.ALLOC], int(first.user_attrs.get(TrialAttr.FIT_VERSION, 1))


def cannot_run(cfg: ArchConfig, recipe: dict) -> str | None:
    """What would make the worker raise on every attempt, so it is refused before launch."""
    seq_len = int(recipe.get("seq_len", 0))
    if seq_len > cfg.chassis.context:
        return (f"the recipe trains at seq_len={seq_len} > this allocation's context {cfg.chassis.context}; "
                f"lower seq_len or raise the searched context")
    return None


def ranked_objectives(objectives: Sequence[str]) -> list[str]:
    """The study's objectives the ladder ranks on beside the rung loss: all but the losses (every loss
    objective is the rung loss in another unit)."""
    return [o for o in objectives if o not in LOSS_OBJECTIVES]


def objective_config(objectives: Sequence[str], accounting: dict[str, Any]) -> dict[str, float]:
    """The other objectives' values a trial reports at every rung, from its accounting (known before it
    trains: sizes, and memory's analytic stand-in); those with no value there are left out."""
    out = {}
    for o in ranked_objectives(objectives):
        with contextlib.suppress(KeyError):
            out[o] = objective_values([o], accounting, None, 0.0)[0]
    return out
