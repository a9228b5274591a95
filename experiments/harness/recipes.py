"""The benches' recipes: frozen copies of the shipped ``proxy``, ``smoke`` and ``long`` recipes.

A bench's cache is keyed by the recipe it trains (``experiments/harness/version.py`` hashes its fields), and
its evidence is about that recipe. The shipped recipes are the product's defaults, which a bench's
verdict may change (issue #33 decides whether ``proxy`` switches to ``schedule: wsd``; issue #35
re-tunes base rates): read from the package, such a change would move every cached key and silently
turn the old evidence into runs of a recipe that no longer exists. So the benches read these copies,
as they read the frozen copy of ``full.yaml`` (``experiments/spaces/full_frozen.yaml``); a bench that wants
a new recipe names a new file here.
"""

from __future__ import annotations

from pathlib import Path

from npas import Recipe, load_recipe

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def bench_recipe(name: str) -> Recipe:
    """The frozen recipe ``name`` (``experiments/recipes/<name>.yaml``)."""
    return load_recipe(RECIPES / f"{name}.yaml")
