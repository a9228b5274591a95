"""The front is read at the top rung T (issue #34 item 4): `npas front`, the picks, `npas export` and
`npas validate` see only trials that trained to T, whatever the sampler was told about a trial stopped
below it, and `npas front` says how many reached T.

The study is the smoke study (a real search's) plus one trial stopped at half of T whose lower-rung loss
beats every trial at T: the trap a front read at mixed fidelities falls into. Two versions: the trial
carries the violated fidelity constraint today's recorder writes (Optuna's own `best_trials` already
drops it), and one without it, as a ladder that tells the sampler a stopped trial's rung loss may write
it (the case `best_trials` gets wrong: the stopped trial dominates the whole front).
"""

from __future__ import annotations

import copy

import optuna
import pytest

from npas.errors import StudyError
from npas.presentation.cli import main
from npas.service.certify.targets import Options, make_plan
from npas.service.export.exporter import write_export
from npas.service.export.picks import pick
from npas.service.study import rungs, studies
from npas.service.study.record import TrialAttr
from npas.training.recipe import Recipe
from tests.study_fixture import load, rebuild

STOPPED = 6  # the added trial's number
SMOKE_FRONT = [4, 0]  # the smoke study's own front, by loss


def _study(tmp_path, constraint: bool) -> tuple[optuna.Study, str]:
    data = load()
    t = copy.deepcopy(data["trials"][5])  # a searched allocation that is on no front (its hash is its own)
    t["number"] = STOPPED
    t["values"] = [2.9, 2_300_000.0]  # lower loss and less memory than every trial at T
    t["user_attrs"].update({TrialAttr.FIDELITY: 20, TrialAttr.STATUS: "stopped",
                            TrialAttr.RUNG_LOSSES: {"10": 3.3, "20": 2.9}})
    assert t["user_attrs"][TrialAttr.MAX_FIDELITY] == 40
    t["system_attrs"]["constraints:fidelity"] = 0.5
    if not constraint:
        del t["system_attrs"]["constraints:fidelity"]
    data["trials"].append(t)
    url = f"sqlite:///{tmp_path}/npas.db"
    return rebuild(data, url), url


@pytest.mark.parametrize("constraint", [True, False], ids=["fidelity-constraint", "no-constraint"])
def test_a_trial_stopped_below_T_with_a_better_loss_is_on_no_front_and_no_pick(tmp_path, constraint):
    study, _ = _study(tmp_path, constraint)
    assert not studies.reached_top(study.trials[STOPPED])
    assert [t.number for t in studies.front_trials(study)] == SMOKE_FRONT
    for how in ("knee", "min-loss", "max-memory=3e6"):
        assert pick(study, how).number != STOPPED
    assert pick(study, "min-loss").number == 4
    with pytest.raises(StudyError, match="below the top rung"):
        pick(study, f"trial={STOPPED}")
    with pytest.raises(StudyError, match="below the top rung"):
        write_export(study, tmp_path / "x.yaml", f"trial={STOPPED}")
    assert not (tmp_path / "x.yaml").exists()
    plan = make_plan(study, Options(top=4, sample=6), Recipe.from_dict(study.user_attrs["recipe"]))
    assert STOPPED not in {t.source for t in plan.targets}
    assert {t.source for t in plan.targets if "front" in t.roles} == set(SMOKE_FRONT)


def test_without_the_constraint_optunas_best_trials_would_have_put_it_alone_on_the_front(tmp_path):
    """The premise of reading T explicitly: the stopped trial dominates every trial at T."""
    study, _ = _study(tmp_path, constraint=False)
    assert [t.number for t in study.best_trials] == [STOPPED]


def test_npas_front_says_how_many_trials_reached_T(tmp_path, capsys):
    study, url = _study(tmp_path, constraint=False)
    assert main(["front", "smoke", "--storage", url]) == 0
    out = capsys.readouterr().out
    assert "Pareto front of study smoke (2 trials)" in out
    assert "front read at the top rung: 6 of 7 trials reached T = 40 steps" in out
    assert "lr_factor" not in out  # no trial of this study located a rate: the table is as it was
    rows = [ln.split()[0] for ln in out.splitlines()[2:4]]
    assert rows == ["4", "0"]
    s = rungs.summary(study)
    assert (s.top, s.reached, s.trials, s.running) == (40, 6, 7, 0)


def test_a_pick_refused_below_T_is_one_line_exit_2_nothing_written(tmp_path, capsys):
    _, url = _study(tmp_path, constraint=True)
    out = tmp_path / "best.yaml"
    assert main(["export", "smoke", "--storage", url, "--pick", f"trial={STOPPED}", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "stopped at step 20 of 40" in err and "npas front smoke" in err
    assert not out.exists()


def test_the_dashboard_front_and_hypervolume_ignore_it(tmp_path, smoke_study):
    from npas.presentation.dashboard.info import hypervolume_info, pareto_info

    study, _ = _study(tmp_path, constraint=False)
    info = pareto_info(study)
    assert sorted(info.front) == sorted(SMOKE_FRONT)
    (stopped,) = [p for p in info.points if p.number == STOPPED]
    assert not stopped.on_front and not stopped.full_fidelity
    assert hypervolume_info(study).values[-1] == hypervolume_info(smoke_study[0]).values[-1]
