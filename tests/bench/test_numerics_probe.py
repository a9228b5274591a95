"""bench/numerics.py: the numerics probe keeps a cache's code version while the numbers are unchanged."""

from __future__ import annotations

import pytest

from bench import numerics
from bench.harness import store
from npas.allocation.config import Chassis, reference_config
from npas.training import proxy
from npas.training.recipe import Recipe

CHASSIS = Chassis(vocab_size=68, context=16, d_model=16, n_layers=2, n_heads=2, d_ff=32)
RECIPE = Recipe(name="probe-test", seq_len=16, batch_size=2, steps=50, warmup_steps=5, eval_every=50,
                eval_batches=2, threads=1)


def runs(recipe: Recipe = RECIPE) -> list[tuple]:
    return [(reference_config(CHASSIS), recipe, CHASSIS)]


@pytest.fixture(autouse=True)
def tables(tmp_path, monkeypatch):
    monkeypatch.setattr(numerics, "TABLES", tmp_path)
    monkeypatch.setattr(numerics, "ROOT", tmp_path.parent)
    monkeypatch.delenv("NPAS_RECORD_PROBE", raising=False)
    numerics._MEMO.clear()
    return tmp_path


def test_probe_is_deterministic():
    assert numerics.probe(runs()) == numerics.probe(runs())


def test_probe_sees_a_changed_lr_multiplier(monkeypatch):
    before = numerics.probe(runs())
    real = proxy.optimizer_groups

    def scaled(*a, **k):  # one parameterization rule's multiplier changed (x1.5 on the first group)
        groups = real(*a, **k)
        groups[0]["lr_mult"] *= 1.5
        return groups

    monkeypatch.setattr(proxy, "optimizer_groups", scaled)
    assert numerics.probe(runs()) != before


def test_probe_sees_a_changed_init_seed(monkeypatch):
    before = numerics.probe(runs())
    monkeypatch.setattr(numerics, "PROBE_SEED", 1)
    assert numerics.probe(runs()) != before


def test_probe_sees_a_schedule_edit_acting_only_at_the_last_step(monkeypatch):
    before = numerics.probe(runs())
    real = Recipe.lr_at
    monkeypatch.setattr(Recipe, "lr_at", lambda self, s: real(self, s) * (0.5 if s == self.steps - 1 else 1.0))
    assert numerics.probe(runs()) != before


def test_probe_ignores_the_seed_and_name_but_not_the_batch():
    base = numerics.probe(runs())
    relabelled = Recipe.from_dict({**RECIPE.to_dict(), "seed": 7, "name": "other"})
    assert numerics.probe(runs(relabelled)) == base
    wider = Recipe.from_dict({**RECIPE.to_dict(), "batch_size": 3})
    assert numerics.probe(runs(wider)) != base


def test_unchanged_numerics_keep_the_recorded_version(tables):
    """An edit of a versioned file that changes no number: a new file hash, the same probe -> the old key."""
    numerics.record("exp", numerics.probe(runs()), "aaaaaaaaaa")
    assert numerics.keyed("exp", "bbbbbbbbbb", runs()) == "aaaaaaaaaa"
    assert numerics.keyed("exp", "cccccccccc", lambda: runs()) == "aaaaaaaaaa"


def test_unknown_probe_falls_back_to_the_file_hash(tables, capsys):
    numerics.record("exp", "0123456789abcdef", "aaaaaaaaaa")
    assert numerics.keyed("exp", "bbbbbbbbbb", runs()) == "bbbbbbbbbb"
    assert "numerics changed" in capsys.readouterr().out
    assert numerics.keyed("exp", "bbbbbbbbbb", []) == "bbbbbbbbbb"  # nothing to probe: the file hash


def test_record_env_adds_the_pair_and_never_overwrites(tables, monkeypatch):
    monkeypatch.setenv("NPAS_RECORD_PROBE", "1")
    assert numerics.keyed("exp", "aaaaaaaaaa", runs()) == "aaaaaaaaaa"
    numerics._MEMO.clear()
    monkeypatch.setenv("NPAS_RECORD_PROBE", "dddddddddd")  # the same probe claimed for another version
    assert numerics.keyed("exp", "bbbbbbbbbb", runs()) == "aaaaaaaaaa"
    assert numerics.read_table("exp") == {numerics.probe(runs()): "aaaaaaaaaa"}


def _nudged(values, rel):
    """Probe values as another machine's kernels would round them: every number moved by `rel`."""
    if isinstance(values, dict):
        return {k: _nudged(v, rel) for k, v in values.items()}
    if isinstance(values, list):
        return [_nudged(v, rel) for v in values]
    return values * (1 + rel) if isinstance(values, float) else values


def test_another_machines_rounding_keeps_the_version(tables, monkeypatch):
    """The exact probe belongs to one machine (other CPUs' kernels round differently: the 2026-12-02
    move from an Intel to an AMD host re-keyed every cache). Its values, within RTOL, do not."""
    ph, values = numerics.measure(runs())
    numerics.record("exp", ph, "aaaaaaaaaa", values)
    elsewhere = (ph[::-1], _nudged(values, 1e-7))
    monkeypatch.setattr(numerics, "measure", lambda r: elsewhere)
    assert numerics.keyed("exp", "bbbbbbbbbb", runs()) == "aaaaaaaaaa"


# ---- values across CPU kinds: a few Adam sign-flip outliers are rounding, many or a large one are not
def _numbers(values) -> int:
    out: list[float] = []
    numerics._relative(values, values, out)
    return len(out)


def _rounded_elsewhere(values, outliers: int, rel: float):
    """Values as the 2026-12-02 Intel host rounded the AMD host's: every number moved by 1e-7, and the
    first `outliers` numbers by `rel` (measured: 4 of 4,732 by 1.0e-5..4.1e-5)."""
    count = [0]

    def nudge(v):
        if isinstance(v, dict):
            return {k: nudge(x) for k, x in v.items()}
        if isinstance(v, list):
            return [nudge(x) for x in v]
        if isinstance(v, float):
            count[0] += 1
            return v * (1 + (rel if count[0] <= outliers else 1e-7))
        return v

    return nudge(values)


def test_a_few_sign_flip_outliers_keep_the_version(monkeypatch):
    ph, values = numerics.measure(runs())
    numerics.record("exp", ph, "aaaaaaaaaa", values)
    n = _numbers(values)
    few = max(1, int(numerics.OUTLIER_FRACTION * n))
    elsewhere = (ph[::-1], _rounded_elsewhere(values, few, 4.1e-5))
    monkeypatch.setattr(numerics, "measure", lambda r: elsewhere)
    assert numerics.keyed("exp", "bbbbbbbbbb", runs()) == "aaaaaaaaaa"


def test_many_outliers_or_one_large_one_are_another_version():
    _, values = numerics.measure(runs())
    n = _numbers(values)
    assert not numerics.close(_rounded_elsewhere(values, int(0.05 * n) + 1, 4.1e-5), values)
    assert not numerics.close(_rounded_elsewhere(values, 1, 5 * numerics.RTOL_MAX), values)


@pytest.mark.parametrize("factor", [1.5, 1.001])  # x1.001: 41% of proxy_fidelity's values beyond RTOL
def test_probe_values_see_a_changed_lr_multiplier(monkeypatch, factor):
    _, before = numerics.measure(runs())
    real = proxy.optimizer_groups

    def scaled(*a, **k):
        groups = real(*a, **k)
        groups[0]["lr_mult"] *= factor
        return groups

    monkeypatch.setattr(proxy, "optimizer_groups", scaled)
    _, after = numerics.measure(runs())
    assert not numerics.close(after, before)
    assert numerics.close(_nudged(before, 1e-7), before)


def test_mechanisms_tell_tied_from_untied_blocks_but_not_sizes():
    from dataclasses import replace

    untied = reference_config(CHASSIS)
    tied = replace(untied, block_of_layer=(0, 0))
    wider = reference_config(replace(CHASSIS, d_model=32, d_ff=64))
    assert numerics.mechanisms(untied) == numerics.mechanisms(wider)
    assert numerics.mechanisms(untied) != numerics.mechanisms(tied)


@pytest.mark.slow
def test_proxy_fidelity_keeps_its_cached_runs():
    """The committed table maps today's proxy_fidelity probe to the version of its cached CPU runs
    (5e8cca1e3a, made at 65aa0da): an edit that leaves its numerics alone must not re-key them. Fails
    (rightly) after a real numerics change for its candidates; then rerun the bench, not the table."""
    from bench.device import load_module
    from tests.conftest import ROOT

    numerics.TABLES = ROOT / "bench" / "results" / "numerics"
    numerics.ROOT = ROOT
    mod = load_module("bench/proxy_fidelity.py")
    setup = mod.make_setup(False, None, None, None, 1)
    version = mod.code_version(setup)  # by the exact probe on a recorded machine kind, else by its values
    assert version == "5e8cca1e3a"
    _, cands = mod.load_candidates(setup)
    jobs = mod.jobs_of(setup, cands)
    cached = [j for j in jobs if store.exists(setup.out / f"{j.key(setup, version)}.json")]
    assert len(cached) >= 92  # of 96: all but 4 costly 2x-steps runs were cached at 5e8cca1e3a
    assert store.load(setup.out / f"{cached[0].key(setup, version)}.json")["code_version"] == version
