"""A learning-rate factor located per candidate, applied outside the search (issue #35).

A search that locates each candidate's rate stores the chosen factor of the recipe's fair rate on the
trial (``lr_factor``); ``npas export`` writes it beside the allocation, and ``npas train`` and
``npas validate`` train at it, under any recipe: the recipe's whole schedule (peak, warmup and floor)
times the factor, every parameter group's fair rule kept (``Recipe.with_lr_factor``).

Why the recipe's rates and not each group's multiplier, as the search's climb does
(``climb.scale_rates``): ``forks.train_model`` and ``proxy.train_model`` build their optimizer
themselves, from the recipe. The two are the same numbers bit for bit when the factor is a power of two
-- scaling by one is exact in floating point, so ``(f * lr) * mult == lr * (mult * f)`` at every step --
and every factor the located-rate grid can choose is one (x0.5, x1, x2, x4 and x2 steps past them:
``npas.training.located_rate``). So ``npas train`` of an export reproduces its WSD trial's loss at T
exactly (tests/training/test_train_lr_factor.py); another factor (``--lr-factor 1.5``) agrees to the
rounding of the last bit. Factor 1 changes nothing and is not written anywhere: an export or a model
directory from before located rates trains exactly as it did.
"""

from __future__ import annotations

import math
from typing import Any

from npas.errors import ConfigError
from npas.training.recipe import Recipe

LR_FACTOR_KEY = "lr_factor"  # in an export and in metrics.json: the factor of the recipe's fair rate trained at


def check_lr_factor(value: Any, where: str) -> float:
    """A learning-rate factor as a float, refused in one line unless a finite number > 0."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if not ok:
        raise ConfigError(f"{where} must be a finite number > 0 (a factor of the recipe's fair learning rate, "
                          f"e.g. 2), got {value!r}; export it again or pass --lr-factor")
    return float(value)


def at_lr_factor(recipe: Recipe, lr_factor: float) -> Recipe:
    """``recipe`` at ``lr_factor`` x its rates (the whole schedule); the recipe itself at factor 1."""
    return recipe if lr_factor == 1.0 else recipe.with_lr_factor(lr_factor)
