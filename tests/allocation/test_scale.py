"""Search at scale: the driver's incremental study tally, and infeasible asks told so TPE learns.

The searcher is driven through Ray Tune's Searcher protocol directly (as in test_searcher.py) with a
cheap stand-in for training, on tests/data/tiny.yaml at 0.2x, where about one candidate in seven
cannot fit the budget.
"""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from npas.errors import StudyError
from npas.presentation.dashboard.info import pareto_info, summary_info
from npas.service.certify.targets import Options, make_plan
from npas.service.export.picks import pick
from npas.service.search.samplers import learns_from_infeasible, make_sampler
from npas.service.search.searcher import NpasSearcher
from npas.service.study.record import Constraint, StudyAttr, TrialAttr
from npas.service.study.studies import counts_toward_target, front_trials, same_key, status, was_evaluated
from npas.service.study.tally import StudyTally
from npas.training.recipe import load_recipe
from tests.conftest import ROOT
from tests.service.test_searcher import drive

OBJECTIVES = ["val_loss", "train_memory_bytes"]  # tiny.yaml's
BUDGET = "0.2x"  # about one candidate in seven cannot fit


@pytest.fixture(scope="module")
def tpe_study(tmp_path_factory) -> tuple[optuna.Study, NpasSearcher]:
    return drive("tpe", 12, tmp_path_factory.mktemp("tpe"), BUDGET)


# ---- feasibility learning -----------------------------------------------------------------------
def test_tpe_is_told_infeasible_asks_as_complete_trials_with_a_violated_constraint(tpe_study):
    study, searcher = tpe_study
    assert searcher.learn_infeasible and learns_from_infeasible(study.sampler)
    infeasible = [t for t in study.trials if status(t) == "infeasible"]
    assert infeasible, "tiny.yaml at 0.2x has candidates that cannot fit"
    for t in infeasible:
        assert t.state == TrialState.COMPLETE and t.constraints[Constraint.FIT] == 1.0
        assert not was_evaluated(t) and not counts_toward_target(t)
    # TPE reads them: its infeasible split is by the constraint sum
    from optuna.samplers._tpe.sampler import _get_infeasible_trial_score

    assert all(_get_infeasible_trial_score(t) > 0 for t in infeasible)


def test_infeasible_asks_never_count_toward_the_target(tpe_study):
    study, searcher = tpe_study
    counted = [t for t in study.trials if counts_toward_target(t)]
    assert searcher.error is None
    assert len(counted) == 12 and searcher.tally.counted == 12
    assert all(status(t) in ("ok", "stopped") for t in counted)


def test_infeasible_asks_never_reach_the_front_a_pick_or_validate(tpe_study):
    study, _ = tpe_study
    infeasible = {t.number for t in study.trials if status(t) == "infeasible"}
    assert infeasible.isdisjoint(t.number for t in front_trials(study))
    assert pick(study, "knee").number not in infeasible
    assert pick(study, "min-loss").number not in infeasible
    plan = make_plan(study, Options(top=50, sample=50), load_recipe(ROOT / "tests" / "data" / "fast.yaml"))
    sources = {t.source for t in plan.targets if t.source is not None}
    assert sources and infeasible.isdisjoint(sources)


def test_a_pick_by_number_refuses_an_infeasible_ask_that_carries_an_allocation(tpe_study, tmp_path):
    """A candidate refused for the recipe (seq_len > its context) is infeasible after it was fitted and
    counted, so it carries an allocation; told COMPLETE, it must still not be picked."""
    source, _ = tpe_study
    ok = next(t for t in source.trials if was_evaluated(t))
    refused = optuna.trial.create_trial(
        params=ok.params, distributions=ok.distributions, values=[0.0, 0.0],  # better than anything: a trap
        user_attrs={**ok.user_attrs, TrialAttr.STATUS: "infeasible", TrialAttr.REASON: "seq_len > context"},
        system_attrs={"constraints:" + Constraint.FIT: 1.0, "constraints:" + Constraint.BUDGET: -1.0})
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/copy.db", directions=["minimize"] * 2)
    study.set_user_attr(StudyAttr.OBJECTIVES, OBJECTIVES)
    study.add_trials([*source.trials, refused])
    number = len(source.trials)
    assert study.trials[number].constraints[Constraint.FIT] == 1.0
    with pytest.raises(StudyError, match="not complete"):
        pick(study, f"trial={number}")
    assert number not in {t.number for t in front_trials(study)}
    assert pick(study, "min-loss").number != number


def test_dashboard_counts_only_evaluated_trials_as_complete(tpe_study):
    study, _ = tpe_study
    evaluated = [t for t in study.trials if was_evaluated(t)]
    told_complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    assert len(told_complete) > len(evaluated)  # the infeasible asks are COMPLETE in Optuna's terms
    assert summary_info(study).n_complete == len(evaluated)
    assert {p.number for p in pareto_info(study).points} == {t.number for t in evaluated}


def test_samplers_that_read_values_of_every_complete_trial_keep_fail(tmp_path):
    study, searcher = drive("random", 12, tmp_path, BUDGET)
    assert not searcher.learn_infeasible
    infeasible = [t for t in study.trials if status(t) == "infeasible"]
    assert infeasible and all(t.state == TrialState.FAIL for t in infeasible)
    for name in ("gp", "nsga2"):
        assert not learns_from_infeasible(make_sampler(name, 0, 2))


# ---- the incremental tally ----------------------------------------------------------------------
def scanned(study: optuna.Study) -> dict:
    """What the tally keeps, recomputed from every trial (the old way)."""
    trials = study.get_trials(deepcopy=False)
    return {"counted": sum(counts_toward_target(t) for t in trials), "front": len(front_trials(study)),
            "before": [sum(counts_toward_target(t) for t in trials if t.number < n) for n in range(len(trials) + 1)]}


def tallied(tally: StudyTally, n: int) -> dict:
    return {"counted": tally.counted, "front": tally.front_size,
            "before": [tally.counted_before(k) for k in range(n + 1)]}


class CountingTally(StudyTally):
    def __init__(self, study: optuna.Study) -> None:
        super().__init__(study)
        self.looked: list[int] = []

    def _look(self, t) -> None:
        self.looked.append(t.number)
        super()._look(t)


def test_tally_agrees_with_a_full_scan_and_looks_only_at_what_changed(tpe_study, tmp_path):
    source, _ = tpe_study
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/copy.db", directions=["minimize"] * 2)
    study.add_trials(source.trials)  # every state and status a search produces
    tally = CountingTally(study)
    tally.refresh()
    n = len(study.trials)
    assert tallied(tally, n) == scanned(study)
    assert tally.looked == list(range(n))

    # trials other drivers add: one running with a key, one waiting, one worker failure, one complete
    key = next(t.user_attrs[TrialAttr.KEY] for t in source.trials if was_evaluated(t))
    running = study.ask()
    running.set_user_attr(TrialAttr.KEY, "k-running")
    failed = study.ask()
    failed.set_user_attr(TrialAttr.STATUS, "failed")
    study.tell(failed, state=TrialState.FAIL)
    study.enqueue_trial({})
    tally.looked.clear()
    tally.refresh()
    assert tally.looked == [n, n + 1, n + 2]  # only the new trials, not the n finished ones
    assert tallied(tally, n + 3) == scanned(study)
    assert tally.twin("k-running", -1) == running.number == same_key(study, "k-running", -1)
    assert tally.twin("k-running", -1, running=False) is None
    assert tally.twin(key, -1) == same_key(study, key, -1)

    # the running one finishes: it and the still waiting one are looked at again, nothing else
    study.tell(running, [0.0, 0.0])
    tally.looked.clear()
    tally.refresh()
    assert sorted(tally.looked) == [running.number, n + 2]
    assert tallied(tally, n + 3) == scanned(study)
    assert tally.twin("k-running", -1, running=False) == running.number
