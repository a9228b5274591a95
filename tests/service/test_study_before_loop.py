"""A study written before the one training loop and the one trial context still reads and resumes.

tests/data/study_before_loop.db was made by the integration branch at 2eab89c (before that refactor):
    npas search tests/data/tiny.yaml --recipe fast-wsd.yaml --trials 3 --workers 1 --repeats 2 \
        --init-from study_before_loop_model --study before-loop
with fast-wsd.yaml = tests/data/fast.yaml plus `schedule: wsd`, `horizon: 40`; the model it starts from is
tests/data/study_before_loop_model (the tiny space's reference trained 20 smoke steps). It stores every key
a ladder study writes: the recipe dict (its later fields left out at their defaults, as that code wrote
it), `init_from` ({"dir", "weights", "config_hash"}, the dir a path that no longer exists) and each
trial's `rung_losses`.
"""

from __future__ import annotations

import dataclasses
import shutil
from types import MappingProxyType

import optuna
import pytest

from tests.conftest import ROOT

BEFORE_LOOP_DB = ROOT / "tests" / "data" / "study_before_loop.db"
BEFORE_LOOP_MODEL = ROOT / "tests" / "data" / "study_before_loop_model"
NAME = "before-loop"


@pytest.fixture
def url(tmp_path) -> str:
    db = tmp_path / "before.db"
    shutil.copy(BEFORE_LOOP_DB, db)
    return f"sqlite:///{db}"


def _record(url: str):
    from npas.service.study.storage import open_storage
    from npas.service.study.studies import load, read_record

    study = load(NAME, open_storage(url, read_only=True))
    return study, read_record(study)


def test_its_stored_keys_still_read(url):
    from npas.service.study.record import TrialAttr
    from npas.training.recipe import Recipe

    study, record = _record(url)
    stored = dict(record.recipe)
    assert "decay_fraction" not in stored and stored["schedule"] == "wsd"  # written by the code before
    recipe = Recipe.from_dict(stored)
    assert (recipe.name, recipe.schedule, recipe.fork_rungs(), recipe.decay_fraction) == ("fast-wsd", "wsd", (10, 40), 0.2)
    assert record.init_from["weights"] == "b843a88ee9db29df"
    ranked = [t.user_attrs[TrialAttr.RUNG_LOSSES] for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(ranked) == 3 and all("10" in r for r in ranked) and sum("40" in r for r in ranked) == 1


def test_it_resumes_and_joins_without_a_recipe_changed_refusal(url):
    """The plan of a resume is built from the record; a driver that names the study's very recipe (as
    `Recipe.to_dict` writes it now) and its starting model joins it: nothing is flagged as changed."""
    from npas.allocation.space_parser import parse_space
    from npas.service.search.join import join_problem
    from npas.service.search.launch import Launch
    from npas.service.search.plan import plan_resume, plan_search
    from npas.training.recipe import Recipe

    _, record = _record(url)
    recipe = Recipe.from_dict(dict(record.recipe))
    plan = plan_resume(NAME, record, storage=url, launch=Launch(workers=1), init_from=str(BEFORE_LOOP_MODEL))
    assert plan.recipe == recipe and plan.repeats == 2 and plan.fidelity == "ladder"
    space = parse_space(record.space_text, record.space_source)
    given = plan_search(space, study=NAME, storage=url, recipe=recipe, init_from=str(BEFORE_LOOP_MODEL),
                        repeats=2, launch=Launch(workers=1))
    assert join_problem(given, record, url) is None
    every_field = {**dataclasses.asdict(recipe), "betas": list(recipe.betas)}  # none left out at its default
    assert set(every_field) - set(record.recipe) >= {"decay_fraction", "decay_shape", "rungs"}
    written_whole = dataclasses.replace(given, given=MappingProxyType({**given.given, "recipe": every_field}))
    assert join_problem(written_whole, record, url) is None
    changed = Recipe.from_dict({**recipe.to_dict(), "lr": 0.02})  # the check itself still bites
    other = plan_search(space, study=NAME, storage=url, recipe=changed, init_from=str(BEFORE_LOOP_MODEL))
    assert "created with other settings: --recipe" in join_problem(other, record, url)


@pytest.mark.slow  # a real resume: Ray and one more trial's climbs
def test_it_resumes_to_a_new_target(url, ray_local):
    from npas.presentation.cli import main
    from npas.service.study.record import TrialAttr

    before = len(_record(url)[0].trials)
    assert main(["resume", NAME, "--storage", url, "--trials", "4", "--workers", "1",
                 "--init-from", str(BEFORE_LOOP_MODEL)]) == 0
    study, _ = _record(url)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(study.trials) == before + 1 and len(done) == 4
    assert all("10" in t.user_attrs[TrialAttr.RUNG_LOSSES] for t in done)
