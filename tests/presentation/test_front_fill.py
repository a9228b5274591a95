"""The front shows how much of its budget each trial stores, and marks those under the fill target.

A trial storing half its budget competes with trials holding all of it, so `npas front` and the
dashboard's trials table say so: a `fill` column, a mark, and why (its shapes, or an older fit
that sampled it, for a study resumed across versions).
"""

from __future__ import annotations

import json
import uuid

import optuna
import pytest

import npas
from npas.allocation.budget import count
from npas.allocation.config import reference_config
from npas.allocation.fill import FILL_TARGET, FIT_VERSION
from npas.presentation.cli import main
from npas.presentation.dashboard.info import trials_frame
from npas.presentation.dashboard.report import _table_section as table_section
from npas.service.study.record import Constraint, StudyAttr, TrialAttr
from tests.presentation.test_cli_picks import TINY

# (loss, memory) -> fill and fit version as recorded; every point is on the front
FILLS = {(2.0, 3.0e8): (0.999876, FIT_VERSION, None), (2.5, 1.0e8): (0.580012, None, None),
         (3.0, 0.5e8): (0.9, FIT_VERSION, "the next step of its free size (d_expert) adds 40,001 params, "
                                          "more than the 40,000 left")}


@pytest.fixture(scope="module")
def filled_study(tmp_path_factory) -> tuple[str, str]:
    """A study as npas records it (tests.presentation.test_cli_picks.make_study), each trial with its fill;
    one per module: the tests only read it."""
    url = f"sqlite:///{tmp_path_factory.mktemp('fill')}/fill.db"
    name = f"fill-{uuid.uuid4().hex[:6]}"
    space = npas.load_space(TINY)
    cfg = reference_config(space.reference_chassis)
    study = optuna.create_study(study_name=name, storage=url, directions=["minimize", "minimize"])
    study.set_metric_names(["val_loss", "train_memory_bytes"])
    for k, v in {StudyAttr.SPACE_TEXT: space.text, StudyAttr.OBJECTIVES: ["val_loss", "train_memory_bytes"],
                 StudyAttr.RECIPE: {"name": "smoke"}, StudyAttr.FINGERPRINT: "f"}.items():
        study.set_user_attr(k, v)
    for (loss, memory), (fill, version, short) in FILLS.items():
        attrs = {TrialAttr.ALLOC: cfg.to_dict(), TrialAttr.HASH: cfg.hash, TrialAttr.ACCOUNTING: count(cfg).to_dict(),
                 TrialAttr.STATUS: "ok", TrialAttr.FILL: fill}
        if version is not None:  # absent: a trial of a study from before fit versions were recorded
            attrs[TrialAttr.FIT_VERSION] = version
        if short:
            attrs[TrialAttr.SHORT] = short
        study.add_trial(optuna.trial.create_trial(values=[loss, memory], user_attrs=attrs,
                                                  constraints={Constraint.BUDGET: -1.0, Constraint.FIDELITY: 0.0}))
    return url, name


def test_front_table_shows_fill_and_marks_trials_under_the_target(filled_study, capsys):
    url, name = filled_study
    assert main(["front", name, "--storage", url]) == 0
    out = capsys.readouterr().out
    assert "1.000" in out and "0.580 !" in out and "0.900 !" in out
    lines = [line for line in out.splitlines() if line.startswith("! trial")]
    assert len(lines) == 2, out
    old = next(line for line in lines if "58.0%" in line)
    assert "fit version 1" in old  # no fit_version recorded: sampled by the first fit
    assert any("the next step of its free size" in line for line in lines)


def test_front_csv_and_json_keep_the_exact_fill(filled_study, capsys):
    url, name = filled_study
    assert main(["front", name, "--storage", url, "--format", "json"]) == 0
    rows = {r["trial"]: r for r in json.loads(capsys.readouterr().out)}
    assert sorted(r["fill"] for r in rows.values()) == [0.580012, 0.9, 0.999876]
    assert sorted(r["fit_version"] for r in rows.values()) == [1, FIT_VERSION, FIT_VERSION]
    assert [r["under_filled"] for r in sorted(rows.values(), key=lambda r: r["fill"])] == [True, True, False]


def test_dashboard_trials_table_shows_fill_and_marks_the_under_filled(filled_study):
    url, name = filled_study
    study = optuna.load_study(study_name=name, storage=url)
    frame = trials_frame(study)
    assert sorted(frame["fill"]) == [0.580012, 0.9, 0.999876]
    assert sorted(frame["fit_version"]) == [1, FIT_VERSION, FIT_VERSION]
    html = table_section(frame, [], ["val_loss", "train_memory_bytes"])  # the report's trials table, figures aside
    assert ">fill</th>" in html
    assert html.count("under-filled") >= 2 and "0.580" in html and "1.000" in html


def test_count_of_a_space_prints_the_fill_its_random_candidates_reach(capsys):
    # shapeshifter: pooled candidates only; under the first fit a quarter of them stored under 0.9
    assert main(["count", "shapeshifter", "--format", "json"]) == 0
    s = json.loads(capsys.readouterr().out)["sample_fill"]
    assert s["feasible"] > 40 and s["under_target"] == 0 and s["min"] >= s["target"] == FILL_TARGET
    assert main(["count", "shapeshifter"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "random candidates" in x)
    assert f"smallest {s['min']:.4f}" in line and f"0 under {FILL_TARGET:g} of the budget" in line


def test_count_of_an_export_prints_the_fill_its_trial_stored(filled_study, tmp_path, capsys):
    url, name = filled_study
    out = tmp_path / "pick.yaml"
    assert main(["export", name, "--storage", url, "--pick", "trial=1", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["count", str(out)]) == 0
    row = next(x for x in capsys.readouterr().out.splitlines() if "budget fill" in x)
    assert "0.5800 of its study's budget (fit version 1)" in row
