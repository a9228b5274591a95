"""`npas search --locate-lr` (issue #35 item 1) under the promotion ladder: each trial promoted to the
rung at T/4 has its rate chosen there from a x2 grid around its fair rate, and the winning run climbs on."""

from __future__ import annotations

import math

import pytest
from optuna.trial import TrialState

import npas
from npas.errors import StudyError
from npas.service.execution import session as runner
from npas.service.search.driver import search
from npas.service.search.launch import Launch
from npas.service.search.plan import plan_search
from npas.service.study.record import TrialAttr
from npas.service.study.studies import read_record
from tests.service.test_ladder_search import FAST, TINY, wsd_recipe


def test_locate_lr_needs_the_ladder_and_says_so_in_one_line(tmp_path):
    space = npas.load_space(TINY)
    with pytest.raises(StudyError, match="--locate-lr .*schedule 'cosine'") as err:
        plan_search(space, study="c", recipe=str(FAST), locate_lr=True)
    assert "\n" not in str(err.value)
    with pytest.raises(StudyError, match="--no-early-stop"):
        plan_search(space, study="n", recipe=wsd_recipe(tmp_path), locate_lr=True, launch=Launch(early_stop=False))
    assert plan_search(space, study="w", recipe=wsd_recipe(tmp_path), locate_lr=True).locate_lr
    assert not plan_search(space, study="w", recipe=wsd_recipe(tmp_path)).locate_lr  # off by default


def test_the_cli_refuses_locate_lr_on_a_cosine_recipe_before_anything_is_written(tmp_path, capsys, monkeypatch):
    from npas.presentation.cli import main

    monkeypatch.chdir(tmp_path)
    code = main(["search", str(TINY), "--recipe", str(FAST), "--locate-lr", "--storage", f"sqlite:///{tmp_path}/x.db"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "--locate-lr" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x.db").exists()


@pytest.mark.slow
def test_a_located_search_records_each_trials_factor_and_the_grids_cost(ray_local, tmp_path):
    from npas.allocation.config import ArchConfig
    from npas.training import climb
    from npas.training.located_rate import DEFAULT_GRID, locate_rung, next_factor

    saved = runner.RUNS_DIR
    runner.RUNS_DIR = tmp_path / "runs"
    try:  # rungs 5, 10, 40: trials start at x1, and those promoted to 10 (= T/4) locate their rate there; at
        # a tenth of the fast recipe's rate the grid's larger factors win, so the located run is not the x1 one
        plan = plan_search(npas.load_space(TINY), trials=8, study="loc", storage=f"sqlite:///{tmp_path}/l.db",
                           recipe=wsd_recipe(tmp_path, rungs=[5, 10, 40], lr=1e-3, min_lr=1e-4), sampler="random",
                           seed=3, launch=Launch(workers=2), locate_lr=True)
        study = search(plan)
    finally:
        runner.RUNS_DIR = saved
    assert read_record(study).locate_lr is True  # a resume continues it located
    assert locate_rung(plan.recipe) == 10
    told = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert len(told) == 8
    located = [t for t in told if t.user_attrs[TrialAttr.FIDELITY] >= 10]
    assert 1 <= len(located) <= 8 // 4  # the ladder's cap on rung 5: only they paid for a grid
    assert any(t.user_attrs[TrialAttr.LR_FACTOR] != 1.0 for t in located)  # else x1 and located losses agree
    for t in told:
        if t not in located:  # stopped at rung 5 at its fair rate: no factor, read as x1 everywhere
            assert TrialAttr.LR_FACTOR not in t.user_attrs and "lr_grid" not in t.user_attrs[TrialAttr.PROXY]
            continue
        proxy = t.user_attrs[TrialAttr.PROXY]
        grid = {float(f): v for f, v in proxy["lr_grid"].items()}
        seen: dict[float, float] = {}  # the factors were tried in the rule's order, and it then stopped
        for f, v in grid.items():
            assert next_factor(seen) == f
            seen[f] = math.nan if v is None else v
        assert next_factor(seen) is None and DEFAULT_GRID[:2] == tuple(grid)[:2] and proxy["lr_rung"] == 10
        factor = t.user_attrs[TrialAttr.LR_FACTOR]
        assert grid[factor] == min(v for v in grid.values() if v is not None)  # the best rung-10 loss wins
        assert t.user_attrs[TrialAttr.RUNG_LOSSES]["10"] == grid[factor]
        cfg = ArchConfig.from_dict(t.user_attrs[TrialAttr.ALLOC])
        # every grid run climbs to rung 10 (through rung 5's fork); all but the winner's are the grid's cost
        per = climb.start(cfg, plan.recipe, plan.corpus, device="cpu", reference=plan.space.reference_chassis)
        per.climb(until=10)
        assert per.rung_losses[10] == grid[1.0]  # the grid's x1 run is the trial's own climb from rung 5
        assert t.user_attrs[TrialAttr.LR_GRID_STEPS] == per.trained_steps * (len(grid) - 1)
        c = climb.start(cfg, plan.recipe, plan.corpus, device="cpu", reference=plan.space.reference_chassis,
                        lr_factor=factor)
        c.climb(until=t.user_attrs[TrialAttr.FIDELITY])
        assert {str(k): v for k, v in c.rung_losses.items()} == t.user_attrs[TrialAttr.LOCATED_RUNG_LOSSES]  # bitwise
        # what the ladder ranked on, stored as such: rung 5 at x1 (the grid had not run), the located run from 10 up
        ranked = {str(k): (per.rung_losses[k] if k < 10 else v) for k, v in c.rung_losses.items()}
        assert t.user_attrs[TrialAttr.RUNG_LOSSES] == ranked and t.user_attrs[TrialAttr.CURVE] == [
            [int(k), v] for k, v in ranked.items()]
        assert c.trained_steps == t.user_attrs[TrialAttr.TRAINED_STEPS]
        edge = proxy["lr_at_edge"]  # an optimum still at the grid's edge is flagged
        assert edge == (factor in (min(grid), max(grid)))


@pytest.mark.slow
def test_with_repeats_the_other_seeds_restart_at_the_located_factor(ray_local, tmp_path):
    """--repeats 2: the first seed's climb locates the rate; the second seed, at x1 so far, restarts at
    the located factor (its x1 steps are the grid's cost), so every seed of the trial trains at it."""
    import statistics

    from npas.allocation.config import ArchConfig
    from npas.service.execution.outcome import repeat_seeds
    from npas.training import climb
    from npas.training.recipe import Recipe

    saved = runner.RUNS_DIR
    runner.RUNS_DIR = tmp_path / "runs"
    try:
        plan = plan_search(npas.load_space(TINY), trials=4, study="rep", storage=f"sqlite:///{tmp_path}/r.db",
                           recipe=wsd_recipe(tmp_path, rungs=[5, 10, 40]), sampler="random", seed=5,
                           launch=Launch(workers=2), locate_lr=True, repeats=2)
        study = search(plan)
    finally:
        runner.RUNS_DIR = saved
    located = [t for t in study.trials if t.state == TrialState.COMPLETE and TrialAttr.LR_FACTOR in t.user_attrs]
    assert located
    seeds = repeat_seeds(plan.recipe.seed, 2)
    for t in located:
        factor, cfg = t.user_attrs[TrialAttr.LR_FACTOR], ArchConfig.from_dict(t.user_attrs[TrialAttr.ALLOC])
        top = t.user_attrs[TrialAttr.FIDELITY]
        straight = []
        for s in seeds:
            r = plan.recipe if s == plan.recipe.seed else Recipe.from_dict({**plan.recipe.to_dict(), "seed": s})
            c = climb.start(cfg, r, plan.corpus, device="cpu", reference=plan.space.reference_chassis, lr_factor=factor)
            c.climb(until=top)
            straight.append(c)
        for rung, v in t.user_attrs[TrialAttr.LOCATED_RUNG_LOSSES].items():  # every seed at the factor, every rung
            assert v == pytest.approx(statistics.fmean(c.rung_losses[int(rung)] for c in straight), abs=1e-6), rung
        grid = t.user_attrs[TrialAttr.PROXY]["lr_grid"]
        fair = []  # rung 5 was ranked on both seeds' x1 climbs, before the grid ran
        for s in seeds:
            r = plan.recipe if s == plan.recipe.seed else Recipe.from_dict({**plan.recipe.to_dict(), "seed": s})
            c = climb.start(cfg, r, plan.corpus, device="cpu", reference=plan.space.reference_chassis)
            fair.append(c.climb(until=5)[5])
        assert t.user_attrs[TrialAttr.RUNG_LOSSES]["5"] == pytest.approx(statistics.fmean(fair), abs=1e-6)
        per = climb.start(cfg, plan.recipe, plan.corpus, device="cpu", reference=plan.space.reference_chassis)
        per.climb(until=5)
        to5 = per.trained_steps
        per.climb(until=10)
        restarted = to5 if factor != 1.0 else 0  # seed 2's x1 climb to rung 5, thrown away
        assert t.user_attrs[TrialAttr.LR_GRID_STEPS] == per.trained_steps * (len(grid) - 1) + restarted
        assert t.user_attrs[TrialAttr.TRAINED_STEPS] == sum(c.trained_steps for c in straight)


def test_a_located_trial_is_stored_with_the_losses_the_ladder_ranked_it_on_and_its_located_run_apart(tmp_path):
    """The ladder ranked the trial at rung 12 on its x1 loss (3.81); at rung 50 the located run (x16)
    replaced its climb, whose rung-12 loss is 3.13. Stored, resumed (`rebuild`) and read by another
    driver (`RungExchange.pull`), rung 12 ranks it on 3.81; the located run's own losses are kept apart."""
    import json

    import optuna

    from npas.service.execution.climber import ranked_record
    from npas.service.execution.outcome import combine_repeats
    from npas.service.search.ladder_run import rebuild
    from npas.service.search.rung_exchange import RungExchange
    from npas.service.search.samplers import make_sampler
    from npas.service.search.searcher import NpasSearcher
    from npas.service.study.ladder import Ladder
    from tests.service.test_ladder_search import WSD

    space = npas.load_space(TINY)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/s.db", directions=["minimize"] * 2,
                                sampler=make_sampler("random", 0, 2))
    searcher = NpasSearcher(study, space, {**WSD, "rungs": [12, 50], "steps": 50, "horizon": 50}, "fp", 4)
    searcher.ladder_objectives = list(space.objectives)
    meta: dict = {"located": {"lr_factor": 16.0, "lr_grid_steps": 100}}
    seed_run = {"status": "ok", "steps_done": 12, "val_loss": 3.81, "curve": [[12, 3.81]], "rung_losses": {12: 3.81},
                "steps_trained": 12}
    at_12 = ranked_record(combine_repeats([seed_run], [0]), {})  # before the grid: the x1 climb, reported
    meta["ladder_losses"] = {"12": at_12["val_loss"]}  # what the climber notes as it reports
    located = {**seed_run, "steps_done": 50, "val_loss": 2.90, "curve": [[12, 3.13], [50, 2.90]],
               "rung_losses": {12: 3.13, 50: 2.90}, "steps_trained": 60}
    proxy = ranked_record(combine_repeats([located], [0]), meta)
    assert proxy["rung_losses"] == {12: 3.81, 50: 2.90} and proxy["located_rung_losses"] == {12: 3.13, 50: 2.90}
    assert proxy["curve"] == [[12, 3.81], [50, 2.90]]
    number = searcher.suggest("t0")["number"]
    searcher.on_trial_result("t0", {"val_loss": 3.81, "rung": 12, "step": 12, "final": False, "proxy": json.dumps(at_12)})
    searcher.on_trial_complete("t0", {"val_loss": 2.90, "rung": 50, "step": 50, "final": True, "proxy": json.dumps(proxy)})
    t = study.trials[number]
    assert t.user_attrs[TrialAttr.RUNG_LOSSES] == {"12": 3.81, "50": 2.90}
    assert t.user_attrs[TrialAttr.LOCATED_RUNG_LOSSES] == {"12": 3.13, "50": 2.90}
    assert t.user_attrs[TrialAttr.CURVE] == [[12, 3.81], [50, 2.90]]
    other = study.ask()  # an x1 trial of a study written before located losses were kept apart: it still reads
    other.set_user_attr(TrialAttr.RUNG_LOSSES, {"12": 3.50})
    study.tell(other, [3.50, 1.0])
    joined = Ladder((12, 50))  # another driver's ladder, reading this study live
    assert RungExchange(study, lambda _: None, set, [1]).pull(joined)
    for ladder in (rebuild(study, (12, 50), list(space.objectives)), joined):  # a resume, a joined driver
        at = {r.trial: r.loss for r in ladder.results[12]}
        assert at == {f"study:{number}": 3.81, f"study:{other.number}": 3.50}


def test_a_study_without_locate_lr_reads_back_at_the_fair_rate():
    from npas.service.study.record import StudyRecord
    from tests.service.test_record import OLD_ATTRS, RECORD

    assert StudyRecord.from_attrs(OLD_ATTRS).locate_lr is False  # an old study resumes as it ran
    assert StudyRecord.from_attrs(RECORD.to_attrs()).locate_lr is False
    on = StudyRecord.from_attrs({**RECORD.to_attrs(), "locate_lr": True})
    assert on.locate_lr is True and on.to_attrs()["locate_lr"] is True
