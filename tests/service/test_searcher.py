"""The searcher's bookkeeping, driven through Ray Tune's Searcher protocol with a cheap objective.

Tune itself is exercised in test_search.py; here the protocol calls (suggest, on_trial_result,
on_trial_complete) are made directly so that many trials cost milliseconds, not minutes.
"""

from __future__ import annotations

import json
import math
import warnings

import optuna
from ray.tune.search import Searcher

import npas
from npas.allocation.space import Space
from npas.service.search.samplers import enqueue_baselines, make_sampler
from npas.service.search.searcher import NpasSearcher
from npas.service.study.faults import recover_orphans
from npas.service.study.record import Constraint, StudyAttr, TrialAttr
from npas.service.study.studies import counts_toward_target, status
from npas.training.recipe import load_recipe
from tests.conftest import ROOT


def drive(sampler: str, target: int, tmp_path, budget: str | None = None,
          space_text: str | None = None) -> tuple[optuna.Study, NpasSearcher]:
    """A search of `target` counted trials on tests/data/tiny.yaml (at `budget` when given) through the
    Searcher protocol, with a cheap stand-in for training: one intermediate result, then the final one.
    The study is labelled as the driver labels it (objectives, recipe), so fronts, picks and the
    dashboard read it. Used by test_scale.py too."""
    space_file = ROOT / "tests" / "data" / "tiny.yaml"
    if budget is not None or space_text is not None:
        text = space_text or space_file.read_text()
        space_file = tmp_path / "space.yaml"
        space_file.write_text(text.replace("budget: 0.5x", f"budget: {budget or '0.5x'}"))
    space = npas.load_space(space_file)
    recipe = load_recipe(ROOT / "tests" / "data" / "fast.yaml").to_dict()
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/s.db", directions=["minimize", "minimize"],
                                sampler=make_sampler(sampler, 0, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(list(space.objectives))
    study.set_user_attr(StudyAttr.OBJECTIVES, list(space.objectives))
    study.set_user_attr(StudyAttr.RECIPE, recipe)
    enqueue_baselines(study, space, TrialAttr.BASELINE)
    searcher = NpasSearcher(study, space, recipe, "fp", target)
    for i in range(20 * target):
        config = searcher.suggest(f"t{i}")
        if config is Searcher.FINISHED:
            break
        acc = searcher.accounting_of(config["number"])
        loss = 3.0 - acc["materialised_params"] / 1e5  # a cheap stand-in for training
        searcher.on_trial_result(f"t{i}", {"val_loss": loss + 0.1, "step": 20, "final": False})
        proxy = {"status": "ok", "val_loss": loss, "steps_done": recipe["steps"], "curve": [[20, loss + 0.1]]}
        searcher.on_trial_complete(f"t{i}", {"val_loss": loss, "step": recipe["steps"], "final": True,
                                             "proxy": json.dumps(proxy)})
    return study, searcher


def test_tpe_does_not_get_stuck_on_skipped_candidates(tmp_path):
    # tiny.yaml has few distinct allocations: past TPE's startup trials it keeps proposing finished ones
    study, searcher = drive("tpe", 16, tmp_path)
    assert searcher.error is None
    counted = [t for t in study.trials if counts_toward_target(t)]
    assert len(counted) == 16
    keys = [t.user_attrs[TrialAttr.KEY] for t in counted]
    assert len(set(keys)) == 16, "a candidate ran twice"
    assert all(t.user_attrs[TrialAttr.CURVE] == [[20, t.values[0] + 0.1]] for t in counted)


def test_exhausted_space_stops_with_a_clear_reason(tmp_path, monkeypatch):
    # a space of 4 allocations (tying x taper), and 40 skips in a row instead of the default 200:
    # the same code path at a small fraction of the database round trips
    monkeypatch.setattr("npas.service.search.searcher.MAX_SKIPPED_IN_A_ROW", 40)
    small = TINY_TEXT.split("knobs:")[0] + "knobs:\n  taper: {schedule: [uniform, cosine], ratio: 3.0}\n" \
        "  tying: {mode: [none, all]}\n"
    study, searcher = drive("random", 10_000, tmp_path, space_text=small)
    assert searcher.error is not None and "raise the budget or widen the space" in searcher.error
    assert searcher.error.startswith("40 candidates in a row")
    keys = [t.user_attrs.get(TrialAttr.KEY) for t in study.trials if counts_toward_target(t)]
    assert len(keys) == len(set(keys)) <= 4 + len(searcher.space.baselines())  # each allocation ran once
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]


def searcher_for(tmp_path, space_text: str, target: int = 4) -> tuple[optuna.Study, NpasSearcher]:
    path = tmp_path / "space.yaml"
    path.write_text(space_text)
    space = npas.load_space(path)
    recipe = load_recipe(ROOT / "tests" / "data" / "fast.yaml").to_dict()
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/s.db", directions=["minimize"] * len(space.objectives),
                                sampler=make_sampler("random", 0, len(space.objectives)))
    return study, NpasSearcher(study, space, recipe, "fp", target)


TINY_TEXT = (ROOT / "tests" / "data" / "tiny.yaml").read_text()


def test_a_trial_stopped_early_gets_every_objective(tmp_path):
    """ASHA ends a trial at an intermediate report: no proxy metrics. A measured objective
    (peak_memory_bytes) falls back to the analytic estimate; the trial is told, not left RUNNING."""
    study, searcher = searcher_for(tmp_path, TINY_TEXT.replace("[val_loss, train_memory_bytes]",
                                                              "[val_loss, peak_memory_bytes, val_bpc, param_bytes]"))
    config = searcher.suggest("t0")
    acc = searcher.accounting_of(config["number"])
    searcher.on_trial_result("t0", {"val_loss": 3.0, "step": 20, "final": False})
    searcher.on_trial_complete("t0", {"val_loss": 3.0, "step": 20, "final": False})  # stopped by ASHA
    (t,) = [t for t in study.trials if t.number == config["number"]]
    assert t.state == optuna.trial.TrialState.COMPLETE
    assert t.values == [3.0, acc["train_memory_bytes"], 3.0 / math.log(2), acc["param_bytes"]]
    assert status(t) == "stopped" and t.user_attrs[TrialAttr.FIDELITY] == 20
    assert t.constraints[Constraint.FIDELITY] == 0.5  # half the recipe's 40 steps are missing: off the full-fidelity front


def test_a_sampling_error_fails_that_trial_with_its_reason(tmp_path, monkeypatch):
    """Whatever raises inside space.sample ends that trial as FAIL, once: it is not RUNNING, does not
    count toward the target, and is not re-enqueued by a later recovery."""
    study, searcher = searcher_for(tmp_path, TINY_TEXT)
    real = Space.sample
    calls = {"n": 0}

    def flaky(self, trial, fixed=None):
        calls["n"] += 1
        if calls["n"] == 1:
            raise IndexError("tying group 5 out of range for 4 layers")
        return real(self, trial, fixed)

    monkeypatch.setattr(Space, "sample", flaky)
    config = searcher.suggest("t0")
    assert config is not Searcher.FINISHED and config["number"] == 1  # the search went on to the next trial
    first = study.trials[0]
    assert first.state == optuna.trial.TrialState.FAIL
    assert "IndexError: tying group 5 out of range" in first.user_attrs[TrialAttr.REASON]
    assert not counts_toward_target(first)
    assert recover_orphans(study) == [] and not [t for t in study.trials if t.state.name == "WAITING"]


def test_a_context_shorter_than_the_recipe_never_reaches_a_worker(tmp_path):
    """seq_len 32 > a searched context of 16 raises in the worker on every attempt: refuse it at launch."""
    study, searcher = searcher_for(tmp_path, TINY_TEXT.replace("context: 64", "context: [64, 16]"), target=6)
    handed = []
    for i in range(60):
        config = searcher.suggest(f"t{i}")
        if config is Searcher.FINISHED:
            break
        handed.append(config["allocation"]["chassis"]["context"])
        searcher.on_trial_complete(f"t{i}", {"val_loss": 3.0, "step": 40, "final": True,
                                             "proxy": json.dumps({"status": "ok", "val_loss": 3.0, "steps_done": 40})})
    assert handed and min(handed) >= 32
    short = [t for t in study.trials if t.user_attrs.get(TrialAttr.REASON, "").startswith("the recipe trains at seq_len")]
    assert short and all(t.state == optuna.trial.TrialState.FAIL and status(t) == "infeasible" for t in short)
