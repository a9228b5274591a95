"""The ladder's one promotion rule (npas/service/study/ladder.py's docstring): the k-th rung promotes
at most floor(N / eta**k) trials in a search, each only while in the top floor(n / eta) of the n results
there so far; noise ties add nobody; baselines follow it; a resume counts the promotions already made
and caps by its own target; a rung that closes with nobody promoted sends its best on.

Pure logic (no Ray, no training): the ladder itself, the Tune scheduler over stand-in trials (what Tune
hands a scheduler: ids, configs, statuses), and the rebuild from a real Optuna study."""

from __future__ import annotations

from types import SimpleNamespace

import optuna
import pytest
from optuna.trial import TrialState
from ray.tune.experiment import Trial
from ray.tune.schedulers import TrialScheduler

from npas.service.search.ladder_run import SearchLadder, rebuild
from npas.service.study.ladder import Ladder, RungResult, decide
from npas.service.study.record import TrialAttr

RUNGS = (12, 50, 200)  # smoke-wsd's
OBJECTIVES = ["val_loss", "train_memory_bytes"]


def rr(trial: str, loss: float) -> RungResult:
    return RungResult(trial, loss)


def test_at_n_8_and_eta_4_at_most_two_trials_pass_the_first_rung_in_any_order():
    # the order that spends most under asynchronous promotion: every arrival is the best so far, and
    # all eight within 0.007 nats of each other (within the seed noise: the old tie rule's case)
    ladder = Ladder(RUNGS, eta=4, target=8)
    for i in range(8):
        ladder.report(12, rr(f"t{i}", 3.0 - 0.001 * i))
    assert len(ladder.promoted[12]) == 2 == ladder.cap(12)
    assert ladder.promoted[12] == ["t3", "t4"]  # at 4 results t3 led, at 5 t4: the cap is spent
    assert ladder.is_full(12) and ladder.cap(50) == 0 and ladder.cap(200) == 0
    best_first = Ladder(RUNGS, eta=4, target=8)  # the kind order: the best arrive first, and wait
    for i in range(8):
        best_first.report(12, rr(f"t{i}", 3.0 + 0.001 * i))
    assert best_first.promoted[12] == ["t0", "t1"]  # t0 at 4 results, t1 at 8: each in the top n // 4
    assert Ladder(RUNGS, eta=4, target=64).cap(12) == 16 and Ladder(RUNGS, eta=4, target=64).cap(50) == 4


def test_a_trial_goes_on_only_while_in_the_top_n_over_eta_and_a_noise_tie_adds_nobody():
    results = [rr("a", 1.0), rr("b", 1.1), rr("c", 1.1001), rr("d", 1.2)]  # c within any noise of b
    d = decide(results, promoted=[], eta=2, cap=10)
    assert d.quota == 2 and d.promote == ("a", "b")  # room under the cap, but c is third of four
    assert decide(results, promoted=["a"], eta=2, cap=2).promote == ("b",)
    assert decide(results, promoted=["a", "x"], eta=2, cap=2).promote == ()  # the cap counts every promotion
    assert decide(results[:3], promoted=[], eta=4, cap=5).promote == ()  # 3 results: floor(3/4) = 0


def test_baselines_pause_and_stop_like_every_other_trial():
    sched = SearchLadder(RUNGS, OBJECTIVES, max_running=4, target=8)
    trials = []
    for i in range(8):  # the first four are the enqueued baselines, and the worst at rung 12
        t = SimpleNamespace(trial_id=f"t{i}", config={"baseline": "b"} if i < 4 else {}, status=Trial.RUNNING)
        action = sched.on_trial_result(None, t, {"rung": 12, "val_loss": 3.5 - 0.1 * i,
                                                 "ladder_obj_train_memory_bytes": 1.0})
        trials.append(action)
    assert trials[:3] == [TrialScheduler.PAUSE] * 3  # a baseline waits at the rung as any trial does
    assert trials[3] == TrialScheduler.CONTINUE and trials[4] == TrialScheduler.CONTINUE  # t3, then t4
    assert trials[5:] == [TrialScheduler.STOP] * 3  # the cap (2) is spent: nothing promotes them any more
    assert sched.ladder.promoted[12] == ["t3", "t4"]


def test_paused_trials_at_a_rung_that_spent_its_cap_are_stopped():
    sched = SearchLadder(RUNGS, OBJECTIVES, max_running=4, target=8)
    tune: dict[str, SimpleNamespace] = {}
    ctl = SimpleNamespace(get_trials=lambda: list(tune.values()), search_alg=SimpleNamespace(is_finished=lambda: False),
                          stop_trial=lambda t: setattr(t, "status", Trial.TERMINATED))
    for i, loss in enumerate([3.0, 3.1, 3.2, 3.3, 2.9, 2.8]):
        tune[f"t{i}"] = SimpleNamespace(trial_id=f"t{i}", config={}, status=Trial.RUNNING)
        if sched.on_trial_result(ctl, tune[f"t{i}"], {"rung": 12, "val_loss": loss,
                                                      "ladder_obj_train_memory_bytes": 1.0}) == TrialScheduler.PAUSE:
            tune[f"t{i}"].status = Trial.PAUSED
    # t0 (3.0) promoted from its pause at 4 results, t4 (2.9) at once at 5: the cap is spent
    assert sched.ladder.promoted[12] == ["t0", "t4"] and tune["t5"].status == Trial.RUNNING
    chosen = sched.choose_trial_to_run(ctl)
    assert chosen is tune["t0"]  # the promoted paused trial resumes first ...
    assert [tune[t].status for t in ("t1", "t2", "t3")] == [Trial.TERMINATED] * 3  # ... the rest are stopped


def test_a_rung_that_closes_with_nobody_promoted_sends_its_best_waiting_trial_on():
    sched = SearchLadder(RUNGS, OBJECTIVES, max_running=4, target=8)
    sched.ladder.promoted[12] = ["t0", "t1"]  # the two that passed rung 12
    tune = {t: SimpleNamespace(trial_id=t, config={}, status=Trial.RUNNING) for t in ("t0", "t1")}
    ctl = SimpleNamespace(get_trials=lambda: list(tune.values()), search_alg=SimpleNamespace(is_finished=lambda: True),
                          stop_trial=lambda t: setattr(t, "status", Trial.TERMINATED))
    for tid, loss in (("t0", 2.6), ("t1", 2.5)):
        assert sched.on_trial_result(ctl, tune[tid], {"rung": 50, "val_loss": loss,
                                                      "ladder_obj_train_memory_bytes": 1.0}) == TrialScheduler.PAUSE
        tune[tid].status = Trial.PAUSED  # floor(2 / 4) = 0 and the cap floor(8 / 16) = 0: both wait
    assert sched.choose_trial_to_run(ctl) is tune["t1"]  # nothing else can come: the rung's best goes on
    assert tune["t0"].status == Trial.TERMINATED and sched.ladder.promoted[50] == ["t1"]
    assert Ladder(RUNGS, target=8).close(50, ["x"]).promote == ()  # no result there: nobody
    again = Ladder(RUNGS, target=8, promoted={50: ["t1"]})
    again.results[50] = [rr("t0", 2.0)]
    assert again.close(50, ["t0"]).promote == ()  # it promoted someone already: the cap stands


def _told(study: optuna.Study, losses: dict[int, float | None], promoted: list[int] = (),
          status: str | None = None) -> None:
    t = study.ask()
    t.set_user_attr(TrialAttr.RUNG_LOSSES, {str(k): v for k, v in losses.items()})
    if promoted:
        t.set_user_attr(TrialAttr.LADDER, {"objectives": [1.0], "promoted": list(promoted)})
    if status is None:
        study.tell(t, [losses[max(losses)], 1.0])
    else:
        t.set_user_attr(TrialAttr.STATUS, status)
        study.tell(t, state=TrialState.FAIL)


def test_a_resumed_search_counts_the_promotions_already_made_and_caps_by_its_new_target():
    study = optuna.create_study(directions=["minimize", "minimize"])  # Optuna's in-memory storage: same reads
    _told(study, {12: 3.0, 50: 2.6})  # went on from 12 (a loss above it)
    _told(study, {12: 3.1, 50: None}, status="failed")  # promoted, then diverged on the way to 50
    _told(study, {12: 1.0}, promoted=[12], status="interrupted")  # its re-enqueued retry reports rung 12 again
    for loss in (3.2, 3.3, 3.4, 3.5):
        _told(study, {12: loss})
    ladder = rebuild(study, RUNGS, OBJECTIVES, eta=4, target=8)
    assert sorted(ladder.promoted[12]) == ["study:0", "study:1"] and ladder.is_full(12)
    assert len(ladder.results[12]) == 6  # the interrupted attempt is not a result: its retry will be
    assert ladder.report(12, RungResult("new", 2.0, (1.0,))).promote == ()  # the best yet, but the cap is spent
    wider = rebuild(study, RUNGS, OBJECTIVES, eta=4, target=16)  # npas resume --trials 16
    assert wider.cap(12) == 4 and wider.report(12, RungResult("new", 2.0, (1.0,))).promote == ("new",)


@pytest.mark.slow
def test_a_real_search_of_8_trials_sends_at_most_2_past_the_first_rung_and_prints_its_spend(tmp_path, capsys,
                                                                                         monkeypatch):
    """`npas search` as a user runs it: the tiny space, a ladder at rungs 5, 10 and 40 (the shape of
    smoke-wsd's 12, 50, 200), 8 trials, two workers."""
    from npas.presentation.cli import main
    from npas.service.execution import session as runner
    from tests.service.test_ladder_search import TINY, wsd_recipe

    monkeypatch.setattr(runner, "RUNS_DIR", tmp_path / "runs")
    url = f"sqlite:///{tmp_path / 'r.db'}"
    code = main(["search", str(TINY), "--recipe", wsd_recipe(tmp_path, rungs=[5, 10, 40]), "--trials", "8",
                 "--study", "rule", "--storage", url, "--sampler", "random", "--seed", "4"])
    out = capsys.readouterr().out
    assert code == 0, out
    study = optuna.load_study(study_name="rule", storage=url)
    told = [t for t in study.trials if t.state == TrialState.COMPLETE]
    reached = [t.user_attrs[TrialAttr.FIDELITY] for t in told]
    assert len(told) == 8 and sum(r > 5 for r in reached) <= 2 and reached.count(40) == 1  # the close sends one
    assert "ladder (rungs 5, 10, 40; eta 4): rung 5 -> " in out and " of 8 went on, rung 10 -> 1 of " in out
    assert study.user_attrs["ladder_compute"]["went_on"][0]["went_on"] <= 2
