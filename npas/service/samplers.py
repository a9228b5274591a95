"""The Optuna samplers npas offers, and the random ask that breaks a sampler's repeat loop."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import optuna

from npas.errors import StudyError

SAMPLERS = ("tpe", "nsga2", "gp", "random")  # the closed list `npas search --sampler` offers
RANDOM_AFTER_SKIPS = 3  # skipped asks in a row after which the next ask is a random one


def make_sampler(name: str, seed: int | None, n_objectives: int) -> optuna.samplers.BaseSampler:
    """Optuna's own samplers; constraints come from `trial.set_constraint` (Optuna 5)."""
    if name == "tpe":
        # group=True: the space is define-by-run (LoRA ranks exist only with tying, templates only with
        # pools ...), and grouped multivariate TPE models each co-occurring set of knobs jointly instead
        # of falling back to independent sampling; bench/search_efficiency.py measures the difference
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, n_startup_trials=8,
                                              constant_liar=True)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=16)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=8, warn_independent_sampling=False)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise StudyError(f"unknown sampler {name!r}; choose one of {', '.join(SAMPLERS)}")


@contextlib.contextmanager
def random_when_stuck(study: optuna.Study, skipped_in_a_row: int) -> Iterator[None]:
    """The study's sampler; after a few skipped candidates in a row, a seeded random one.

    Optuna's model-based samplers ignore FAIL trials, so on a small or mostly infeasible space
    they propose the same skipped candidate again and again. A random ask breaks the loop
    without telling the sampler anything false about the skipped ones. The swap spans the ask
    and the suggestions, since a trial consults `study.sampler` at each suggest call.
    """
    if skipped_in_a_row < RANDOM_AFTER_SKIPS:
        yield
        return
    model = study.sampler
    study.sampler = optuna.samplers.RandomSampler(seed=len(study.get_trials(deepcopy=False)))
    try:
        yield
    finally:
        study.sampler = model
