"""The samplers `npas search --sampler` offers, and how the enqueued baselines feed them.

Optuna's GP and NSGA-II samplers model only the parameters every finished trial has (their
intersection search space), and TPE groups trials by the parameters they share. The hand-crafted
baselines run first; if they carried no parameters, the intersection would stay empty for the whole
study and every ask would fall back to independent random sampling. So a baseline's knob values
are enqueued as the trial's Optuna parameters wherever the space searches that knob and allows the
value; only the rest (values outside the space, such as the narrow baseline's `width_fit`) are
applied as fixed values, recorded on the trial under `baseline_fixed`.

What a model-based sampler cannot model is said at launch (`modelled_knobs`): knobs that exist only
for some candidates (a taper ratio only with a non-uniform taper, LoRA ranks only with tying, ...)
are outside the intersection and sampled independently by GP and NSGA-II.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator
from typing import Any

import optuna

from npas.allocation.knobs import Knob
from npas.allocation.space import Space
from npas.errors import StudyError
from npas.service.study.record import TrialAttr

SAMPLERS = ("tpe", "nsga2", "gp", "random")  # the closed list `npas search --sampler` offers
RANDOM_AFTER_SKIPS = 3  # skipped asks in a row after which the next ask is a random one
STARTUP_TRIALS = {"tpe": 8, "gp": 8, "nsga2": 16}  # asks before the model takes over (NSGA-II: one population)
ALWAYS_PRESENT = ("taper", "tying", "pools")  # knobs `Space.sample` suggests for every candidate


def make_sampler(name: str, seed: int | None, n_objectives: int) -> optuna.samplers.BaseSampler:
    """Optuna's own samplers; constraints come from `trial.set_constraint` (Optuna 5).

    gp needs scipy (a declared dependency of npas) for fitting its kernel."""
    if name == "tpe":
        # group=True: the space is define-by-run (LoRA ranks exist only with tying, templates only with
        # pools ...), and grouped multivariate TPE models each co-occurring set of knobs jointly instead
        # of falling back to independent sampling
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True,
                                              n_startup_trials=STARTUP_TRIALS["tpe"], constant_liar=True)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=STARTUP_TRIALS["nsga2"])
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=STARTUP_TRIALS["gp"],
                                         warn_independent_sampling=False)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise StudyError(f"unknown sampler {name!r}; choose one of {', '.join(SAMPLERS)}")


@contextlib.contextmanager
def random_when_stuck(study: optuna.Study, skipped_in_a_row: int, seed: int) -> Iterator[None]:
    """The study's sampler; after a few skipped candidates in a row, a seeded random one.

    Optuna's model-based samplers ignore FAIL trials, so on a small or mostly infeasible space
    they propose the same skipped candidate again and again. A random ask breaks the loop
    without telling the sampler anything false about the skipped ones. The swap spans the ask
    and the suggestions, since a trial consults `study.sampler` at each suggest call. `seed` varies
    per ask (the driver passes the study's trial count, which it already knows) so the random asks
    differ, without reading the study here.
    """
    if skipped_in_a_row < RANDOM_AFTER_SKIPS:
        yield
        return
    model = study.sampler
    study.sampler = optuna.samplers.RandomSampler(seed=seed)
    try:
        yield
    finally:
        study.sampler = model


def learns_from_infeasible(sampler: optuna.samplers.BaseSampler) -> bool:
    """Whether infeasible asks are told COMPLETE with a violated constraint rather than FAIL.

    TPE splits trials into feasible and infeasible by their constraints and never reads an infeasible
    trial's values, so it learns where candidates do not fit.
    GP fits its objective model on every COMPLETE trial's values and NSGA-II's crowding distance reads
    them, so those (and random, which learns nothing) keep FAIL.
    """
    return isinstance(sampler, optuna.samplers.TPESampler)


def allows(knob: Knob, value: Any) -> bool:
    """Whether Optuna can record `value` as this searched knob's parameter."""
    if knob.kind == "choice":
        return any(type(value) is type(c) and value == c for c in knob.values)
    if isinstance(value, bool) or not isinstance(value, int | float) or not knob.low <= value <= knob.high:
        return False
    if knob.kind == "int":
        return isinstance(value, int) and (value - int(knob.low)) % int(knob.step or 1) == 0
    return knob.step is None or math.isclose((value - knob.low) / knob.step, round((value - knob.low) / knob.step))


def split_baseline(space: Space, values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A baseline's knob values as (Optuna params to enqueue, values `Space.sample` applies as fixed)."""
    params, fixed = {}, {}
    for name, value in values.items():
        knob = space.knobs.get(name) or space.chassis.get(name)
        if knob is not None and knob.searched and allows(knob, value):
            params[name] = value
        else:
            fixed[name] = value
    return params, fixed


def enqueue_baselines(study: optuna.Study, space: Space, baseline_attr: str) -> list[str]:
    """Enqueue every baseline of `space` (first in the study, so every front shows them)."""
    names = []
    for name, values in space.baselines().items():
        params, fixed = split_baseline(space, values)
        study.enqueue_trial(params, user_attrs={baseline_attr: name, TrialAttr.BASELINE_FIXED: fixed})
        names.append(name)
    return names


def baseline_fixed(trial: optuna.Trial | optuna.trial.FrozenTrial, space: Space, baseline_attr: str) -> dict | None:
    """The fixed values to sample a baseline trial with; a baseline enqueued before `baseline_fixed`
    existed carries no params, so all its values are fixed."""
    name = trial.user_attrs.get(baseline_attr)
    if not name:
        return None
    if TrialAttr.BASELINE_FIXED in trial.user_attrs:
        return dict(trial.user_attrs[TrialAttr.BASELINE_FIXED])
    return space.baselines().get(name)


def modelled_knobs(space: Space) -> tuple[list[str], list[str]]:
    """(knobs every candidate suggests, searched knobs that only some candidates have)."""
    always = [n for n, k in space.chassis.items() if k.searched]
    always += [n for n in ALWAYS_PRESENT if (k := space.knobs.get(n)) is not None and k.searched]
    sometimes = [n for n, k in space.knobs.items() if k.searched and n not in always]
    return always, sometimes
