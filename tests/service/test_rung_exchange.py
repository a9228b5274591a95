"""Two drivers on one study decide their rungs on the union of both drivers' results
(npas.service.search.rung_exchange), not each on its own trials.

The drivers are two ``SearchLadder`` schedulers over one real Optuna study (a file SQLite storage:
what a second driver process reads); Tune's trials and controller are stand-ins exposing only what a
scheduler is handed (trial id, config, status; get_trials, stop_trial), so each decision is checked
where it is made."""

from __future__ import annotations

from types import SimpleNamespace

import optuna
import pytest
from ray.tune.experiment import Trial
from ray.tune.schedulers import TrialScheduler

from npas.service.search.admission import ranked_objectives
from npas.service.search.ladder_run import SearchLadder
from npas.service.search.rung_exchange import RungExchange, foreign_key
from npas.service.study.record import TrialAttr

OBJECTIVES = ["val_loss", "train_memory_bytes"]
RUNGS = (10, 40, 160)
MEMORY = 1000.0  # every trial the same size: the rung loss alone decides


class Driver:
    """One driver's ladder, its exchange and its trials (Tune id -> Optuna trial)."""

    def __init__(self, study: optuna.Study, name: str, share: bool = True) -> None:
        self.study, self.name = study, name
        self.live: dict[str, optuna.Trial] = {}
        self.tune: dict[str, SimpleNamespace] = {}
        self.ladder = SearchLadder(RUNGS, OBJECTIVES, max_running=4)
        self.paused_counts: list[int] = []
        self.ladder.on_paused = self.paused_counts.append
        if share:
            names = list(OBJECTIVES)
            self.ladder.exchange = RungExchange(study, self.live.get, lambda: {t.number for t in self.live.values()},
                                                [names.index(o) for o in ranked_objectives(names)], pull_every_s=0.0)
        self.controller = SimpleNamespace(get_trials=lambda: list(self.tune.values()),
                                          search_alg=SimpleNamespace(is_finished=lambda: False),
                                          stop_trial=lambda t: setattr(t, "status", Trial.TERMINATED))

    def report(self, loss: float, rung: int = 10) -> tuple[str, str]:
        tid = f"{self.name}{len(self.tune)}"
        self.live[tid] = self.study.ask()
        self.tune[tid] = SimpleNamespace(trial_id=tid, config={}, status=Trial.RUNNING)
        action = self.ladder.on_trial_result(self.controller, self.tune[tid], {
            "rung": rung, "val_loss": loss, "ladder_obj_train_memory_bytes": MEMORY})
        if action == TrialScheduler.PAUSE:
            self.tune[tid].status = Trial.PAUSED
        return tid, action


@pytest.fixture
def study(tmp_path):
    return optuna.create_study(study_name="shared", storage=f"sqlite:///{tmp_path / 's.db'}",
                               directions=["minimize", "minimize"])


def test_a_paused_trial_is_promoted_by_the_other_drivers_results(study):
    a, b = Driver(study, "a"), Driver(study, "b")
    a_ids = [a.report(x)[0] for x in (3.0, 3.1, 3.2)]
    assert all(a.tune[t].status == Trial.PAUSED for t in a_ids)  # 3 results, quota 3 // 4 = 0
    assert a.paused_counts == [1, 2, 3]
    actions = [b.report(x)[1] for x in (3.5, 3.4, 3.3, 3.05, 2.9)]
    # B ranks its results among A's: at its 5th, 8 results, quota 2 = its 2.9 and A's 3.0
    assert actions == [TrialScheduler.PAUSE] * 4 + [TrialScheduler.CONTINUE]
    best_a = foreign_key(a.live[a_ids[0]].number)
    assert b.ladder.ladder.is_promoted(best_a, 10)
    # A reads B's results when it next chooses a trial to run: its 3.0 now ranks in the quota
    chosen = a.ladder.choose_trial_to_run(a.controller)
    assert chosen is a.tune[a_ids[0]]
    assert a.paused_counts[-1] == 2
    stored = study.get_trials(deepcopy=False)[a.live[a_ids[0]].number].user_attrs
    assert stored[TrialAttr.RUNG_LOSSES] == {"10": 3.0}
    assert stored[TrialAttr.LADDER] == {"objectives": [MEMORY], "promoted": [10]}
    # A's others stay paused: they rank 4th and 5th of 8
    assert a.ladder.choose_trial_to_run(a.controller) is None


def test_without_the_exchange_each_driver_decides_on_its_own_trials_only(study):
    """The behaviour this module replaces: A never promotes, whatever B reports."""
    a, b = Driver(study, "a", share=False), Driver(study, "b", share=False)
    for x in (3.0, 3.1, 3.2):
        a.report(x)
    for x in (3.5, 3.4, 3.3, 3.05, 2.9):
        b.report(x)
    a.ladder._stop_stranded = lambda *args: None  # keep the paused trials to show none is chosen
    assert a.ladder.choose_trial_to_run(a.controller) is None


def test_a_driver_with_nothing_left_to_run_reads_the_others_before_stopping_its_paused_trials(study):
    a, b = Driver(study, "a"), Driver(study, "b")
    a_ids = [a.report(x)[0] for x in (3.0, 3.1, 3.2)]
    a.ladder.exchange.pull_every_s = 3600.0  # only a forced read can see B's results
    a.ladder.exchange.pull(a.ladder.ladder)  # A's throttle now starts: its next unforced pull is skipped
    for x in (3.5, 3.4, 3.3, 3.05, 2.9):
        b.report(x)
    a.controller.search_alg.is_finished = lambda: True  # A asked its last trial; nothing runs or waits
    # the stranded check pulled: B's results promote A's 3.0, which resumes instead of being stopped
    assert a.ladder.choose_trial_to_run(a.controller) is a.tune[a_ids[0]]
    a.ladder.choose_trial_to_run(a.controller)  # nothing promotes the rest: they are stopped
    assert [a.tune[t].status for t in a_ids[1:]] == [Trial.TERMINATED] * 2


def test_a_told_trial_of_another_driver_ranks_on_its_values_when_it_published_no_objectives(study):
    t = study.ask()
    t.set_user_attr(TrialAttr.RUNG_LOSSES, {"10": 2.5, "40": 2.2})
    study.tell(t, [2.2, 7.0])
    a = Driver(study, "a")
    assert a.ladder.exchange.pull(a.ladder.ladder)
    got = {r.trial: r for r in a.ladder.ladder.results[40]}[foreign_key(t.number)]
    assert (got.loss, got.objectives) == (2.2, (7.0,))
    assert a.ladder.ladder.is_promoted(foreign_key(t.number), 10)  # it has a loss above rung 10
    assert not a.ladder.exchange.pull(a.ladder.ladder)  # nothing new the second time
