"""experiments/harness/jobs.py: what an experiment declares (``Runs``) is what the harness plans, reads,
exports and trains; a cached run never trains again and a closed time box starts nothing."""

from __future__ import annotations

import json

import npas
from experiments.harness import jobs, store
from npas import Chassis, Recipe
from tests.conftest import ROOT

REF = Chassis(vocab_size=68, context=16, d_model=16, n_layers=2, n_heads=2, d_ff=64)
RECIPE = Recipe(name="jobs-test", seq_len=16, batch_size=4, steps=4, warmup_steps=1, eval_every=4, eval_batches=1,
                threads=1)


def _runs(out, version: str = "0123456789") -> jobs.Runs:
    cfg = npas.reference_config(REF)
    return jobs.Runs([1, 2, 3], lambda j: out / f"seed{j}-{version}.json",
                     lambda j: (cfg, Recipe.from_dict({**RECIPE.to_dict(), "seed": j}), REF),
                     lambda j: {"seed": j, "code_version": version})


def test_cost_counts_the_cache_and_prices_only_the_missing_runs(tmp_path):
    runs = _runs(tmp_path)
    store.save(runs.path(2), {"val_loss": 1.5})
    cost = runs.cost(runs.jobs, lambda j: 1000 * j, lambda j: 10, 1e4)
    assert (cost.runs, cost.cached, cost.tokens) == (3, 1, 6000)
    assert cost.secs == 3 * 10 * 6000 / 1e4 and cost.left == 3 * 10 * 4000 / 1e4
    assert runs.cached() == [(2, {"val_loss": 1.5})]


def test_run_missing_skips_cached_runs_and_a_closed_time_box_starts_nothing(tmp_path, capsys):
    runs = _runs(tmp_path)
    for j in runs.jobs:
        store.save(runs.path(j), {"val_loss": float(j)})
    assert jobs.run_missing(runs, 1, " here") == (0, 3, 0)
    assert "runs: 0 to train, 3 cached here" in capsys.readouterr().out
    fresh = _runs(tmp_path, "abcdef0123")
    assert jobs.run_missing(fresh, 1, "", fits=lambda j, elapsed: False) == (0, 0, 3)
    assert not [n for n in store.names(tmp_path) if n.endswith("abcdef0123.json")]


def test_args_and_device_specs_carry_what_the_job_trains_and_its_label():
    runs = _runs(ROOT / "experiments" / "results" / "jobs-test")  # a spec's dest is relative to the checkout; nothing is written
    cfg_json, recipe_json, ref_json = runs.args(2)
    assert json.loads(recipe_json)["seed"] == 2 and Chassis(**json.loads(ref_json)) == REF
    assert cfg_json == npas.reference_config(REF).to_json()
    specs = runs.device_specs(test=False)
    assert [s["meta"] for s in specs] == [{"seed": j, "code_version": "0123456789"} for j in runs.jobs]
    assert [s["priority"] for s in specs] == [0, 1, 2] and not any(s["test"] for s in specs)
