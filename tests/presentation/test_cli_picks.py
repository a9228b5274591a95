"""`front` and `export --pick` read objectives by name, on real Optuna studies in SQLite.

The studies are written by hand (Optuna's public `create_trial`/`add_trial`) with the user attributes
npas writes, so each test controls exactly which trial a pick must return.
"""

from __future__ import annotations

import json
import uuid

import optuna
import pytest
import yaml

import npas
from npas.allocation.budget import count
from npas.allocation.config import reference_config
from npas.presentation.cli import main
from npas.presentation.cli.units import human_bytes, human_count
from npas.service.export.picks import MEMORY_OBJECTIVES, OTHER_OBJECTIVES, pick
from npas.service.study.record import Constraint, StudyAttr, TrialAttr
from tests.conftest import ROOT

TINY = ROOT / "tests" / "data" / "tiny.yaml"
# (loss, memory): all three are on the front; the lowest loss costs the most memory
POINTS = [(2.0, 3.0e8), (2.5, 1.0e8), (3.0, 0.5e8)]


def cli(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse refuses a malformed --pick while parsing
        return int(e.code)


def make_study(tmp_path, objectives: list[str], points=POINTS) -> tuple[str, str]:
    """A study as npas records it, with one complete, in-budget, full-fidelity trial per point."""
    url = f"sqlite:///{tmp_path}/picks.db"
    name = f"picks-{uuid.uuid4().hex[:6]}"
    space = npas.load_space(TINY)
    cfg = reference_config(space.reference_chassis)
    acc = count(cfg)
    study = optuna.create_study(study_name=name, storage=url, directions=["minimize"] * len(objectives))
    study.set_metric_names(objectives)
    for k, v in {StudyAttr.SPACE_TEXT: space.text, StudyAttr.OBJECTIVES: objectives, StudyAttr.RECIPE: {"name": "smoke"},
                 StudyAttr.FINGERPRINT: "f"}.items():
        study.set_user_attr(k, v)
    for loss, memory in points:
        by_name = {"val_loss": loss, "train_memory_bytes": memory}
        study.add_trial(optuna.trial.create_trial(
            values=[by_name[o] for o in objectives],
            user_attrs={TrialAttr.ALLOC: cfg.to_dict(), TrialAttr.HASH: cfg.hash, TrialAttr.ACCOUNTING: acc.to_dict(),
                        TrialAttr.STATUS: "ok"},
            constraints={Constraint.BUDGET: -1.0, Constraint.FIDELITY: 0.0}))
    return url, name


ORDERS = [["val_loss", "train_memory_bytes"], ["train_memory_bytes", "val_loss"]]


@pytest.mark.parametrize("objectives", ORDERS, ids=["loss-first", "memory-first"])
def test_picks_go_by_objective_name(objectives, tmp_path):
    url, name = make_study(tmp_path, objectives)
    study = optuna.load_study(study_name=name, storage=url)
    assert pick(study, "min-loss").number == 0
    assert pick(study, "max-memory=2e8").number == 1  # the least loss within 200 MB
    assert pick(study, "max-memory=200MB").number == 1
    assert pick(study, "max-memory=60MB").number == 2
    assert pick(study, "knee").number == 1  # the middle point is nearest the utopia corner either way


@pytest.mark.parametrize("objectives", ORDERS, ids=["loss-first", "memory-first"])
def test_cli_export_min_loss_writes_the_min_loss_trial(objectives, tmp_path, capsys):
    url, name = make_study(tmp_path, objectives)
    out = tmp_path / "best.yaml"
    assert main(["export", name, "--storage", url, "--pick", "min-loss", "--out", str(out)]) == 0
    doc = yaml.safe_load(out.read_text())
    assert doc["trial"] == 0 and doc["values"] == {"val_loss": 2.0, "train_memory_bytes": 3.0e8}


def test_single_objective_min_loss_and_knee(tmp_path):
    url, name = make_study(tmp_path, ["val_loss"], points=[(2.0, 0), (2.5, 0)])
    study = optuna.load_study(study_name=name, storage=url)
    assert pick(study, "min-loss").number == 0
    assert pick(study, "knee").number == 0


@pytest.mark.parametrize("how, fragment", [
    ("max-memory=1e8", "has no memory objective (its objectives: val_loss"),
    ("min-memory", "is not one of knee, min-loss"),
])
def test_a_pick_the_objectives_cannot_answer_is_one_line(how, fragment, tmp_path, capsys):
    url, name = make_study(tmp_path, ["val_loss"], points=[(2.0, 0), (2.5, 0)])
    out = tmp_path / "x.yaml"
    assert cli(["export", name, "--storage", url, "--pick", how, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert fragment in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize("how, fragment", [
    ("max-memory=lots", "'lots' is not a positive size in bytes"),
    ("max-memory=-5", "is not a positive size"),
    ("max-memory=1e400", "is not a positive size"),
    ("max-memory=1e6", "no front trial has train_memory_bytes <= 1,000,000 bytes (the least is 50,000,000)"),
])
def test_bad_memory_caps_are_one_line(how, fragment, tmp_path, capsys):
    url, name = make_study(tmp_path, ["train_memory_bytes", "val_loss"])
    out = tmp_path / "x.yaml"
    assert cli(["export", name, "--storage", url, "--pick", how, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert fragment in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_front_table_prints_human_units_and_csv_json_keep_raw_numbers(tmp_path, capsys):
    url, name = make_study(tmp_path, ["val_loss", "train_memory_bytes"])
    assert main(["front", name, "--storage", url]) == 0
    table = capsys.readouterr().out
    assert "300 MB" in table and "50 MB" in table and "2.5000" in table
    assert "e+0" not in table
    assert main(["front", name, "--storage", url, "--format", "csv"]) == 0
    csv = capsys.readouterr().out
    assert ",300000000.0," in csv
    assert main(["front", name, "--storage", url, "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert sorted(r["train_memory_bytes"] for r in rows) == [5.0e7, 1.0e8, 3.0e8]


def test_units():
    assert human_bytes(97_656_250) == "97.7 MB" and human_bytes(512) == "512 B"
    assert human_count(1_234_567) == "1.23M" and human_count(52_640) == "52.6k" and human_count(12) == "12"


def test_every_objective_has_a_role_for_picks():
    """A new objective must be classified as a loss, a memory or neither, or picks would ignore it."""
    from npas.allocation.space import LOSS_OBJECTIVES, OBJECTIVES

    roles = set(LOSS_OBJECTIVES) | set(MEMORY_OBJECTIVES) | set(OTHER_OBJECTIVES)
    assert set(OBJECTIVES) == roles
    assert not set(LOSS_OBJECTIVES) & set(MEMORY_OBJECTIVES)
