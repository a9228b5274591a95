"""The searcher's bookkeeping, driven through Ray Tune's Searcher protocol with a cheap objective.

Tune itself is exercised in test_search.py; here the protocol calls (suggest, on_trial_result,
on_trial_complete) are made directly so that many trials cost milliseconds, not minutes.
"""

from __future__ import annotations

import json

import optuna
from ray.tune.search import Searcher

import npas
from npas.service import study as S
from npas.service.samplers import enqueue_baselines, make_sampler
from npas.service.searcher import NpasSearcher
from npas.training.recipe import load_recipe

from .conftest import ROOT


def drive(sampler: str, target: int, tmp_path) -> tuple[optuna.Study, NpasSearcher]:
    space = npas.load_space(ROOT / "tests" / "data" / "tiny.yaml")
    recipe = load_recipe(ROOT / "tests" / "data" / "fast.yaml").to_dict()
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/s.db", directions=["minimize", "minimize"],
                                sampler=make_sampler(sampler, 0, 2))
    enqueue_baselines(study, space, S.T_BASELINE)
    searcher = NpasSearcher(study, space, recipe, "fp", target)
    try:
        for i in range(10 * target):
            config = searcher.suggest(f"t{i}")
            if config is Searcher.FINISHED:
                break
            acc = searcher.accounting[str(config["number"])]
            loss = 3.0 - acc["materialised_params"] / 1e5  # a cheap stand-in for training
            searcher.on_trial_result(f"t{i}", {"val_loss": loss + 0.1, "step": 20, "final": False})
            proxy = {"status": "ok", "val_loss": loss, "steps_done": recipe["steps"], "curve": [[20, loss + 0.1]]}
            searcher.on_trial_complete(f"t{i}", {"val_loss": loss, "step": recipe["steps"], "final": True,
                                                 "proxy": json.dumps(proxy)})
    finally:
        searcher.close()
    return study, searcher


def test_tpe_does_not_get_stuck_on_skipped_candidates(tmp_path):
    # tiny.yaml has few distinct allocations: past TPE's startup trials it keeps proposing finished ones
    study, searcher = drive("tpe", 16, tmp_path)
    assert searcher.error is None
    counted = [t for t in study.trials if S.counts_toward_target(t)]
    assert len(counted) == 16
    keys = [t.user_attrs[S.T_KEY] for t in counted]
    assert len(set(keys)) == 16, "a candidate ran twice"
    assert all(t.user_attrs[S.T_CURVE] == [[20, t.values[0] + 0.1]] for t in counted)


def test_exhausted_space_stops_with_a_clear_reason(tmp_path):
    study, searcher = drive("random", 10_000, tmp_path)
    assert searcher.error is not None and "raise the budget or widen the space" in searcher.error
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
