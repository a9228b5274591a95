"""A located learning-rate factor belongs to the recipe it was located under: the export records that
recipe, and `npas train` / `npas validate` under a recipe of another rate say so in one line and train
at x1, unless `--lr-factor located` (the stored factor anyway) or `--lr-factor X`. An export from before
the record is judged by the study recipe it carries; one that names no recipe at all is of unknown
provenance (x1, the same note). Every training here is a few steps of a tiny model."""

from __future__ import annotations

import copy
from pathlib import Path

import optuna
import pytest
import yaml

from npas.presentation.cli import main
from npas.service.certify.retrain import certify
from npas.service.certify.targets import Options
from npas.service.export.exporter import write_export
from npas.service.study.record import TrialAttr
from npas.training.recipe import Recipe
from npas.training.train import read_allocation_file, read_metrics
from tests.study_fixture import FAST, load, rebuild
from tests.training.test_train_lr_factor import WSD, _candidate, _space, _study

STEPS = "2"  # the run's length is not part of a recipe's rate: every training here is this short


@pytest.fixture
def export(tmp_path):
    """An export at lr_factor 2, located under the WSD recipe `wsd-lr`."""
    space = _space(tmp_path)
    path = tmp_path / "best.yaml"
    write_export(_study(space, _candidate(space), Recipe.from_dict(WSD), 3.0, 2.0), path, "trial=0")
    return path


def _recipe(tmp_path, name: str, **changes) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(Recipe.from_dict({**WSD, "name": name, **changes}).to_yaml())
    return str(path)


def _train(export, out, recipe: str, *extra: str) -> int:
    return main(["train", str(export), "--recipe", recipe, "--out", str(out), "--device", "cpu", "--steps", STEPS,
                 *extra])


def _notes(capsys) -> list[str]:
    return [ln for ln in capsys.readouterr().err.splitlines() if "note:" in ln]


def test_the_export_records_the_recipe_the_factor_was_located_under(export):
    doc = yaml.safe_load(export.read_text())
    assert doc["lr_factor"] == 2.0 and doc["lr_factor_recipe"] == Recipe.from_dict(WSD).to_dict()
    assert read_allocation_file(export).located_under == Recipe.from_dict(WSD)
    assert "under recipe 'wsd-lr' it was located with" in export.read_text().splitlines()[1]


def test_the_same_rate_applies_the_factor_whatever_the_length_seed_or_name(export, tmp_path, capsys):
    same = _recipe(tmp_path, "copy", seed=7, threads=2, eval_batches=2, horizon=64, rungs=None)
    assert _train(export, tmp_path / "out", same) == 0
    assert read_metrics(tmp_path / "out")["lr_factor"] == 2.0 and not _notes(capsys)


def test_another_recipe_trains_at_x1_and_says_so_in_one_line(export, tmp_path, capsys):
    other = _recipe(tmp_path, "other", lr=4e-3, schedule="cosine", rungs=None)
    assert _train(export, tmp_path / "out", other) == 0
    assert "lr_factor" not in read_metrics(tmp_path / "out")  # x1
    (note,) = _notes(capsys)
    assert "x2 is a factor of recipe 'wsd-lr'" in note and "'other'" in note and "lr 0.01 -> 0.004" in note
    assert "training at x1" in note and "--lr-factor located" in note


def test_lr_factor_located_applies_the_stored_factor_anyway(export, tmp_path, capsys):
    other = _recipe(tmp_path, "other", lr=4e-3)
    assert _train(export, tmp_path / "out", other, "--lr-factor", "located") == 0
    assert read_metrics(tmp_path / "out")["lr_factor"] == 2.0
    (note,) = _notes(capsys)
    assert "applying it anyway (--lr-factor located)" in note


def test_a_number_wins_without_a_note(export, tmp_path, capsys):
    assert _train(export, tmp_path / "out", _recipe(tmp_path, "other", lr=4e-3), "--lr-factor", "3") == 0
    assert read_metrics(tmp_path / "out")["lr_factor"] == 3.0 and not _notes(capsys)


@pytest.mark.parametrize("recorded", ["study recipe", "nothing"])
def test_an_export_from_before_the_record(export, tmp_path, capsys, recorded):
    """Without `lr_factor_recipe`: the study's `recipe` it carries is where every factor was located, so
    it decides as the record would; with no recipe at all the provenance is unknown: x1, with the note."""
    doc = yaml.safe_load(export.read_text())
    del doc["lr_factor_recipe"]
    if recorded == "nothing":
        del doc["recipe"]
    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump(doc))
    same = _recipe(tmp_path, "wsd-lr")
    assert _train(old, tmp_path / "same", same) == 0
    assert read_metrics(tmp_path / "same").get("lr_factor", 1.0) == (2.0 if recorded == "study recipe" else 1.0)
    notes = _notes(capsys)
    if recorded == "nothing":
        (note,) = notes
        assert "x2 is a factor of a recipe it does not name" in note and "training at x1" in note
        assert _train(old, tmp_path / "located", same, "--lr-factor", "located") == 0
        assert read_metrics(tmp_path / "located")["lr_factor"] == 2.0
    else:
        assert not notes
        assert _train(old, tmp_path / "other", _recipe(tmp_path, "other", lr=4e-3)) == 0
        assert "lr_factor" not in read_metrics(tmp_path / "other") and len(_notes(capsys)) == 1


def test_a_damaged_recipe_record_is_refused_in_one_line_and_nothing_is_written(export, tmp_path, capsys):
    doc = yaml.safe_load(export.read_text())
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**doc, "lr_factor_recipe": {"lr": "fast"}}))
    assert _train(bad, tmp_path / "never", _recipe(tmp_path, "wsd-lr")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "lr_factor_recipe is not the recipe mapping" in err
    assert not (tmp_path / "never").exists()


def test_a_model_directory_continued_under_another_recipe_trains_at_x1(export, tmp_path, capsys):
    first = tmp_path / "first"
    assert _train(export, first, _recipe(tmp_path, "wsd-lr")) == 0
    assert read_metrics(first)["lr_factor"] == 2.0
    assert _train(first, tmp_path / "again", _recipe(tmp_path, "copy", seed=5)) == 0  # same rate: as trained
    assert read_metrics(tmp_path / "again")["lr_factor"] == 2.0
    capsys.readouterr()
    assert _train(first, tmp_path / "other", _recipe(tmp_path, "other", lr=4e-3)) == 0
    assert "lr_factor" not in read_metrics(tmp_path / "other")
    (note,) = _notes(capsys)
    assert "metrics.json: lr_factor x2 is a factor of recipe 'wsd-lr'" in note


def test_choose_factor_when_nothing_was_located():
    from npas.training.lr_factor import choose_factor

    recipe = Recipe.from_dict(WSD)
    assert choose_factor(1.0, None, recipe, None, "f") == (1.0, None)
    assert choose_factor(1.0, None, recipe, "located", "f") == (1.0, None)


# ---- npas validate -----------------------------------------------------------------------------
LOCATED = 4  # the smoke study's trial given a located factor
FAST_RECIPE = Recipe.from_dict(yaml.safe_load(Path(FAST).read_text()))
OTHER = Recipe.from_dict({**FAST_RECIPE.to_dict(), "name": "other", "lr": 5e-3})  # another rate than the study's


def _located_study(url: str) -> optuna.Study:
    data = copy.deepcopy(load())
    data["trials"][LOCATED]["user_attrs"][TrialAttr.LR_FACTOR] = 2.0
    return rebuild(data, url)


@pytest.fixture(scope="module")
def located_study(tmp_path_factory) -> optuna.Study:
    return _located_study(f"sqlite:///{tmp_path_factory.mktemp('located')}/npas.db")


@pytest.mark.parametrize("recipe, requested, located, others, notes", [
    pytest.param(FAST_RECIPE, None, 2.0, 1.0, 0, id="the-study's-rate"),
    pytest.param(OTHER, None, 1.0, 1.0, 1, id="another-rate-x1"),
    pytest.param(OTHER, "located", 2.0, 1.0, 1, id="located-anyway"),
    pytest.param(OTHER, 3.0, 3.0, 3.0, 0, id="a-number"),
])
def test_validate_plans_each_retraining_at_the_factor_the_rule_gives(located_study, recipe, requested, located,
                                                                       others, notes):
    from npas.service.certify.targets import make_plan

    plan = make_plan(located_study, Options(recipe=FAST, seeds=2, top=4, sample=1, lr_factor=requested), recipe)
    factors = {t.source: t.lr_factor for t in plan.targets}
    assert factors[LOCATED] == located
    assert {f for s, f in factors.items() if s != LOCATED} == {others}
    assert (plan.note is not None) == bool(notes)
    if notes:
        assert "study 'smoke': the located lr_factor (x2 on 1 allocation(s)) is a factor of recipe 'fast'" in plan.note


def test_validate_under_another_rate_retrains_at_x1_and_says_so_once(tmp_path):
    url = f"sqlite:///{tmp_path}/npas.db"
    _located_study(url)
    path = tmp_path / "other.yaml"
    path.write_text(OTHER.to_yaml())
    rates: set[float] = set()
    notes: list[str] = []

    def retrain(cfg, r: Recipe) -> float:  # records the peak rate of every retraining
        rates.add(r.lr)
        return 3.0 + r.seed * 1e-6 + len(rates) * 1e-3

    cert = certify("smoke", Options(recipe=str(path), seeds=2, top=4, sample=1, workers=0, threads=None,
                                    on_note=notes.append), storage=url, retrain=retrain)
    assert rates == {OTHER.lr}  # the located trial too: x1
    (note,) = notes
    assert "retraining every allocation at x1" in note and "--lr-factor located" in note
    assert {r["lr_factor"] for r in cert["allocations"]} == {1.0}
