"""Choosing one trial of a study's front: `knee | min-loss | max-memory=BYTES | trial=N`.

A space lists its objectives in any order (`[train_memory_bytes, val_loss]` is as valid as the
reverse) and may have only one, so every pick finds the objective it needs by name, never by
position, and a pick the objectives cannot answer is refused with the objectives the study has.
`noise_note` says whether the chosen point's loss advantage is beyond the seed noise
(`npas.service.study.noise`): a pick that chose by a loss the data cannot resolve says so.
"""

from __future__ import annotations

import math
import re

import optuna
from optuna.trial import FrozenTrial

from npas.allocation.space import LOSS_OBJECTIVES
from npas.errors import StudyError
from npas.service.study import studies
from npas.service.study.noise import describe, next_best, paired_gap
from npas.service.study.record import StudyAttr, TrialAttr

# Objectives that measure memory, in bytes; `max-memory=` caps the first of them the study has.
MEMORY_OBJECTIVES = ("param_bytes", "train_memory_bytes", "inference_bytes", "peak_memory_bytes")
# Objectives that are neither loss nor memory (a pick never caps them).
OTHER_OBJECTIVES = ("flops_per_token", "kv_cache_bytes_per_token")  # rates per token, not totals: never a memory cap
PICKS = "knee, min-loss, max-memory=BYTES (e.g. 2e8, 200MB, 1.5GiB), trial=N"

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_BYTES_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmgt]i?b|b)?\s*$", re.IGNORECASE)


def objective_names(study: optuna.Study) -> list[str]:
    """The study's objectives in the order of each trial's `values`."""
    names = [str(n) for n in (study.metric_names or study.user_attrs.get(StudyAttr.OBJECTIVES) or [])]
    if len(names) != len(study.directions):
        raise StudyError(f"study {study.study_name!r} names {len(names)} objectives for {len(study.directions)} "
                         f"values; it was not created by npas, pick a trial with --pick trial=N")
    return names


def objective_index(study: optuna.Study, family: tuple[str, ...], what: str, pick: str) -> int:
    """Position in `values` of the study's first objective from `family`; a one-line error if none."""
    names = objective_names(study)
    for i, name in enumerate(names):
        if name in family:
            return i
    raise StudyError(f"--pick {pick}: study {study.study_name!r} has no {what} objective (its objectives: "
                     f"{', '.join(names)}; {what} means one of {', '.join(family)}); use --pick knee or trial=N")


def parse_bytes(text: str, pick: str) -> float:
    """`2e8`, `200MB`, `1.5GiB` -> bytes."""
    m = _BYTES_RE.match(text)
    value = float(m.group(1)) * _UNITS[(m.group(2) or "").lower()] if m else math.nan
    if not math.isfinite(value) or value <= 0:
        raise StudyError(f"--pick {pick}: {text!r} is not a positive size in bytes; write e.g. "
                         f"max-memory=2e8 or max-memory=200MB")
    return value


def check_pick(how: str) -> str:
    """The form of a pick, checked without a study (the CLI does it before opening the database)."""
    if how.startswith("trial="):
        try:
            int(how.split("=", 1)[1])
        except ValueError:
            raise StudyError(f"--pick {how!r}: trial=N needs an integer N") from None
    elif how.startswith("max-memory="):
        parse_bytes(how.split("=", 1)[1], how)
    elif how not in ("knee", "min-loss"):
        raise StudyError(f"--pick {how!r} is not one of {PICKS}")
    return how


def pick(study: optuna.Study, how: str) -> FrozenTrial:
    """Choose one trial: knee | min-loss | max-memory=BYTES | trial=N."""
    check_pick(how)
    if how.startswith("trial="):
        return _by_number(study, how)
    trials = studies.front_trials(study)
    if how == "min-loss":
        loss = objective_index(study, LOSS_OBJECTIVES, "loss", how)
    elif how.startswith("max-memory="):
        loss = objective_index(study, LOSS_OBJECTIVES, "loss", how)
        memory = objective_index(study, MEMORY_OBJECTIVES, "memory", how)
        cap = parse_bytes(how.split("=", 1)[1], how)
    if not trials:
        raise StudyError(f"study {study.study_name!r} has no complete full-fidelity trial within budget yet; "
                         f"run more trials with `npas resume {study.study_name}`")
    if how == "knee":
        return knee(trials)
    if how == "min-loss":
        return min(trials, key=lambda t: t.values[loss])
    fits = [t for t in trials if t.values[memory] <= cap]
    if not fits:
        name = objective_names(study)[memory]
        lowest = min(t.values[memory] for t in trials)
        raise StudyError(f"no front trial has {name} <= {cap:,.0f} bytes (the least is {lowest:,.0f}); raise the cap")
    return min(fits, key=lambda t: t.values[loss])


def _by_number(study: optuna.Study, how: str) -> FrozenTrial:
    n = int(how.split("=", 1)[1])
    for t in study.get_trials(deepcopy=False):
        if t.number == n:
            if not studies.was_evaluated(t) or TrialAttr.ALLOC not in t.user_attrs:
                raise StudyError(f"trial {n} of study {study.study_name!r} is {studies.status(t)}, not complete")
            if not studies.reached_top(t):  # its loss is a shorter run's: not comparable with the front's
                done, asked = t.user_attrs.get(TrialAttr.FIDELITY), t.user_attrs.get(TrialAttr.MAX_FIDELITY)
                where = f" at step {done} of {asked}" if done is not None and asked is not None else ""
                raise StudyError(f"trial {n} of study {study.study_name!r} stopped{where}, below the top rung, so "
                                 f"its loss is a shorter run's; pick a trial that reached it (`npas front "
                                 f"{study.study_name}` lists them)")
            return t
    raise StudyError(f"study {study.study_name!r} has no trial {n}")


def knee(trials: list[FrozenTrial]) -> FrozenTrial:
    """The front point nearest the utopia point after scaling each objective to [0, 1]; with one
    objective, its minimum. Symmetric in the objectives, so their order does not matter."""
    k = len(trials[0].values)
    lo = [min(t.values[i] for t in trials) for i in range(k)]
    hi = [max(t.values[i] for t in trials) for i in range(k)]

    def dist(t: FrozenTrial) -> tuple[float, int]:
        return (math.sqrt(sum(((t.values[i] - lo[i]) / ((hi[i] - lo[i]) or 1.0)) ** 2 for i in range(k))), t.number)

    return min(trials, key=dist)


def noise_note(study: optuna.Study, how: str, number: int) -> str | None:
    """One line on whether trial `number`, chosen by `how`, beats the next-best front point by loss
    beyond the seed noise (2 paired std); None when the study has no loss objective. The points
    compared are those the pick chose among: the front, or its part under the cap for max-memory.
    min-loss and max-memory choose by the loss itself, so for them a gap inside the noise (or of
    unknown noise, one seed per trial) is "unresolved"; knee and trial=N only report it."""
    names = objective_names(study)
    loss = next((i for i, n in enumerate(names) if n in LOSS_OBJECTIVES), None)
    if loss is None:
        return None
    chosen = next(t for t in study.get_trials(deepcopy=False) if t.number == number)
    pool = studies.front_trials(study)
    if how.startswith("max-memory="):
        memory = objective_index(study, MEMORY_OBJECTIVES, "memory", how)
        cap = parse_bytes(how.split("=", 1)[1], how)
        pool = [t for t in pool if t.values[memory] <= cap]
    other = next_best(chosen, pool, loss)
    if other is None:
        among = "the front points under the cap" if how.startswith("max-memory=") else "the front"
        return (f"noise: trial {number} has the highest {names[loss]} among {among}; no point ranks after it "
                f"to compare with")
    decides = how if how == "min-loss" or how.startswith("max-memory=") else None
    return describe(paired_gap(chosen, other, loss, names[loss]), names[loss], decides)
