"""bench/numerics.py: values from another CPU kind match the recording machine's despite a few
Adam sign-flip outliers; a changed rule, however small, does not match."""

from __future__ import annotations

import pytest

from bench import numerics
from npas.allocation.config import Chassis, reference_config
from npas.training import proxy
from npas.training.recipe import Recipe

CHASSIS = Chassis(vocab_size=68, context=16, d_model=16, n_layers=2, n_heads=2, d_ff=32)
RECIPE = Recipe(name="probe-test", seq_len=16, batch_size=2, steps=50, warmup_steps=5, eval_every=50,
                eval_batches=2, threads=1)


def runs() -> list[tuple]:
    return [(reference_config(CHASSIS), RECIPE, CHASSIS)]


@pytest.fixture(autouse=True)
def tables(tmp_path, monkeypatch):
    monkeypatch.setattr(numerics, "TABLES", tmp_path)
    monkeypatch.setattr(numerics, "ROOT", tmp_path.parent)
    monkeypatch.delenv("NPAS_RECORD_PROBE", raising=False)
    numerics._MEMO.clear()
    return tmp_path


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


def test_a_learning_rate_multiplier_off_by_a_tenth_of_a_percent_is_seen(monkeypatch):
    _, before = numerics.measure(runs())
    real = proxy.optimizer_groups

    def scaled(*a, **k):
        groups = real(*a, **k)
        groups[0]["lr_mult"] *= 1.001
        return groups

    monkeypatch.setattr(proxy, "optimizer_groups", scaled)
    _, after = numerics.measure(runs())
    assert not numerics.close(after, before)
