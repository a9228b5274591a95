"""The ladder's default (rungs horizon/16 and horizon, eta 4: experiments/ladder_orders.py's choice) is what the
shipped ladder recipes run, and a study keeps the rungs it was created with: a resume reads them from
the study's stored recipe, not from today's shipped file."""

from __future__ import annotations

import optuna
import pytest

from npas.service.search.launch import Launch
from npas.service.search.plan import plan_resume
from npas.service.study import compute, studies
from npas.service.study.ladder import DEFAULT_ETA
from npas.service.study.record import StudyAttr
from npas.training.recipe import Recipe, load_recipe
from tests.study_fixture import load


@pytest.mark.parametrize("name", ["smoke-wsd", "ladder"])
def test_the_shipped_ladder_recipes_run_the_chosen_default_and_store_it(name):
    recipe = load_recipe(name)
    T = recipe.horizon
    assert recipe.schedule == "wsd" and recipe.steps == T
    assert recipe.fork_rungs() == (T // 16, T) and DEFAULT_ETA == 4
    # the rungs are written out, so the recipe a study stores carries them whatever a default becomes
    assert recipe.to_dict()["rungs"] == [T // 16, T]
    assert Recipe.from_dict(recipe.to_dict()).fork_rungs() == (T // 16, T)


def test_a_study_created_with_the_three_rung_recipe_resumes_on_its_three_rungs(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"  # named in the plan only: the record is read from memory below
    smoke = load()  # the smoke study's record (its attributes) is all a resume plans from
    study = optuna.create_study(study_name=smoke["name"], directions=[d.lower() for d in smoke["directions"]])
    for k, v in smoke["user_attrs"].items():
        study.set_user_attr(k, v)
    # smoke-wsd as it was shipped before the default changed: no `rungs`, so horizon/16, /4 and /1
    old = {k: v for k, v in load_recipe("smoke-wsd").to_dict().items() if k != "rungs"}
    study.set_user_attr(StudyAttr.RECIPE, old)
    study.set_user_attr(StudyAttr.EARLY_STOP, True)
    plan = plan_resume(study.study_name, studies.read_record(study), storage=url, launch=Launch())
    assert plan.fidelity == "ladder" and plan.rungs == (12, 50, 200)
    assert load_recipe("smoke-wsd").fork_rungs() == (12, 200)  # today's shipped file says otherwise
    spent = compute.ladder_compute(study)  # what `npas front` and the dashboard print for it
    assert spent is not None and spent.line().startswith("ladder (rungs 12, 50, 200; eta 4): ")
