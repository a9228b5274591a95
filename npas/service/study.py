"""Optuna studies as npas uses them: what a study and its trials record, and the front.

The study is the source of truth: resume, front and export read nothing else. Its user attributes
hold everything a resume needs; each trial's user attributes hold the allocation, its hash, the accounting and the proxy metrics.
Constraints (Optuna 5 `set_constraint`) keep the budget and, for trials stopped early by ASHA, the
missing fidelity, so plain `optuna.load_study(...).best_trials` already returns the full-fidelity
front within budget.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from npas.allocation.config import ArchConfig
from npas.errors import StudyError
from npas.service.storage import redact, study_names

# ---- the attribute schema (readable from optuna-dashboard and plain optuna) -------------------
# study.user_attrs
S_VERSION, S_SPACE_TEXT, S_SPACE_HASH, S_SPACE_NAME, S_SPACE_SOURCE = (
    "npas_version", "space_text", "space_hash", "space_name", "space_source")
S_BUDGET, S_BUDGET_SPEC, S_REFERENCE = "budget_params", "budget_spec", "reference_params"
S_RECIPE, S_DATA, S_FINGERPRINT, S_VOCAB = "recipe", "data_source", "data_fingerprint", "vocab_size"
S_OBJECTIVES, S_SAMPLER, S_SEED, S_EARLY_STOP, S_TARGET = "objectives", "sampler", "seed", "early_stop", "target_trials"
S_READY = "npas_ready"  # written last at creation: a study without it is still being set up (or its creator died)
# trial.user_attrs
T_STATUS = "npas_status"  # ok | failed | stopped | infeasible | duplicate | orphaned | interrupted | surplus
T_REASON = "failure_reason"
T_BASELINE = "baseline"  # name of the hand-crafted baseline, or absent
T_KNOBS, T_ALLOC, T_HASH, T_ACCOUNTING = "knobs", "allocation", "allocation_hash", "accounting"
T_PROXY, T_FIDELITY, T_MAX_FIDELITY, T_CURVE = "proxy", "fidelity", "max_fidelity", "curve"
T_KEY, T_FILL, T_DRIVER, T_RETRY_OF, T_NODE = "trial_key", "budget_fill", "driver", "retry_of", "ray_node"
T_SAME_AS = "same_as"  # for a duplicate: the trial whose result stands
T_RETRIES = "retries"  # times Ray Tune restarted the trial after its worker or node died
C_BUDGET, C_FIDELITY = "budget", "fidelity"

def trial_key(cfg: ArchConfig, recipe: dict, fingerprint: str) -> str:
    """Idempotency key: the same allocation, recipe (seed included) and data give the same result."""
    blob = json.dumps({"a": cfg.hash, "r": recipe, "d": fingerprint}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def load(name: str, storage: optuna.storages.BaseStorage, url: str,
         sampler: optuna.samplers.BaseSampler | None = None) -> optuna.Study:
    """Load an npas study by name; unknown names list what the storage holds."""
    names = study_names(storage)
    if name not in names:
        have = ", ".join(names[:10]) or "none"
        raise StudyError(f"no study {name!r} in {redact(url)} (studies there: {have}); "
                         f"start one with `npas search SPACE.yaml --study {name}`")
    study = optuna.load_study(study_name=name, storage=storage, sampler=sampler)
    if S_SPACE_TEXT not in study.user_attrs:
        raise StudyError(f"study {name!r} in {redact(url)} was not created by npas (no space recorded)")
    return study


# ---- reading trials back -------------------------------------------------------------------
def status(t: FrozenTrial) -> str:
    if t.state == TrialState.RUNNING:
        return "running"
    if t.state == TrialState.WAITING:
        return "waiting"
    return str(t.user_attrs.get(T_STATUS, "ok" if t.state == TrialState.COMPLETE else "failed"))


def is_full_fidelity(t: FrozenTrial) -> bool:
    return t.state == TrialState.COMPLETE and t.constraints.get(C_FIDELITY, 0.0) <= 0.0


def counts_toward_target(t: FrozenTrial) -> bool:
    """Trials that ran (or run) a proxy: complete, running, or failed in the worker."""
    return t.state in (TrialState.COMPLETE, TrialState.RUNNING) or (
        t.state == TrialState.FAIL and status(t) == "failed")


def front_trials(study: optuna.Study) -> list[FrozenTrial]:
    """The Pareto front: complete, within budget, full fidelity (Optuna applies the constraints)."""
    return sorted(study.best_trials, key=lambda t: t.values[0])


@dataclass(frozen=True)
class FrontRow:
    trial: int
    values: tuple[float, ...]
    stored_params: int
    flops_per_token: int
    summary: str
    baseline: str
    hash: str


def front_rows(study: optuna.Study) -> list[FrontRow]:
    rows = []
    for t in front_trials(study):
        acc = t.user_attrs.get(T_ACCOUNTING, {})
        alloc = t.user_attrs.get(T_ALLOC)
        rows.append(FrontRow(
            trial=t.number, values=tuple(t.values), stored_params=int(acc.get("stored_params", 0)),
            flops_per_token=int(acc.get("flops_per_token", 0)),
            summary=ArchConfig.from_dict(alloc).summary() if alloc else "",
            baseline=str(t.user_attrs.get(T_BASELINE, "")), hash=str(t.user_attrs.get(T_HASH, "")),
        ))
    return rows


def front_frame(study: optuna.Study):
    """The front as a pandas DataFrame, one column per objective."""
    import pandas as pd

    names = list(study.metric_names or study.user_attrs.get(S_OBJECTIVES, []))
    records = []
    for r in front_rows(study):
        rec: dict[str, Any] = {"trial": r.trial}
        rec.update({n: v for n, v in zip(names, r.values, strict=False)})
        rec.update({"stored_params": r.stored_params, "flops_per_token": r.flops_per_token,
                    "baseline": r.baseline, "allocation": r.summary, "hash": r.hash})
        records.append(rec)
    return pd.DataFrame.from_records(records, columns=["trial", *names, "stored_params", "flops_per_token",
                                                       "baseline", "allocation", "hash"])
