"""experiments/harness/version.py: a cache's code version is the declared numerics version and the experiment's
settings, never the bytes of the code; numerics version 1 keeps every cache found before it; every cached
record says what made it."""

from __future__ import annotations

import importlib
import re
import sys

import pytest

from experiments.device import load_module
from experiments.harness import store, version
from npas.allocation.config import Chassis, reference_config
from npas.conversion.numerics import NUMERICS_VERSION
from npas.training.recipe import Recipe
from tests.conftest import ROOT

HEX10 = re.compile(r"^[0-9a-f]{10}$")


@pytest.fixture(scope="module")
def benches():
    sys.path.insert(0, str(ROOT / "experiments" / "evidence"))
    try:
        yield {"pf": load_module("experiments/proxy_fidelity.py"), "lt": load_module("experiments/lr_transfer.py"),
               "rl": load_module("experiments/recipe_lr.py"), "hf": load_module("experiments/convert_hf.py"),
               "runs": importlib.import_module("runs")}
    finally:
        sys.path.remove(str(ROOT / "experiments" / "evidence"))


def _reached(b) -> dict[tuple[str, str], str]:
    """(experiment, settings digest) -> version, as each bench computes it for the settings its cache was made with."""
    pf, lt, rl, hf = b["pf"], b["lt"], b["rl"], b["hf"]
    setup = pf.make_setup(False, None, None, None, 1)
    wsd = version.recipe_settings(setup.wsd, leave_out=("seed", "parameterization"))
    full = hf.hf_modes()["full"]
    cfg = hf.cycle_lora(full.chassis)
    out = {("proxy_fidelity", version.settings_digest(pf.version_settings(setup))): pf.code_version(setup),
           ("proxy_fidelity/wsd", version.settings_digest(wsd)): pf.wsd_version(setup),
           ("lr_transfer", version.settings_digest(lt.version_settings(lt.full_setup()))): lt.code_version(lt.full_setup())}
    for name in ("smoke", "smoke-wsd"):
        r = rl.shipped(name)
        d = version.recipe_settings(r, leave_out=("seed", "parameterization", "threads", "lr", "min_lr", "rungs"))
        out["recipe_lr", version.settings_digest({**d, "floor_ratio": round(r.min_lr / r.lr, 9)})] = rl.shipped_version(r)
    settings = {"chassis": full.chassis.to_dict(), "dense": version.recipe_settings(full.dense),
                "uptrain": version.recipe_settings(full.uptrain), "allocation": cfg.hash, "grid": list(hf.GRID),
                "max_extend": hf.MAX_EXTEND}
    out["convert_hf", version.settings_digest(settings)] = hf.code_version(full, cfg)
    for name in ("taper", "high_budget", "low_budget", "relaxed", "atoms", "conversion"):
        out[f"evidence/{name}", version.settings_digest(None)] = b["runs"].code_version(name)
    return out


def test_every_cache_found_before_is_found_under_numerics_version_1(benches):
    """Each experiment's settings still reach the version its committed cache is keyed by (what its code
    computed at 2072c52 from file hashes and the 2-step probe), and every pin is reached by one."""
    reached = _reached(benches)
    pinned = {(e, d): v for e, by in version.PINNED[1].items() for d, v in by.items()}
    assert NUMERICS_VERSION == 1 and reached == pinned
    assert reached["proxy_fidelity", version.settings_digest(benches["pf"].version_settings(
        benches["pf"].make_setup(False, None, None, None, 1)))] == "5e8cca1e3a"
    assert set(pinned.values()) == {"5e8cca1e3a", "365e7629d2", "2dfa8bcf28", "fd383b6bfd", "fb138ddc96",
                                    "50d4cdc11e", "c8bd6d7bad"}
    # expert_pool's probe had moved since its runs: they stay unread, under a version of its own
    assert benches["runs"].code_version("expert_pool") not in pinned.values()


def test_proxy_fidelity_keeps_its_cached_runs(benches):
    pf = benches["pf"]
    setup = pf.make_setup(False, None, None, None, 1)
    v = pf.code_version(setup)
    _, cands = pf.load_candidates(setup)
    jobs = pf.jobs_of(setup, cands)
    cached = [j for j in jobs if store.exists(setup.out / f"{j.key(setup, v)}.json")]
    assert len(cached) >= 156 and {j.kind for j in cached} == {"proxy", "long", "mid", "wsd"}
    assert store.load(setup.out / f"{cached[0].key(setup, v)}.json")["code_version"] == v


def test_a_version_is_the_numerics_and_the_settings_not_the_files(tmp_path, monkeypatch):
    settings = {"recipe": version.recipe_settings(Recipe(name="x", steps=10, warmup_steps=2))}
    v = version.code_version("exp", settings)
    assert HEX10.match(v) and store.version_of(f"run-{v}.json") == v  # a run key's last field, as the store reads it
    monkeypatch.setattr(version, "ROOT", tmp_path)  # no source file anywhere: the version does not read one
    assert version.code_version("exp", settings) == v
    assert version.code_version("exp", settings, numerics=NUMERICS_VERSION + 1) != v
    assert version.code_version("exp", {**settings, "grid": [1]}) != v
    assert version.code_version("other", settings) != v
    assert version.code_version("a", settings, cache="pool") == version.code_version("b", settings, cache="pool")


def test_a_numerics_bump_rekeys_every_cache(benches, monkeypatch):
    """What a bump of NUMERICS_VERSION (a change the golden runs see) does: every experiment's runs get a
    fresh version, so no run of the old numerics is read as the new."""
    before = _reached(benches)
    monkeypatch.setattr(version, "NUMERICS_VERSION", NUMERICS_VERSION + 1)
    after = _reached(benches)
    assert after.keys() == before.keys()
    assert all(HEX10.match(v) and v != before[k] and v not in version.PINNED[1].get(k[0], {}).values()
               for k, v in after.items())
    evidence = {v for (e, _), v in after.items() if e.startswith("evidence/")}
    assert len(evidence) == 1  # the pool's experiments share one version again: a run two of them train trains once


def test_recipe_settings_do_not_follow_to_dict():
    """Keys hold whatever ``Recipe.to_dict`` writes: the settings are today's fields as they are and later
    fields only away from their defaults."""
    r = Recipe(name="x", steps=40, warmup_steps=4)
    assert set(version.recipe_settings(r)) == set(version.RECIPE_FIELDS)  # "schedule" etc. at their defaults: out
    assert version.recipe_settings(r)["betas"] == [0.9, 0.95] and version.recipe_settings(r)["steps"] == 40
    wsd = Recipe(name="x", steps=40, warmup_steps=4, schedule="wsd", rungs=(20, 40))
    assert version.recipe_settings(wsd)["rungs"] == [20, 40]
    assert "seed" not in version.recipe_settings(r, leave_out=("seed",))


@pytest.mark.slow  # trains a run
def test_a_cached_record_says_what_made_it():
    from experiments.harness.jobs import run_spec

    ch = Chassis(vocab_size=68, context=16, d_model=16, n_layers=2, n_heads=2, d_ff=32)
    cfg = reference_config(ch)
    recipe = Recipe(name="stamp", seq_len=16, batch_size=2, steps=2, warmup_steps=1, eval_every=2, eval_batches=1)
    rec = run_spec({"config": cfg.to_json(), "recipe": recipe.to_dict(), "reference": ch.__dict__, "meta": {"k": 1}})
    assert rec["status"] == "ok" and rec["k"] == 1
    assert rec["numerics_version"] == NUMERICS_VERSION
    assert rec["commit"] == "unknown" or re.match(r"^[0-9a-f]{40}$", rec["commit"])
    assert rec["recipe"]["schedule"] == "cosine" and rec["recipe"]["rungs"] is None  # every field, defaults too
    assert Recipe.from_dict(rec["recipe"]) == recipe and rec["allocation"] == cfg.to_dict()
    # a lent GPU machine's copy of the tree has no history: its spec carries the commit it was exported at
    spec = {"config": cfg.to_json(), "recipe": recipe.to_dict(), "reference": ch.__dict__, "meta": {}, "commit": "c0ffee"}
    assert run_spec(spec)["commit"] == "c0ffee"


def test_the_commit_is_unknown_outside_git(tmp_path, monkeypatch):
    monkeypatch.setattr(version, "ROOT", tmp_path)
    version.commit.cache_clear()
    try:
        assert version.commit() == "unknown"
    finally:
        version.commit.cache_clear()
