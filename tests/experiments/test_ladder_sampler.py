"""experiments/ladder_sampler.py: what the sampler is told of trials the ladder stops below T, measured on a
synthetic objective through npas's own searcher and ladder; and the recorder's three ways of telling."""

from __future__ import annotations

import pytest

from experiments import ladder_sampler as ls
from npas import load_space
from npas.service.study.record import Constraint, TrialAttr
from npas.service.study.studies import front_trials, reached_top

N = 6


@pytest.fixture(scope="module")
def space():
    return load_space(ls.SPACE)


@pytest.fixture(scope="module")
def runs(space):
    return {arm: ls.search(space, arm, 0, N, 8, 64) for arm in ("constraint", "fail", "plain", "all-to-T")}


@pytest.mark.slow  # the module's synthetic searches through the real searcher (~8 s)
def test_nothing_is_told_before_the_driver_ends_so_the_first_driver_is_the_same_under_every_telling(runs):
    firsts = {arm: runs[arm]["N"] for arm in ("constraint", "fail", "plain")}
    assert firsts["constraint"]["points"] == firsts["fail"]["points"] == firsts["plain"]["points"]
    assert firsts["constraint"]["steps"] == firsts["fail"]["steps"]


@pytest.mark.slow  # the module's synthetic searches through the real searcher (~8 s)
def test_the_ladder_trains_fewer_steps_than_every_candidate_to_t(runs):
    for label in ("N", "2N"):
        full = runs["all-to-T"][label]
        assert full["steps"] == full["started"] * ls.T
        ladder = runs["constraint"][label]
        assert ladder["started"] == full["started"]
        assert ladder["steps"] < 0.8 * full["steps"]
        assert 0 < len(ladder["points"]) < len(full["points"])


def test_rung_losses_are_fixed_per_allocation_and_end_at_the_surrogate(space):
    import optuna

    # a seeded sampler and the first candidate that fits: an unseeded draw is infeasible now and then
    # (config None), which made this test fail at random
    study = optuna.create_study(directions=["minimize", "minimize"], sampler=optuna.samplers.RandomSampler(seed=0))
    cand = next(c for c in (space.sample(study.ask()) for _ in range(50)) if c.config is not None)
    assert ls.rung_loss(cand.config, ls.T) == ls.surrogate_loss(cand.config)
    assert ls.rung_loss(cand.config, ls.RUNGS[0]) == ls.rung_loss(cand.config, ls.RUNGS[0])
    assert ls.rung_loss(cand.config, ls.RUNGS[0]) > ls.rung_loss(cand.config, ls.T) + 0.2


@pytest.mark.slow  # the module's synthetic searches through the real searcher (~8 s)
@pytest.mark.parametrize("told", ["constraint", "fail", "plain"])
def test_a_stopped_trial_is_told_as_the_recorder_is_set_and_never_reaches_the_front(runs, told):
    import optuna

    study = optuna.load_study(study_name=runs[told]["study"], storage=runs[told]["storage"])
    stopped = [t for t in study.trials if t.user_attrs.get(TrialAttr.STATUS) == "stopped"]
    assert stopped
    for t in stopped:
        if told == "fail":
            assert t.state == optuna.trial.TrialState.FAIL
        else:
            assert t.state == optuna.trial.TrialState.COMPLETE
            assert (t.constraints.get(Constraint.FIDELITY, 0.0) > 0) == (told == "constraint")
        assert not reached_top(t)  # its steps are below T, whatever the sampler was told
    assert not {t.number for t in stopped} & {t.number for t in front_trials(study)}
