"""`npas search` under the promotion ladder (issue #34): a wsd recipe's trials climb the rungs, paused
and resumed from their checkpoints, told once when they stop; a cosine search keeps ASHA.

Fast tests check the plan's choice and the searcher's bookkeeping through Tune's protocol; slow ones
run real searches (real Ray, real SQLite, real WSD training on the tiny space)."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

import npas
from npas.service.execution import session as runner
from npas.service.search.driver import search
from npas.service.search.launch import Launch
from npas.service.search.plan import plan_search
from npas.service.search.samplers import make_sampler
from npas.service.search.searcher import NpasSearcher
from npas.service.study.record import Constraint, TrialAttr
from npas.training.recipe import load_recipe
from tests.conftest import ROOT

TINY = ROOT / "tests" / "data" / "tiny.yaml"
FAST = ROOT / "tests" / "data" / "fast.yaml"
# 40 steps, rungs at 10 and 40: a trial stopped at rung 10 trains 10 steps, one that reaches 40 trains
# 40 + the rung-10 fork's decay
WSD = {**load_recipe(FAST).to_dict(), "name": "fast-ladder", "schedule": "wsd", "horizon": 40, "rungs": [10, 40]}


def wsd_recipe(tmp_path: Path, **changes) -> str:
    path = tmp_path / "fast-ladder.yaml"
    path.write_text(json.dumps({**WSD, **changes}))  # JSON is YAML
    return str(path)


# ---- the plan's one field -----------------------------------------------------------------------
def test_a_wsd_recipe_searches_under_the_ladder_a_cosine_one_under_asha_and_no_early_stop_under_neither(tmp_path):
    space = npas.load_space(TINY)
    wsd = plan_search(space, study="w", recipe=wsd_recipe(tmp_path))
    assert wsd.fidelity == "ladder" and wsd.rungs == (10, 40)
    assert plan_search(space, study="c", recipe=str(FAST)).fidelity == "asha"
    assert plan_search(space, study="c", recipe=str(FAST)).rungs == ()
    for recipe in (str(FAST), wsd_recipe(tmp_path)):
        assert plan_search(space, study="n", recipe=recipe, launch=Launch(early_stop=False)).fidelity == "none"


# ---- the searcher's side of a paused trial ------------------------------------------------------
def _searcher(tmp_path: Path) -> tuple[optuna.Study, NpasSearcher]:
    space = npas.load_space(TINY)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/s.db", directions=["minimize"] * len(space.objectives),
                                sampler=make_sampler("random", 0, len(space.objectives)))
    searcher = NpasSearcher(study, space, WSD, "fp", 4)
    searcher.ladder_objectives = list(space.objectives)
    return study, searcher


def _rung_report(loss: float, rung: int, trained: int) -> dict:
    proxy = {"status": "ok", "val_loss": loss, "steps_done": rung, "curve": [[rung, loss]],
             "rung_losses": {str(rung): loss}, "steps_trained": trained, "seeds": [0], "seed_losses": [loss]}
    return {"val_loss": loss, "rung": rung, "step": rung, "final": rung == 40, "trained_steps": trained,
            "proxy": json.dumps(proxy)}


def test_a_trial_stopped_while_paused_is_told_once_with_its_last_rung_and_a_violated_fidelity(tmp_path):
    study, searcher = _searcher(tmp_path)
    config = searcher.suggest("t0")
    assert set(config["ladder_objectives"]) == {"train_memory_bytes"}  # ranked on beside the rung loss
    searcher.on_trial_result("t0", _rung_report(3.1, 10, 10))
    searcher.record_checkpoint("t0", str(tmp_path / "checkpoint_000000"))
    number = config["number"]
    running = next(t for t in study.trials if t.number == number)
    assert running.state == TrialState.RUNNING  # paused: still RUNNING, beaten for by its driver
    assert running.user_attrs[TrialAttr.LADDER_CHECKPOINT] == str(tmp_path / "checkpoint_000000")
    assert searcher.live_trial_ids() == [running._trial_id]
    searcher.on_trial_complete("t0")  # Tune stops a PAUSED trial with no result
    t = next(t for t in study.trials if t.number == number)
    assert t.state == TrialState.COMPLETE and t.values[0] == 3.1
    assert t.user_attrs[TrialAttr.STATUS] == "stopped" and t.user_attrs[TrialAttr.FIDELITY] == 10
    assert t.constraints[Constraint.FIDELITY] == (40 - 10) / 40  # violated: TPE models it as infeasible
    assert t.user_attrs[TrialAttr.RUNG_LOSSES] == {"10": 3.1}
    assert t.user_attrs[TrialAttr.TRAINED_STEPS] == 10 and t.user_attrs[TrialAttr.TOP_RUNG] == 10
    assert t.user_attrs[TrialAttr.LADDER_CHECKPOINT] is None  # removed with the trial: nothing to resume
    searcher.on_trial_complete("t0")  # a second stop is not a second tell
    assert sum(1 for t in study.trials if t.number == number) == 1


def test_a_trial_paused_when_its_driver_stops_is_re_enqueued_with_its_checkpoint(tmp_path):
    study, searcher = _searcher(tmp_path)
    config = searcher.suggest("t0")
    searcher.on_trial_result("t0", _rung_report(3.1, 10, 10))
    searcher.record_checkpoint("t0", "/somewhere/checkpoint_000000")
    searcher.abandon_live("interrupted", "interrupted")
    waiting = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.WAITING]
    assert len(waiting) == 1 and waiting[0].user_attrs[TrialAttr.RETRY_OF] == config["number"]
    again = NpasSearcher(study, npas.load_space(TINY), WSD, "fp", 4)
    rerun = again.suggest("t1")
    assert rerun["resume_from"] == "/somewhere/checkpoint_000000"  # the trainable resumes from there


# ---- real searches ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ladder_search(ray_local, tmp_path_factory):
    """Twelve trials (the three baselines among them) of a wsd recipe under the ladder on one worker: one
    at a time, so the order of reports, and with it which trials pause and which are promoted later, is
    the same on every run (CPU training is bitwise); paused trials must not hold the one worker. The
    ladder's cap on rung 10 is floor(12 / 4) = 3; at seed 2 the first four to report are the three
    baselines and a sampled trial, the best of them a baseline that paused at rung 10 and resumes from
    its checkpoint once the rung has four results."""
    tmp = tmp_path_factory.mktemp("ladder")
    saved = runner.RUNS_DIR
    runner.RUNS_DIR = tmp / "runs"
    try:
        plan = plan_search(npas.load_space(TINY), trials=12, study="ladder", storage=f"sqlite:///{tmp}/l.db",
                           recipe=wsd_recipe(tmp), sampler="random", seed=2, launch=Launch(workers=1))
        study = search(plan)
    finally:
        runner.RUNS_DIR = saved
    return study, plan, tmp


@pytest.mark.slow
def test_a_ladder_search_promotes_resumes_bitwise_and_trains_no_step_twice(ladder_search):
    from npas.allocation.config import ArchConfig
    from npas.training import climb

    study, plan, _ = ladder_search
    told = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert len(told) == 12 and not [t for t in study.trials if t.state == TrialState.RUNNING]
    steps, ds = 40, plan.recipe.decay_start(10)
    reached = {t.number: t.user_attrs[TrialAttr.FIDELITY] for t in told}
    for t in told:
        rungs = t.user_attrs[TrialAttr.RUNG_LOSSES]
        assert "10" in rungs  # every trial climbed the first rung
        top = reached[t.number]
        assert t.user_attrs[TrialAttr.TOP_RUNG] == top and list(rungs) == [r for r in ("10", "40") if int(r) <= top]
        # no step twice: the stable run to the top rung plus the rung-10 fork's decay (when it passed it)
        assert t.user_attrs[TrialAttr.TRAINED_STEPS] == {10: 10, 40: 40 + (10 - ds)}[top]
        assert t.user_attrs[TrialAttr.STATUS] == ("ok" if top == steps else "stopped")
    assert 1 <= sum(r == steps for r in reached.values()) <= 12 // 4  # the rung's cap, baselines included
    assert sum(r == 10 for r in reached.values()) >= 12 - 12 // 4  # the rest stop at the first rung
    # a paused trial resumed from its checkpoint reaches exactly the loss of an uninterrupted climb
    resumed = [t for t in told if t.user_attrs[TrialAttr.PROXY].get("resumed_at")]
    assert resumed, "no trial was paused and resumed: this search proves nothing about resuming"
    for t in resumed:
        cfg = ArchConfig.from_dict(t.user_attrs[TrialAttr.ALLOC])
        straight = climb.start(cfg, plan.recipe, plan.corpus, device="cpu", reference=plan.space.reference_chassis)
        straight.climb(until=reached[t.number])
        assert {str(k): v for k, v in straight.rung_losses.items()} == t.user_attrs[TrialAttr.RUNG_LOSSES]
        assert t.values[0] == straight.rung_losses[reached[t.number]]  # bitwise
        assert straight.trained_steps == t.user_attrs[TrialAttr.TRAINED_STEPS]


@pytest.mark.slow
def test_a_ladder_search_through_the_api_records_its_rung_agreement_on_the_study(ladder_search):
    """`npas.search()` has no CLI hook: the searcher itself refreshes the certificate after every trial."""
    from npas.service.study.rungs import RUNG_AGREEMENT_ATTR
    from npas.service.study.studies import is_full_fidelity

    study, plan, _ = ladder_search
    stored = study.user_attrs[RUNG_AGREEMENT_ATTR]
    assert stored["top"] == plan.recipe.steps and stored["trials"] == 12
    assert stored["reached"] == sum(is_full_fidelity(t) for t in study.trials)
    (low,) = stored["agreements"]
    assert (low["rung"], low["next_rung"]) == (10, 40) and low["n"] == stored["reached"]
    spent = study.user_attrs["ladder_compute"]  # and the ladder's spend, refreshed after every trial too
    assert spent["went_on"] == [{"rung": 10, "went_on": 3, "results": 12}]  # the cap: floor(12 / 4)
    assert spent["steps"] == sum(t.user_attrs[TrialAttr.TRAINED_STEPS] for t in study.trials
                                 if TrialAttr.TRAINED_STEPS in t.user_attrs)
    assert spent["nt_steps"] == 12 * 40 and 0 < spent["steps_x_nt"] < 0.5
    # every rung report was published as it happened, for other drivers (rung_exchange), promotions too
    told = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert all(TrialAttr.LADDER in t.user_attrs for t in told)
    for t in told:  # baselines too: they follow the rule like every trial
        if t.user_attrs[TrialAttr.FIDELITY] == plan.recipe.steps:
            assert t.user_attrs[TrialAttr.LADDER]["promoted"] == [10]


@pytest.mark.slow
def test_the_front_of_a_ladder_search_holds_only_trials_that_reached_the_top_and_no_checkpoint_is_left(ladder_search):
    from npas.service.study.studies import front_frame, front_trials

    study, plan, tmp = ladder_search
    front = front_trials(study)
    assert front and all(t.user_attrs[TrialAttr.FIDELITY] == plan.recipe.steps for t in front)
    below = {t.number for t in study.trials if t.user_attrs.get(TrialAttr.FIDELITY, 0) < plan.recipe.steps}
    assert below and not below & set(front_frame(study)["trial"])
    # a stopped trial below T with a loss better than every full one still stays off the front
    assert not below & {t.number for t in study.best_trials}
    assert not list((tmp / "runs").rglob("checkpoint_*")), "a stopped trial's checkpoint was left behind"


@pytest.mark.slow
def test_repeats_climb_together_and_rank_on_the_seed_mean(ray_local, tmp_path):
    import statistics

    from npas.allocation.config import ArchConfig
    from npas.training import climb
    from npas.training.recipe import Recipe

    saved = runner.RUNS_DIR
    runner.RUNS_DIR = tmp_path / "runs"
    try:
        plan = plan_search(npas.load_space(TINY), trials=5, study="r2", storage=f"sqlite:///{tmp_path}/r.db",
                           recipe=wsd_recipe(tmp_path), sampler="random", seed=2, repeats=2, launch=Launch(workers=2))
        assert plan.fidelity == "ladder"
        study = search(plan)
    finally:
        runner.RUNS_DIR = saved
    told = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert len(told) == 5
    ds = plan.recipe.decay_start(10)
    for t in told:
        top = t.user_attrs[TrialAttr.FIDELITY]
        assert t.user_attrs[TrialAttr.SEEDS] == [0, 2] and len(t.user_attrs[TrialAttr.SEED_LOSSES]) == 2
        assert t.user_attrs[TrialAttr.TRAINED_STEPS] == 2 * {10: 10, 40: 40 + (10 - ds)}[top]  # both seeds
    t = next(t for t in told if not t.user_attrs.get(TrialAttr.BASELINE))
    cfg = ArchConfig.from_dict(t.user_attrs[TrialAttr.ALLOC])
    seeds = [climb.start(cfg, Recipe.from_dict({**plan.recipe.to_dict(), "seed": s}), plan.corpus, device="cpu",
                         reference=plan.space.reference_chassis) for s in (0, 2)]
    for c in seeds:
        c.climb(until=10)
    assert t.user_attrs[TrialAttr.RUNG_LOSSES]["10"] == statistics.fmean(c.rung_losses[10] for c in seeds)
    assert not list((tmp_path / "runs").rglob("checkpoint_*"))


@pytest.mark.slow
def test_init_from_climbs_start_from_the_converted_model(ray_local, tmp_path):
    from npas.allocation.config import ArchConfig, reference_config
    from npas.conversion.init_from import initial_state
    from npas.training import climb
    from npas.training.data import load_corpus
    from npas.training.train import train_allocation

    space = npas.load_space(TINY)
    smoke = load_recipe("smoke").with_steps(200)
    corpus = load_corpus(None, smoke.val_fraction, smoke.test_fraction)
    train_allocation(reference_config(space.reference_chassis), smoke, corpus, tmp_path / "dense")
    saved = runner.RUNS_DIR
    runner.RUNS_DIR = tmp_path / "runs"
    try:
        plan = plan_search(space, trials=4, study="warm", storage=f"sqlite:///{tmp_path}/w.db",
                           recipe=wsd_recipe(tmp_path), sampler="random", init_from=str(tmp_path / "dense"),
                           launch=Launch(workers=2))
        assert plan.fidelity == "ladder"
        study = search(plan)
    finally:
        runner.RUNS_DIR = saved
    told = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert len(told) == 4 and all("10" in t.user_attrs[TrialAttr.RUNG_LOSSES] for t in told)
    t = told[-1]
    cfg = ArchConfig.from_dict(t.user_attrs[TrialAttr.ALLOC])
    warm = climb.start(cfg, plan.recipe, plan.corpus, device="cpu", reference=space.reference_chassis,
                       init_state=initial_state(dict(plan.init_from), cfg, plan.recipe.seed, plan.corpus,
                                                plan.recipe.seq_len))
    cold = climb.start(cfg, plan.recipe, plan.corpus, device="cpu", reference=space.reference_chassis)
    warm.climb(until=10)
    cold.climb(until=10)
    assert t.user_attrs[TrialAttr.RUNG_LOSSES]["10"] == warm.rung_losses[10]  # bitwise: the converted start
    assert warm.rung_losses[10] < cold.rung_losses[10] - 0.1


def test_the_ladder_caps_running_trials_not_paused_ones_and_lets_promotions_go_first():
    from npas.service.search.ladder_run import SearchLadder

    sched = SearchLadder((10, 40), ["val_loss", "train_memory_bytes"], max_running=2)
    assert sched.objectives == (("ladder_obj_train_memory_bytes", "min"),)  # the loss is the rung loss itself
    assert sched.admits({"a"}) and not sched.admits({"a", "b"})
    sched.paused.update({"a", "b"})
    assert sched.admits({"a", "b", "c"}) and not sched.admits({"a", "b", "c", "d"})  # paused hold no worker
    sched.to_resume.append("a")  # promoted while paused: it takes the next free worker, not a new trial
    assert not sched.admits({"a", "b"})


@pytest.mark.slow
def test_a_cosine_search_keeps_asha_unchanged(ray_local, tmp_path, monkeypatch):
    from npas.service.search import driver

    seen = []
    real = driver.run_trials

    def spy(searcher, **kw):  # the real runner; only what the driver handed it is noted
        seen.append((kw["early_stop"], kw["ladder"], searcher.admits, searcher.ladder_objectives))
        return real(searcher, **kw)

    monkeypatch.setattr(driver, "run_trials", spy)
    monkeypatch.setattr(runner, "RUNS_DIR", tmp_path / "runs")
    study = search(npas.load_space(TINY), trials=8, study="cos", storage=f"sqlite:///{tmp_path}/c.db",
                   recipe=str(FAST), sampler="random", seed=1, launch=Launch(workers=2))
    assert seen == [(True, None, None, None)]  # ASHA, as before the ladder: no ladder, no running cap
    told = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert len(told) == 8
    for t in told:
        assert t.user_attrs[TrialAttr.FIDELITY] in (20, 40)  # ended at ASHA's rung or at the recipe's steps
        assert not {TrialAttr.RUNG_LOSSES, TrialAttr.TRAINED_STEPS, TrialAttr.TOP_RUNG,
                    TrialAttr.LADDER_CHECKPOINT} & set(t.user_attrs)
    assert any(t.user_attrs[TrialAttr.FIDELITY] == 20 for t in told)  # ASHA stopped some
    assert not list((tmp_path / "runs").rglob("checkpoint_*"))  # ASHA's trials never checkpoint


def test_orphan_recovery_leaves_a_paused_trial_of_a_live_driver_alone(tmp_path):
    """A paused trial stays RUNNING for hours; its driver's heartbeat must keep beating for it, or another
    driver's recovery (or a resume) would fail and re-enqueue it while it waits for a promotion."""
    import time

    from optuna.storages import RDBStorage

    from npas.service.study import faults

    space = npas.load_space(TINY)
    storage = RDBStorage(f"sqlite:///{tmp_path}/h.db", heartbeat_interval=1, grace_period=2)
    study = optuna.create_study(storage=storage, directions=["minimize"] * len(space.objectives),
                                sampler=make_sampler("random", 0, len(space.objectives)))
    searcher = NpasSearcher(study, space, WSD, "fp", 4)
    searcher.ladder_objectives = list(space.objectives)
    number = searcher.suggest("t0")["number"]
    searcher.on_trial_result("t0", _rung_report(3.1, 10, 10))  # paused at rung 10 from here on
    tid = next(t for t in study.trials if t.number == number)._trial_id
    storage.set_trial_user_attr(tid, TrialAttr.DRIVER, {"host": "another-host", "pid": 4242})  # seen from elsewhere
    with faults.Heartbeat(study, searcher.live_trial_ids, interval_s=0.3, recover_every_s=3600):
        time.sleep(3.5)  # past the grace period
        assert faults.recover_once(study) == []
    assert storage.get_trial(tid).state == TrialState.RUNNING
    time.sleep(3.5)  # the control: once nobody beats for it, it is an orphan
    assert faults.recover_once(study) == [number]
