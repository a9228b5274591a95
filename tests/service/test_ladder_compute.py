"""A ladder search's spend read from its study (npas.service.study.compute): how many went on at each
rung, and every step trained -- forks, seeds, the rate grid's runs, steps a crashed attempt lost --
as a multiple of N·T in steps and in FLOPs; stored on the study, printed by `npas front`."""

from __future__ import annotations

import copy

import optuna
import pytest

from npas.service.study import compute
from npas.service.study.record import Constraint, StudyAttr, TrialAttr
from tests import rung_study as R
from tests.study_fixture import load

# (rung losses, trained_steps, lr_grid_steps, forward FLOPs per token, status): 8 trials of a ladder at
# rungs 10, 40, 160 with eta 4; two went on from rung 10, one of them from rung 40 (the rung's close)
TRIALS = [
    ({10: 3.0, 40: 2.8, 160: 2.6}, 160 + 2 + 8, 90, 2_000, "ok"),
    ({10: 3.1, 40: 2.9}, 40 + 2, 90, 1_000, "stopped"),
    *[({10: 3.2 + 0.1 * i}, 10, 0, 1_000, "stopped") for i in range(6)],
]


def _study(url: str | None = None, early_stop: bool = True, cosine: bool = False) -> optuna.Study:
    """The study: in Optuna's in-memory storage unless ``url`` names a database (the CLI reads one)."""
    smoke = load()
    study = optuna.create_study(study_name="spent", storage=url, directions=["minimize", "minimize"])
    for k, v in smoke["user_attrs"].items():
        study.set_user_attr(k, v)
    recipe = {k: v for k, v in R.RECIPE.items() if k not in ("rungs", "horizon")} | {"schedule": "cosine"}
    study.set_user_attr(StudyAttr.RECIPE, recipe if cosine else R.RECIPE)
    study.set_user_attr(StudyAttr.EARLY_STOP, early_stop)
    base = smoke["trials"][0]["user_attrs"]
    for losses, steps, grid, fpt, status in TRIALS:
        top = max(losses)
        attrs = {k: copy.deepcopy(base[k]) for k in (TrialAttr.ALLOC, TrialAttr.HASH)}
        attrs.update({TrialAttr.ACCOUNTING: {**base[TrialAttr.ACCOUNTING], "flops_per_token": fpt},
                      TrialAttr.STATUS: status, TrialAttr.FIDELITY: top, TrialAttr.MAX_FIDELITY: R.T,
                      TrialAttr.RUNG_LOSSES: {str(t): v for t, v in losses.items()},
                      TrialAttr.TRAINED_STEPS: steps, TrialAttr.LR_GRID_STEPS: grid})
        study.add_trial(optuna.trial.create_trial(
            values=[losses[top], 1.0], user_attrs=attrs,
            constraints={Constraint.BUDGET: -1.0, Constraint.FIDELITY: (R.T - top) / R.T}))
    # an attempt stopped by its driver: its re-enqueued retry (above) carries its steps, so it adds none
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL, user_attrs={
        TrialAttr.STATUS: "interrupted", TrialAttr.TRAINED_STEPS: 999, TrialAttr.RUNG_LOSSES: {"10": 2.0}}))
    return study


def test_the_compute_counts_every_step_and_weighs_flops_by_each_candidate():
    study = _study()
    c = compute.ladder_compute(study)
    assert c.went_on == ((10, 2, 8), (40, 1, 2)) and (c.trials, c.top) == (8, R.T)
    steps = [s + g for _, s, g, _, _ in TRIALS]
    assert c.steps == sum(steps) == 170 + 90 + 42 + 90 + 60
    tokens = R.RECIPE["batch_size"] * R.RECIPE["seq_len"]
    assert c.nt_steps == 8 * R.T and c.steps_x == pytest.approx(sum(steps) / (8 * 160))
    fpts = [f for *_, f, _ in TRIALS]
    assert c.flops == sum(s * tokens * f for s, f in zip(steps, fpts, strict=True))
    assert c.nt_flops == sum(R.T * tokens * f for f in fpts)
    assert c.flops_x > c.steps_x  # the trial that went furthest is the larger one
    assert c.line() == ("ladder (rungs 10, 40, 160; eta 4): rung 10 -> 2 of 8 went on, rung 40 -> 1 of 2; "
                        f"compute {c.steps_x:.2f} N·T steps, {c.flops_x:.2f} N·T FLOPs (N = 8 trials, T = 160 steps)")
    assert f"{c.steps_x:.2f}" == "0.35" and f"{c.flops_x:.2f}" == "0.49"  # 452 / 1,280; 712k / 1,440k (x tokens)
    compute.record(study)
    stored = study.user_attrs[compute.LADDER_COMPUTE_ATTR]
    assert stored["went_on"][0] == {"rung": 10, "went_on": 2, "results": 8} and stored["steps"] == c.steps
    assert stored["steps_x_nt"] == round(c.steps_x, 4) and stored["rungs"] == [10, 40, 160] and stored["eta"] == 4


def test_a_study_not_searched_under_the_ladder_has_no_ladder_compute():
    assert compute.ladder_compute(_study(early_stop=False)) is None
    cosine = _study(cosine=True)
    assert compute.record(cosine) is None and compute.LADDER_COMPUTE_ATTR not in cosine.user_attrs


def test_npas_front_and_the_dashboard_show_the_ladder_line(tmp_path, capsys):
    from npas.presentation.cli import main
    from npas.presentation.dashboard.rungs import caption, rungs_info

    url = f"sqlite:///{tmp_path / 'f.db'}"
    study = _study(url)
    assert main(["front", "spent", "--storage", url]) == 0
    out = capsys.readouterr().out
    line = compute.ladder_compute(study).line()
    assert line in out.splitlines() and "rung 10 -> 2 of 8 went on, rung 40 -> 1 of 2; compute 0.35 N·T" in line
    info = rungs_info(study)
    assert info.compute == line and caption(info).endswith("The search's spend: " + line + ".")
