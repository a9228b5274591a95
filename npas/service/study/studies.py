"""Optuna studies as npas uses them: loading, reading trials back, and the front.

The study is the source of truth: its user attributes hold everything a resume needs (the
`StudyRecord` in `npas.service.study.record`); each trial's user attributes hold the allocation, its hash,
the accounting and the proxy metrics.
Constraints (Optuna 5 `set_constraint`) keep the budget and, for trials stopped early by ASHA, the
missing fidelity, so plain `optuna.load_study(...).best_trials` returns the full-fidelity front within
budget for every study npas has written so far. npas does not lean on that: the front is read at the top
rung T explicitly (`reached_top`: the steps trained against the steps asked), because a promotion ladder
may tell the sampler something else about a trial it stopped below T, and a trial at a
lower rung has a loss from a shorter run, which would dominate the trials that finished at T.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from npas.allocation.config import ArchConfig
from npas.allocation.fill import FILL_TARGET, FIT_VERSION
from npas.allocation.space import LOSS_OBJECTIVES
from npas.errors import StudyError
from npas.service.study.noise import seed_std, seed_values
from npas.service.study.record import Constraint, StudyAttr, StudyRecord, TrialAttr, is_ready
from npas.service.study.storage import StorageHandle, study_names


def trial_key(cfg: ArchConfig, recipe: dict, fingerprint: str) -> str:
    """Idempotency key: the same allocation, recipe (seed included) and data give the same result."""
    blob = json.dumps({"a": cfg.hash, "r": recipe, "d": fingerprint}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def load(name: str, handle: StorageHandle, sampler: optuna.samplers.BaseSampler | None = None) -> optuna.Study:
    """Load an npas study by name; unknown names list what the storage holds."""
    names = study_names(handle.storage)
    if name not in names:
        have = ", ".join(names[:10]) or "none"
        raise StudyError(f"no study {name!r} in {handle.redacted} (studies there: {have}); "
                         f"start one with `npas search SPACE.yaml --study {name}`")
    study = optuna.load_study(study_name=name, storage=handle.storage, sampler=sampler)
    if StudyAttr.SPACE_TEXT not in study.user_attrs:
        raise StudyError(f"study {name!r} in {handle.redacted} was not created by npas (no space recorded)")
    return study


def read_record(study: optuna.Study) -> StudyRecord:
    return StudyRecord.from_attrs(study.user_attrs, study.study_name)


def write_record(study: optuna.Study, record: StudyRecord) -> None:
    for key, value in record.to_attrs().items():
        study.set_user_attr(key, value)


def mark_ready(study: optuna.Study) -> None:
    """Written last at creation (after the baselines): a driver joining by name waits for it."""
    study.set_user_attr(StudyAttr.READY, True)


def is_set_up(study: optuna.Study) -> bool:
    """Marked ready by its creator, or (a study from before the marker) it has already run trials."""
    if is_ready(study.user_attrs):
        return True
    ran = (TrialState.RUNNING, TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)
    return bool(study.get_trials(deepcopy=False, states=ran))


def same_key(study: optuna.Study, key: str | None, number: int,
             states: tuple[TrialState, ...] = (TrialState.COMPLETE, TrialState.RUNNING)) -> int | None:
    """Another trial with the same idempotency key (allocation, recipe, data), or None."""
    for t in study.get_trials(deepcopy=False, states=states):
        if t.number != number and t.user_attrs.get(TrialAttr.KEY) == key:
            return t.number
    return None


# ---- reading trials back -------------------------------------------------------------------
def status(t: FrozenTrial) -> str:
    if t.state == TrialState.RUNNING:
        return "running"
    if t.state == TrialState.WAITING:
        return "waiting"
    return str(t.user_attrs.get(TrialAttr.STATUS, "ok" if t.state == TrialState.COMPLETE else "failed"))


NOT_EVALUATED = ("infeasible",)  # statuses of COMPLETE trials whose values are placeholders, not results


def was_evaluated(t: FrozenTrial) -> bool:
    """COMPLETE with objective values a proxy run produced.

    An infeasible ask is told COMPLETE with a violated `fit` constraint when the sampler learns from
    constraints (TPE): its values are placeholders. It never counts toward the target, reaches the
    front, a pick, validate's sample or a dashboard's count of completed trials."""
    return t.state == TrialState.COMPLETE and t.user_attrs.get(TrialAttr.STATUS) not in NOT_EVALUATED


def reached_top(t: FrozenTrial) -> bool:
    """Trained to the recipe's whole length T, the ladder's top rung: its values are losses at T.

    The record says so twice: the steps trained (`fidelity`) against the steps asked
    (`max_fidelity`), and the fidelity constraint. Both must agree; a trial from before either was
    recorded is judged by the one it has."""
    done, asked = t.user_attrs.get(TrialAttr.FIDELITY), t.user_attrs.get(TrialAttr.MAX_FIDELITY)
    if _is_number(done) and _is_number(asked) and done < asked:
        return False
    return t.constraints.get(Constraint.FIDELITY, 0.0) <= 0.0


def _is_number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def is_full_fidelity(t: FrozenTrial) -> bool:
    return was_evaluated(t) and reached_top(t)


def counts_toward_target(t: FrozenTrial) -> bool:
    """Trials that ran (or run) a proxy: evaluated, running, or failed in the worker."""
    return was_evaluated(t) or t.state == TrialState.RUNNING or (
        t.state == TrialState.FAIL and status(t) == "failed")


def front_trials(study: optuna.Study) -> list[FrozenTrial]:
    """The Pareto front at the top rung: non-dominated among the trials that are complete, evaluated,
    feasible (every constraint <= 0: within budget) and reached T (`reached_top`). Only those compete,
    so a trial stopped at a lower rung never knocks a trial at T off the front, whatever the sampler
    was told about it. Dominance is Optuna's (no worse everywhere, better somewhere; equal points
    both stay), so on every study npas wrote before the ladder this is `study.best_trials`."""
    pool = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if is_full_fidelity(t) and t.values is not None and all(v <= 0.0 for v in t.constraints.values())]
    return sorted(pareto(pool, study.directions), key=lambda t: (t.values[0], t.number))


def pareto(trials: list[FrozenTrial], directions: list[StudyDirection]) -> list[FrozenTrial]:
    """The non-dominated trials of ``trials`` under ``directions`` (equal points all stay)."""
    signs = [1.0 if d == StudyDirection.MINIMIZE else -1.0 for d in directions]
    points = sorted(((tuple(s * v for s, v in zip(signs, t.values, strict=True)), t) for t in trials),
                    key=lambda p: (p[0], p[1].number))
    front: list[tuple[tuple[float, ...], FrozenTrial]] = []
    for p, t in points:  # lexicographic order: nothing later dominates anything earlier
        if not any(all(a <= b for a, b in zip(q, p, strict=True)) and q != p for q, _ in front):
            front.append((p, t))
    return [t for _, t in front]


@dataclass(frozen=True)
class FrontRow:
    trial: int
    values: tuple[float, ...]
    stored_params: int
    flops_per_token: int
    summary: str
    baseline: str
    hash: str
    loss_std: float | None = None  # std over the trial's seeds (`--repeats`), in the loss objective's unit
    seeds: int = 1
    lr_factor: float | None = None  # the located factor x the fair rate; None: the trial located none (x1)
    fill: float | None = None  # stored / budget (`budget_fill`); None: not recorded
    fit_version: int = 1  # the fit that sampled the allocation; trials from before versions were recorded are 1
    short: str = ""  # why it stores under the fill target; "" when it does not (or never said)

    @property
    def under_filled(self) -> bool:
        """Stores under the fill target of its budget: compared with candidates holding more of it."""
        return self.fill is not None and self.fill < FILL_TARGET


def _loss_objective(study: optuna.Study) -> str:
    names = list(study.metric_names or study.user_attrs.get(StudyAttr.OBJECTIVES, []))
    return next((n for n in names if n in LOSS_OBJECTIVES), "val_loss")


def front_rows(study: optuna.Study) -> list[FrontRow]:
    loss = _loss_objective(study)
    rows = []
    for t in front_trials(study):
        acc = t.user_attrs.get(TrialAttr.ACCOUNTING, {})
        alloc = t.user_attrs.get(TrialAttr.ALLOC)
        rows.append(FrontRow(
            trial=t.number, values=tuple(t.values), stored_params=int(acc.get("stored_params", 0)),
            flops_per_token=int(acc.get("flops_per_token", 0)),
            summary=ArchConfig.from_dict(alloc).summary() if alloc else "",
            baseline=str(t.user_attrs.get(TrialAttr.BASELINE, "")), hash=str(t.user_attrs.get(TrialAttr.HASH, "")),
            loss_std=seed_std(t, loss), seeds=max(1, len(seed_values(t, loss))),
            lr_factor=_float_or_none(t.user_attrs.get(TrialAttr.LR_FACTOR)),
            fill=_float_or_none(t.user_attrs.get(TrialAttr.FILL)),
            fit_version=int(t.user_attrs.get(TrialAttr.FIT_VERSION) or 1),
            short=str(t.user_attrs.get(TrialAttr.SHORT) or ""),
        ))
    return rows


def front_frame(study: optuna.Study):
    """The front as a pandas DataFrame, one column per objective, then `loss_std`: the std of the
    loss objective over each trial's seeds (NaN with one seed, `--repeats 1`) and `seeds`; then
    `lr_factor` (the located learning-rate factor, 1.0 where a trial has none) when any front trial
    has one: a study from before rates were located shows the columns it always did. `fill` is
    stored / budget and `under_filled` marks a trial under the fill target, which competes with
    less of the budget than the others; `fit_version` is listed when some front trial was sampled
    by an older fit (a resumed study keeps the allocations it stored)."""
    import pandas as pd

    names = list(study.metric_names or study.user_attrs.get(StudyAttr.OBJECTIVES, []))
    rows = front_rows(study)
    located = any(r.lr_factor is not None for r in rows)
    records = []
    for r in rows:
        rec: dict[str, Any] = {"trial": r.trial}
        rec.update({n: v for n, v in zip(names, r.values, strict=False)})
        rec.update({"loss_std": r.loss_std, "seeds": r.seeds, "stored_params": r.stored_params,
                    "flops_per_token": r.flops_per_token, "baseline": r.baseline, "allocation": r.summary,
                    "hash": r.hash, "lr_factor": 1.0 if r.lr_factor is None else r.lr_factor,
                    "fill": r.fill, "under_filled": r.under_filled, "fit_version": r.fit_version,
                    "short": r.short})
        records.append(rec)
    # an objective that is also an accounting column (flops_per_token) is listed once
    extra = [c for c in ("stored_params", "flops_per_token") if c not in names]
    rate = ["lr_factor"] if located else []
    versions = ["fit_version"] if any(r.fit_version != FIT_VERSION for r in rows) else []
    return pd.DataFrame.from_records(records, columns=["trial", *names, "loss_std", "seeds", *rate, *extra,
                                                       "fill", "under_filled", *versions, "baseline", "allocation",
                                                       "hash", "short"])


def _float_or_none(x: object) -> float | None:
    return float(x) if _is_number(x) else None
