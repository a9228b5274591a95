"""A budget no candidate fits is refused before a study exists (npas.allocation.bounds): the analytic
lower bound on the smallest candidate is below every candidate the search can draw (checked on every
shipped space, in both budget scopes), exact where the fit reaches it, and a budget under it, or one no
random draw fits, is refused in one line that says whether the baselines alone would fit."""

from __future__ import annotations

import glob

import optuna
import pytest

import npas
from npas.allocation.bounds import check_reachable, probe, smallest_params
from npas.allocation.space_parser import parse_space
from npas.errors import BudgetError
from tests.conftest import ROOT, SMALL_CHASSIS
from tests.presentation.test_inputs import _tree, assert_refused_in_one_line, guarded  # noqa: F401

TAPER = str(ROOT / "npas" / "builtin" / "spaces" / "taper.yaml")
SPACES = sorted(glob.glob(str(ROOT / "npas" / "builtin" / "spaces" / "*.yaml"))) + [str(ROOT / "tests/data/tiny.yaml")]


def _draws(space, n: int = 120, seed: int = 1):
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed))
    for _ in range(n):
        trial = study.ask()
        yield space.sample(trial)
        study.tell(trial, state=optuna.trial.TrialState.FAIL)


@pytest.mark.parametrize("path", SPACES, ids=lambda p: p.rsplit("/", 1)[-1])
def test_the_bound_is_below_every_candidate_the_search_can_draw(path):
    base = npas.load_space(path).bind(vocab_size=68)
    for scope, over in (("all", "4x"), ("non_embedding", "1.05x")):
        bound_space = base.bind(budget_scope=scope)
        floor = smallest_params(bound_space)
        assert floor is not None and floor > 0
        budget = str(int(floor * float(over[:-1])) + 1)
        space = base.bind(budget_scope=scope, budget=budget) if scope == "non_embedding" else \
            base.bind(budget=str(max(int(budget), bound_space.budget_params)))
        stored = [c.fit.stored for c in _draws(space, 50) if c.feasible]
        assert all(s >= floor for s in stored), (scope, floor, min(stored))


def test_the_bound_is_exact_where_the_fit_reaches_it():
    """taper keeps d_model (fit.width: mlp) and ties nothing: its narrowest candidate is width 1 per layer,
    which the fit gives exactly at a budget equal to the bound, and not one parameter below it."""
    taper = npas.load_space(TAPER).bind(vocab_size=68)
    floor = smallest_params(taper)
    assert floor == 553_600
    at = taper.bind(budget=str(floor))
    assert all(c.feasible and c.fit.stored == floor for c in _draws(at, 5) if c.values["taper"] == "uniform")
    assert not any(c.feasible for c in _draws(taper.bind(budget=str(floor - 1)), 20))


def test_a_budget_under_the_bound_is_refused_naming_it_and_the_baselines_that_fit():
    taper = npas.load_space(TAPER).bind(vocab_size=68, budget="30k")
    with pytest.raises(BudgetError) as info:
        check_reachable(taper)
    msg = str(info.value)
    assert "\n" not in msg and "at least 553,600" in msg and "30,000" in msg
    assert "only the baseline(s) narrow_untied would fit" in msg and "raise the budget" in msg


def test_a_budget_the_bound_passes_but_no_draw_fits_is_refused_by_the_probe():
    """Tied banks store a whole member per bank, which the bound (banks of one parameter) does not
    see: between the two, only drawing candidates tells, and none of them fits."""
    text = (f"name: tied-banks\nchassis: {SMALL_CHASSIS}\nbudget: 0.5x\nfit: {{width: mlp}}\nknobs:\n"
            "  pools: {enabled: true, rule: all, banks: 1, generator: tie}\n")
    space = parse_space(text).bind()
    floor = smallest_params(space)
    # every draw has the same knobs; the fit fills whatever budget it is given, so the smallest budget
    # the allocation fits is found by bisection on one draw
    lo, hi = floor, next(iter(_draws(space.bind(budget="10x"), 1))).fit.stored
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if probe(space.bind(budget=str(mid)), seed=0, draws=1)[0] else (mid, hi)
    needs = hi
    assert floor < needs
    tight = space.bind(budget=str(needs - 1))
    assert smallest_params(tight) <= tight.budget_params  # the bound lets it through
    assert probe(tight, seed=0)[0] is False
    with pytest.raises(BudgetError, match="none of 200 candidates drawn at random .* fits budget"):
        check_reachable(tight)
    check_reachable(space.bind(budget=str(needs)))  # one parameter more and it fits


@pytest.mark.parametrize("path", SPACES, ids=lambda p: p.rsplit("/", 1)[-1])
def test_every_shipped_space_at_its_own_budget_is_reachable(path):
    check_reachable(npas.load_space(path).bind(vocab_size=68))


def test_npas_search_of_a_budget_nothing_fits_writes_nothing_and_starts_no_ray(guarded, capsys):  # noqa: F811
    before = _tree(guarded)
    assert_refused_in_one_line(["search", "taper", "--budget", "30k", "--storage",
                                f"sqlite:///{guarded}/work/npas.db"], "at least 553,600", capsys, guarded, before)


def test_the_python_api_refuses_it_in_plan_search(guarded):  # noqa: F811
    with pytest.raises(BudgetError, match="not even the baselines fit|only the baseline"):
        npas.plan_search(npas.load_space(TAPER), budget="30k", storage=f"sqlite:///{guarded}/work/npas.db")
    assert not list((guarded / "work").iterdir())
