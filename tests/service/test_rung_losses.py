"""A WSD study stores every rung's finished loss on its trials (`rung_losses`): from the worker's final
record, from ASHA's reports when a trial is stopped at a rung, and meaned over `--repeats` seeds.
Cheap tests drive the searcher through Tune's protocol; one slow test runs a real search."""

from __future__ import annotations

import json
import statistics

import optuna
import pytest
from ray.tune.search import Searcher

import npas
from npas.allocation.config import ArchConfig
from npas.service.execution.outcome import combine_repeats
from npas.service.search.driver import search
from npas.service.search.launch import Launch
from npas.service.search.samplers import make_sampler
from npas.service.search.searcher import NpasSearcher
from npas.service.study.record import TrialAttr
from npas.service.study.studies import read_record
from npas.training.data import load_corpus
from npas.training.forks import run_proxy
from npas.training.recipe import Recipe, load_recipe
from tests.conftest import ROOT

TINY = ROOT / "tests" / "data" / "tiny.yaml"
WSD_FAST = {**load_recipe(ROOT / "tests" / "data" / "fast.yaml").to_dict(), "name": "fast-wsd", "schedule": "wsd",
            "horizon": 40, "rungs": [10, 40]}


def searcher_with(recipe: dict, tmp_path) -> tuple[optuna.Study, NpasSearcher]:
    space = npas.load_space(TINY)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/s.db", directions=["minimize"] * len(space.objectives),
                                sampler=make_sampler("random", 0, len(space.objectives)))
    return study, NpasSearcher(study, space, recipe, "fp", 4)


def told(study: optuna.Study, number: int) -> optuna.trial.FrozenTrial:
    return next(t for t in study.trials if t.number == number)


def test_a_finished_wsd_trial_stores_each_rungs_loss_as_its_own_attribute(tmp_path):
    study, searcher = searcher_with(WSD_FAST, tmp_path)
    config = searcher.suggest("t0")
    assert config is not Searcher.FINISHED
    searcher.on_trial_result("t0", {"val_loss": 3.1, "step": 10, "final": False})
    proxy = {"status": "ok", "val_loss": 2.9, "steps_done": 40, "curve": [[10, 3.1], [40, 2.9]],
             "rung_losses": {"10": 3.1, "40": 2.9}, "steps_trained": 42}
    searcher.on_trial_complete("t0", {"val_loss": 2.9, "step": 40, "final": True, "proxy": json.dumps(proxy)})
    t = told(study, config["number"])
    assert t.state == optuna.trial.TrialState.COMPLETE and t.values[0] == 2.9
    assert t.user_attrs[TrialAttr.RUNG_LOSSES] == {"10": 3.1, "40": 2.9}
    assert "rung_losses" not in t.user_attrs[TrialAttr.PROXY]  # stored once, under its own key
    assert t.user_attrs[TrialAttr.PROXY]["steps_trained"] == 42


def test_a_wsd_trial_stopped_at_a_rung_keeps_the_rungs_it_passed(tmp_path):
    study, searcher = searcher_with(WSD_FAST, tmp_path)
    config = searcher.suggest("t0")
    searcher.on_trial_result("t0", {"val_loss": 3.1, "step": 10, "final": False})
    searcher.on_trial_complete("t0", {"val_loss": 3.1, "step": 10, "final": False})  # ASHA ended it at rung 10
    t = told(study, config["number"])
    assert t.user_attrs[TrialAttr.RUNG_LOSSES] == {"10": 3.1}
    assert t.user_attrs[TrialAttr.FIDELITY] == 10


def test_a_cosine_trial_has_no_rung_losses(tmp_path):
    study, searcher = searcher_with(load_recipe(ROOT / "tests" / "data" / "fast.yaml").to_dict(), tmp_path)
    config = searcher.suggest("t0")
    searcher.on_trial_result("t0", {"val_loss": 3.1, "step": 20, "final": False})
    proxy = {"status": "ok", "val_loss": 2.9, "steps_done": 40, "curve": [[20, 3.1], [40, 2.9]]}
    searcher.on_trial_complete("t0", {"val_loss": 2.9, "step": 40, "final": True, "proxy": json.dumps(proxy)})
    assert TrialAttr.RUNG_LOSSES not in told(study, config["number"]).user_attrs


def test_repeats_mean_each_rung_and_sum_the_steps_trained():
    def run(losses: dict, trained: int) -> dict:
        last = losses[max(losses)]
        return {"status": "ok", "val_loss": last, "steps_done": 40, "curve": [[int(k), v] for k, v in losses.items()],
                "rung_losses": {str(k): v for k, v in losses.items()}, "steps_trained": trained}

    out = combine_repeats([run({10: 3.0, 40: 2.8}, 42), run({10: 3.2, 40: 3.0}, 42)], (0, 2))
    assert out["rung_losses"] == {10: pytest.approx(3.1), 40: pytest.approx(2.9)}
    assert out["steps_trained"] == 84 and out["val_loss"] == pytest.approx(2.9)


@pytest.mark.slow
def test_a_real_wsd_search_stores_rung_losses_equal_to_separate_runs(ray_local, tmp_path):  # noqa: F811
    """Real Ray workers, real SQLite, the two baselines to full fidelity with 2 seeds: every trial has a
    finished loss at both rungs (the mean of its seeds), and the rung-10 loss of seed 0 is that of a
    WSD run of 10 steps trained here on its own."""
    path = tmp_path / "fast-wsd.yaml"
    path.write_text(json.dumps(WSD_FAST))  # JSON is YAML
    st = search(npas.load_space(TINY), trials=2, study="wsd", storage=f"sqlite:///{tmp_path}/w.db",
                recipe=str(path), repeats=2, launch=Launch(workers=2, early_stop=False))
    done = [t for t in st.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 2
    rec = Recipe.from_dict(dict(read_record(st).recipe))
    assert rec.schedule == "wsd" and rec.fork_rungs() == (10, 40)
    corpus = load_corpus(rec.data, val_fraction=rec.val_fraction, test_fraction=rec.test_fraction)
    reference = npas.load_space(TINY).bind(vocab_size=corpus.vocab_size).reference_chassis
    for t in done:
        rungs = t.user_attrs[TrialAttr.RUNG_LOSSES]
        assert list(rungs) == ["10", "40"] and rungs["40"] == pytest.approx(t.values[0], rel=1e-12)
        assert t.user_attrs[TrialAttr.PROXY]["steps_trained"] == 2 * (40 + 10 - rec.decay_start(10))
    t = done[0]
    cfg = ArchConfig.from_dict(t.user_attrs[TrialAttr.ALLOC])
    seeds = t.user_attrs[TrialAttr.SEEDS]
    alone = [run_proxy(cfg, Recipe.from_dict({**rec.with_steps(10).to_dict(), "seed": s}), corpus,
                       reference=reference).val_loss for s in seeds]
    assert t.user_attrs[TrialAttr.RUNG_LOSSES]["10"] == pytest.approx(statistics.fmean(alone), rel=1e-5)
