"""A learning-rate factor located per candidate, applied outside the search.

A search that locates each candidate's rate stores the chosen factor of the recipe's fair rate on the
trial (``lr_factor``); ``npas export`` writes it beside the allocation with the recipe it was located
under (``lr_factor_recipe``), and ``npas train`` and ``npas validate`` train at it: the recipe's whole
schedule (peak, warmup and floor) times the factor, every parameter group's fair rule kept. ``npas
train`` hands the factor to the loop (``Trainer.lr_factor``), as the search's climbs do; a
certificate's retrainings still train the recipe at its factor (``at_lr_factor``), the same numbers
for every factor the located grid can choose (see below).

A factor is a multiple of one recipe's rate, so it holds for that recipe only (x16 of a 2.5e-3 WSD
proxy is not x16 of a 4e-3 cosine run). ``choose_factor`` applies it when the training recipe sets the
same rate schedule (``RATE_FIELDS``: its length, seed, threads, evaluation and data may differ), and
otherwise trains at x1 with a one-line note, unless ``--lr-factor located`` asks for the stored factor
anyway or ``--lr-factor X`` names one. An export written before the recipe was recorded beside the
factor is judged by the study recipe it carries (``recipe``: the one every trial, and so every located
factor, ran under); a file that records neither is of unknown provenance and trains at x1, with the
same note, unless ``--lr-factor located``. A model directory's factor is the one it was trained at,
under the recipe its ``metrics.json`` records.

The loop's factor and the recipe's rates at that factor are the same numbers bit for bit when the
factor is a power of two -- scaling by one is exact in floating point, so ``(f * lr) * mult == lr *
(mult * f)`` at every step -- and every factor the located-rate grid can choose is one (x0.5, x1, x2, x4 and x2 steps past them:
``npas.training.located_rate``). So ``npas train`` of an export reproduces its WSD trial's loss at T
exactly (tests/training/test_train_lr_factor.py); another factor (``--lr-factor 1.5``) agrees to the
rounding of the last bit. Factor 1 changes nothing and is not written anywhere: an export or a model
directory from before located rates trains exactly as it did.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from npas.errors import ConfigError
from npas.training.recipe import Recipe

LR_FACTOR_KEY = "lr_factor"  # in an export and in metrics.json: the factor of the recipe's fair rate trained at
LR_FACTOR_RECIPE_KEY = "lr_factor_recipe"  # in an export: the recipe (its to_dict) the factor was located under
LOCATED = "located"  # `--lr-factor located`: the stored factor, whichever recipe trains
# What a recipe's rate means: the fields that shape the schedule and the optimisation a factor multiplies.
# Left out: the run's length (steps, horizon, rungs: a WSD rate is the same until its decay, which is how
# the search itself carries a factor from T/4 to T), and seed, threads, evaluation, data and split.
RATE_FIELDS = ("lr", "min_lr", "warmup_steps", "schedule", "decay_fraction", "decay_shape", "seq_len", "batch_size",
               "weight_decay", "betas", "grad_clip", "parameterization")
# the factors a run can use: the located grid reaches x1/8..x16; a thousand times the fair rate diverges
# within steps and a thousandth of it barely moves the weights, so a factor past these is a typo, refused
# before a run writes anything (1e300 once trained, diverged at its first evaluation and left its --out)
LR_FACTOR_MIN, LR_FACTOR_MAX = 2.0**-10, 2.0**10
LR_FACTOR_RANGE = "a finite number > 0, from 1/1024 to 1024 (a factor of the recipe's fair learning rate, e.g. 2)"


def check_lr_factor(value: Any, where: str) -> float:
    """A learning-rate factor as a float, refused in one line unless a number in the range above."""
    ok = (isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
          and LR_FACTOR_MIN <= value <= LR_FACTOR_MAX)
    if not ok:
        raise ConfigError(f"{where} must be {LR_FACTOR_RANGE}, got {value!r}; export it again or pass --lr-factor")
    return float(value)


def at_lr_factor(recipe: Recipe, lr_factor: float) -> Recipe:
    """``recipe`` at ``lr_factor`` x its rates (the whole schedule); the recipe itself at factor 1."""
    return recipe if lr_factor == 1.0 else recipe.with_lr_factor(lr_factor)


def located_under(value: Any, where: str) -> Recipe | None:
    """The recipe a stored factor was located (or trained) under, from its record; None when there is
    none. A record that is not a recipe is refused in one line."""
    if value is None:
        return None
    try:
        return Recipe.from_dict(dict(value) if isinstance(value, Mapping) else value, where)
    except (ConfigError, TypeError, ValueError):  # TypeError: a mapping whose keys are not strings
        raise ConfigError(f"{where} is not the recipe mapping npas writes; export it again, or pass "
                          f"--lr-factor") from None


def rate_differences(a: Recipe, b: Recipe) -> list[str]:
    """The rate fields (``RATE_FIELDS``) in which `b` trains otherwise than `a`, as ``name a -> b``."""
    return [f"{k} {_show(getattr(a, k))} -> {_show(getattr(b, k))}" for k in RATE_FIELDS
            if getattr(a, k) != getattr(b, k)]


def _show(v: Any) -> str:
    return "/".join(f"{x:g}" for x in v) if isinstance(v, tuple) else f"{v:g}" if isinstance(v, float) else str(v)


def not_its_rate(under: Recipe | None, recipe: Recipe) -> str | None:
    """Why a factor located (or trained) under `under` is not one of `recipe`'s rate, or None when it
    is: `recipe` sets the same rate (``RATE_FIELDS``). `under` None is a factor of unknown origin."""
    if under is None:
        return "is a factor of a recipe it does not name"
    differs = rate_differences(under, recipe)
    if not differs:
        return None
    return (f"is a factor of recipe {under.name!r}'s rate, which recipe {recipe.name!r} does not share "
            f"({', '.join(differs[:3])})")


def choose_factor(stored: float, under: Recipe | None, recipe: Recipe, requested: float | str | None,
                  what: str) -> tuple[float, str | None]:
    """(the factor to train `recipe` at, a one-line note or None).

    `stored` is the recorded factor, located (or trained) under `under` (None: unknown); `requested`
    is ``--lr-factor``: a number wins outright, ``LOCATED`` takes `stored` whatever the recipes, and
    None takes `stored` only when `recipe` has the same rate (``RATE_FIELDS``), else x1. `what` names
    where the factor came from, for the note."""
    if requested is not None and requested != LOCATED:
        return check_lr_factor(requested, "--lr-factor"), None
    why = None if stored == 1.0 else not_its_rate(under, recipe)
    if why is None:
        return stored, None
    return (stored, f"{what}: lr_factor x{stored:g} {why}; applying it anyway (--lr-factor located)") \
        if requested == LOCATED else \
        (1.0, f"{what}: lr_factor x{stored:g} {why}; training at x1: pass --lr-factor located to apply it "
              f"anyway, or --lr-factor X")
