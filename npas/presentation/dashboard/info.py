"""What each dashboard figure shows, computed from a study and nothing else (Optuna's info/render split).

Every function here is pure: it reads trials and study attributes and returns plain data, so the
tests assert on numbers, not pixels. `render.py` draws these; `report.py` assembles the page. The
allocation grid and MLP taper of the front's trials are in `allocations.py`.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field

import numpy as np
import optuna
from optuna.trial import FrozenTrial, TrialState

from npas.allocation.budget import count
from npas.allocation.config import ArchConfig, reference_config
from npas.allocation.knob_table import knob_label
from npas.allocation.space_parser import parse_space
from npas.errors import NpasError
from npas.service.certify.certificate import CERTIFICATE_ATTR
from npas.service.study.fidelity import mean_interval
from npas.service.study.optuna_adapter import hypervolume
from npas.service.study.record import Constraint, StudyAttr, TrialAttr
from npas.service.study.studies import front_trials, is_full_fidelity, status, was_evaluated

log = logging.getLogger(__name__)

IMPORTANCE_MIN_TRIALS = 8  # fewer full-fidelity trials than this: importance is noise, and costs time


def metric_names(study: optuna.Study) -> list[str]:
    names = study.metric_names or study.user_attrs.get(StudyAttr.OBJECTIVES) or []
    return [str(n) for n in names] or [f"objective {i}" for i in range(len(study.directions))]


def label(t: FrozenTrial) -> str:
    """`#3`, or `#0 narrow_untied` for a baseline: how every figure names a trial."""
    base = t.user_attrs.get(TrialAttr.BASELINE)
    return f"#{t.number} {base}" if base else f"#{t.number}"


def within_budget(t: FrozenTrial) -> bool:
    return t.constraints.get(Constraint.BUDGET, 0.0) <= 0.0


def feasible(t: FrozenTrial) -> bool:
    """Complete, full fidelity (reached T) and within budget: what the front is drawn from."""
    return is_full_fidelity(t) and all(v <= 0.0 for v in t.constraints.values())


# ---- the header ----------------------------------------------------------------------------
@dataclass(frozen=True)
class SummaryInfo:
    study_name: str
    space_name: str
    objectives: list[str]
    budget_params: int | None
    budget_spec: str | None
    reference_params: int | None
    n_trials: int
    by_status: dict[str, int]  # npas status -> count, over every trial
    n_complete: int
    n_front: int
    reasons: dict[str, int]  # failure reason -> count, for trials that never gave values

    @property
    def empty_note(self) -> str | None:
        """A sentence for a study with nothing to plot yet, else None."""
        if self.n_trials == 0:
            return "This study has no trials yet."
        if self.n_complete == 0:
            return (f"None of the {self.n_trials} trial(s) has completed yet "
                    f"({', '.join(f'{n} {s}' for s, n in sorted(self.by_status.items()))}).")
        return None


def summary_info(study: optuna.Study) -> SummaryInfo:
    ua = study.user_attrs
    trials = study.get_trials(deepcopy=False)
    by_status: dict[str, int] = {}
    reasons: dict[str, int] = {}
    for t in trials:
        by_status[status(t)] = by_status.get(status(t), 0) + 1
        if t.state == TrialState.FAIL:
            why = str(t.user_attrs.get(TrialAttr.REASON) or "no reason recorded").splitlines()[0][:160]
            reasons[why] = reasons.get(why, 0) + 1
    complete = [t for t in trials if was_evaluated(t)]  # not infeasible asks told COMPLETE for the sampler
    return SummaryInfo(
        study_name=study.study_name, space_name=str(ua.get(StudyAttr.SPACE_NAME, "?")), objectives=metric_names(study),
        budget_params=ua.get(StudyAttr.BUDGET), budget_spec=ua.get(StudyAttr.BUDGET_SPEC), reference_params=ua.get(StudyAttr.REFERENCE),
        n_trials=len(trials), by_status=by_status, n_complete=len(complete),
        n_front=len(front_trials(study)) if complete else 0, reasons=reasons,
    )


# ---- Pareto front --------------------------------------------------------------------------
@dataclass(frozen=True)
class ParetoPoint:
    number: int
    values: tuple[float, ...]
    label: str
    baseline: str  # "" unless a hand-crafted baseline
    on_front: bool
    full_fidelity: bool  # False: stopped early by ASHA, values at a lower fidelity
    within_budget: bool
    loss_std: float | None = None  # std of the per-seed losses of a --repeats trial; None with one seed
    n_seeds: int = 1


@dataclass(frozen=True)
class ReferenceMark:
    """The untied uniform 1x model of the space, costed analytically on objective `metric`."""

    metric: str
    value: float
    params: int


@dataclass(frozen=True)
class ParetoInfo:
    names: list[str]  # objective names; the figure plots names[0] (loss) against names[1]
    points: list[ParetoPoint]
    front: list[int]  # trial numbers on the front, by increasing objective 0
    no_values: dict[str, int]  # status -> count of trials without values (infeasible, failed, ...)
    budget_params: int | None
    budget_spec: str | None
    reference: ReferenceMark | None


def reference_mark(study: optuna.Study, names: list[str]) -> ReferenceMark | None:
    """The reference model's cost on the second objective, if the space and recipe say it."""
    if len(names) < 2:
        return None

    ua = study.user_attrs
    try:
        over = ua.get("overrides") or {}
        space = parse_space(ua[StudyAttr.SPACE_TEXT], str(ua.get(StudyAttr.SPACE_SOURCE, study.study_name)))
        space = space.rebind(over, vocab_size=ua.get(StudyAttr.VOCAB))
        rec = ua.get(StudyAttr.RECIPE) or {}
        acc = count(reference_config(space.reference_chassis, space.dtype),
                    batch_size=int(rec.get("batch_size", 1)), seq_len=rec.get("seq_len"))
    except (KeyError, TypeError, ValueError, NpasError) as e:
        log.debug("no reference mark for %s: %s", study.study_name, e)
        return None
    value = acc.to_dict().get(names[1])
    return None if value is None else ReferenceMark(names[1], float(value), acc.stored_params)


def pareto_info(study: optuna.Study) -> ParetoInfo:
    names = metric_names(study)
    front = [t.number for t in front_trials(study)] if study.get_trials(
        deepcopy=False, states=(TrialState.COMPLETE,)) else []
    on_front = set(front)
    points, no_values = [], {}
    for t in study.get_trials(deepcopy=False):
        if was_evaluated(t) and t.values is not None:
            points.append(ParetoPoint(
                number=t.number, values=tuple(float(v) for v in t.values), label=label(t),
                baseline=str(t.user_attrs.get(TrialAttr.BASELINE) or ""), on_front=t.number in on_front,
                full_fidelity=is_full_fidelity(t), within_budget=within_budget(t),
                loss_std=_float_or_none(t.user_attrs.get(TrialAttr.LOSS_STD)),
                n_seeds=len(t.user_attrs.get(TrialAttr.SEED_LOSSES) or ()) or 1))
        else:
            no_values[status(t)] = no_values.get(status(t), 0) + 1
    ua = study.user_attrs
    return ParetoInfo(names=names, points=points, front=front, no_values=no_values,
                      budget_params=ua.get(StudyAttr.BUDGET), budget_spec=ua.get(StudyAttr.BUDGET_SPEC),
                      reference=reference_mark(study, names))


def _float_or_none(x: object) -> float | None:
    return None if x is None else float(x)


# ---- hypervolume ---------------------------------------------------------------------------
@dataclass(frozen=True)
class HypervolumeInfo:
    names: list[str]  # objective names, for the reference point's units
    trial_numbers: list[int]  # complete trials, in order
    values: list[float]  # normalised hypervolume of the feasible trials up to each one, in [0, 1]
    reference_point: list[float] | None  # worst x 1.1 over complete full-fidelity trials (raw units)
    ideal_point: list[float] | None  # best over the same trials: normalisation maps [ideal, ref] -> [0, 1]
    note: str | None = None


def hypervolume_info(study: optuna.Study) -> HypervolumeInfo:
    """Hypervolume after each complete trial, with Optuna's own exact algorithm (WFG).

    Optuna 5 has no public hypervolume function; `npas.service.study.optuna_adapter.hypervolume` wraps the
    one `optuna.visualization.plot_hypervolume_history` uses. Each objective is scaled so the best
    value seen is 0 and the reference point (worst x 1.1) is 1: the result is the fraction of that
    box the front dominates, comparable across studies of different scales.
    """
    names = metric_names(study)
    complete = sorted(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)), key=lambda t: t.number)
    full = [t for t in complete if is_full_fidelity(t)]
    if len(study.directions) < 2:
        return HypervolumeInfo(names, [], [], None, None, "a single objective has no hypervolume; see the trials table")
    if not full:
        return HypervolumeInfo(names, [], [], None, None, "no complete full-fidelity trial yet")
    signs = np.array([1.0 if d == optuna.study.StudyDirection.MINIMIZE else -1.0 for d in study.directions])
    vals = np.array([t.values for t in full], dtype=float) * signs
    worst, best = vals.max(axis=0), vals.min(axis=0)
    ref = np.where(worst > 0, worst * 1.1, worst * 0.9)  # "x 1.1" away from the front, whatever the sign
    span = np.where(ref - best > 0, ref - best, 1.0)
    numbers, hv, kept = [], [], []
    current = 0.0
    for t in complete:
        if feasible(t):
            p = (np.asarray(t.values, dtype=float) * signs - best) / span
            if (p < 1.0).all():
                kept.append(p)
                current = hypervolume(kept, np.ones(len(p)))
        numbers.append(t.number)
        hv.append(current)
    note = None if kept else "no feasible (within budget, full fidelity) trial yet"
    return HypervolumeInfo(names, numbers, hv, [float(x) for x in ref * signs], [float(x) for x in best * signs], note)


# ---- learning curves -------------------------------------------------------------------------
@dataclass(frozen=True)
class CurvesInfo:
    max_fidelity: int | None
    curves: list[tuple[int, str, list[int], list[float]]]  # (trial number, label, steps, validation losses)
    note: str | None = None


def curves_info(study: optuna.Study) -> CurvesInfo:
    curves, top = [], None
    for t in front(study):
        pts = t.user_attrs.get(TrialAttr.CURVE) or []
        top = t.user_attrs.get(TrialAttr.MAX_FIDELITY, top)
        if pts:
            curves.append((t.number, label(t), [int(s) for s, _ in pts], [float(v) for _, v in pts]))
    note = None if curves else "no front trial has a recorded learning curve yet"
    return CurvesInfo(top, curves, note)


# ---- parameter importance ------------------------------------------------------------------------
@dataclass(frozen=True)
class ImportanceInfo:
    per_objective: list[tuple[str, dict[str, float]]]  # (objective, param -> importance), each may be {}
    n_trials: int  # the full-fidelity searched trials the importances come from
    notes: dict[str, str] = field(default_factory=dict)  # objective -> why it has no importances
    labels: dict[str, str] = field(default_factory=dict)  # param -> where the space file sets it (knob table)


def importance_info(study: optuna.Study, min_trials: int = IMPORTANCE_MIN_TRIALS) -> ImportanceInfo:
    """`optuna.importance.get_param_importances` per objective (PED-ANOVA, conditional-aware).

    Baselines are enqueued with fixed values and no sampled params, and ASHA-stopped trials hold
    values at a lower fidelity, so both would bias the estimate: importances are computed on a
    throw-away in-memory study holding the complete full-fidelity searched trials only.
    """
    names = metric_names(study)
    usable = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
              if is_full_fidelity(t) and t.params]
    if len(usable) < min_trials:
        why = f"needs at least {min_trials} complete full-fidelity searched trials, the study has {len(usable)}"
        return ImportanceInfo([(n, {}) for n in names], len(usable), {n: why for n in names})
    out, notes = [], {}
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "study created in memory" line per report
    try:
        scratch = optuna.create_study(directions=study.directions)
    finally:
        optuna.logging.set_verbosity(verbosity)
    scratch.add_trials(usable)
    for i, name in enumerate(names):
        try:
            with warnings.catch_warnings():  # "fewer than 2 trials in a regime": the note below says so
                warnings.simplefilter("ignore")
                imp = optuna.importance.get_param_importances(scratch, target=lambda t, i=i: t.values[i])
        except (ValueError, RuntimeError, ZeroDivisionError) as e:
            imp, notes[name] = {}, f"not computable: {e}"
        if not imp and name not in notes:
            notes[name] = "no parameter varies across these trials"
        out.append((name, {k: float(v) for k, v in imp.items()}))
    labels = {p: knob_label(p) for _, imp in out for p in imp}
    return ImportanceInfo(out, len(usable), notes, labels)


def front(study: optuna.Study) -> list[FrozenTrial]:
    """The front's trials, as every front figure shows them (none before a trial completes)."""
    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        return []
    return front_trials(study)


# ---- proxy vs validated (the fidelity certificate of `npas validate`) -----------------------------
@dataclass(frozen=True)
class FidelityInfo:
    points: list[tuple[int, str, float, float, float | None, float | None, bool]]
    # (trial, label, proxy loss, validated seed mean, its 95% low, high, on the front)
    tau_all: dict | None = None  # Interval dicts as the certificate stores them
    tau_front: dict | None = None
    snr: float | None = None
    split: str = "test"
    recipe: str = ""
    note: str | None = None


def fidelity_info(study: optuna.Study) -> FidelityInfo:
    """The certificate stored in the study by `npas validate`, as points with seed-mean intervals."""
    cert = study.user_attrs.get(CERTIFICATE_ATTR)
    if not cert:
        return FidelityInfo([], note=f"no fidelity certificate yet: run `npas validate {study.study_name}`")
    points = []
    for r in cert.get("allocations", []):
        if not r.get("complete") or r.get("trial") is None or r.get("proxy_loss") is None:
            continue
        iv = mean_interval(r["test_losses"])
        name = f"#{r['trial']}" + (f" {r['label']}" if r.get("label") and "baseline" in r["roles"] else "")
        points.append((int(r["trial"]), name, float(r["proxy_loss"]), float(iv.value), iv.low, iv.high,
                       "front" in r["roles"]))
    note = None if points else "the certificate has no complete validated trial yet"
    return FidelityInfo(points, cert["all"]["kendall_tau"], cert["front"]["kendall_tau"], cert.get("snr"),
                        cert.get("split", "test"), cert.get("recipe", ""), note)


# ---- the trials table ------------------------------------------------------------------------------
def trials_frame(study: optuna.Study):
    """Every trial as one row of a pandas DataFrame, raw numbers (the renderer formats them)."""
    import pandas as pd

    names = metric_names(study)
    budget = study.user_attrs.get(StudyAttr.BUDGET)
    records = []
    for t in study.get_trials(deepcopy=False):
        ua = t.user_attrs
        acc, alloc = ua.get(TrialAttr.ACCOUNTING) or {}, ua.get(TrialAttr.ALLOC)
        rec: dict = {"trial": t.number, "state": t.state.name.lower(), "status": status(t)}
        for i, n in enumerate(names):
            rec[n] = t.values[i] if t.values is not None and i < len(t.values) else None
        stored = acc.get("stored_params")
        rec["stored_params"] = stored
        if Constraint.BUDGET in t.constraints:  # the constraint as told: stored - budget
            rec["budget_margin"] = -t.constraints[Constraint.BUDGET]
        else:
            rec["budget_margin"] = budget - stored if budget is not None and stored is not None else None
        rec["fill"] = ua.get(TrialAttr.FILL)  # stored / budget
        rec["fit_version"] = int(ua.get(TrialAttr.FIT_VERSION) or 1) if alloc else None  # absent = the first fit
        rec["short"] = ua.get(TrialAttr.SHORT) or ""
        rec["fidelity"] = ua.get(TrialAttr.FIDELITY)
        rec["max_fidelity"] = ua.get(TrialAttr.MAX_FIDELITY)
        rec["lr_factor"] = ua.get(TrialAttr.LR_FACTOR)  # None: the trial located no rate (x1)
        rec["baseline"] = ua.get(TrialAttr.BASELINE) or ""
        try:
            rec["allocation"] = ArchConfig.from_dict(alloc).summary() if alloc else ""
        except NpasError:
            rec["allocation"] = "(unreadable allocation)"
        rec["reason"] = ua.get(TrialAttr.REASON) or ""
        records.append(rec)
    columns = ["trial", "state", "status", *names, "stored_params", "budget_margin", "fill", "fit_version", "short",
               "fidelity", "max_fidelity", "lr_factor", "baseline", "allocation", "reason"]
    return pd.DataFrame.from_records(records, columns=columns)
