"""The certificate's statistics against answers worked out by hand or by construction."""

from __future__ import annotations

import math

import numpy as np
import pytest

from npas.service.study import fidelity as F
from npas.service.study import noise as N


def test_rank_correlation_point_values_and_seeded_intervals():
    proxy = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    valid = [1.1, 2.2, 2.9, 4.5, 4.4, 6.3]  # one swapped pair out of 15
    tau = F.rank_correlation(proxy, valid, "kendall")
    assert tau.value == pytest.approx(1 - 2 * 1 / 15)
    rho = F.rank_correlation(proxy, valid, "spearman")
    assert rho.value == pytest.approx(1 - 6 * 2 / (6 * 35))  # one adjacent swap: sum d^2 = 2
    assert tau.low <= tau.value <= tau.high <= 1.0
    assert F.rank_correlation(proxy, valid, "kendall") == tau  # seeded: same data, same interval
    assert F.rank_correlation(proxy[:2], valid[:2]).low is None  # too few for an interval
    assert F.rank_correlation(proxy, valid, n_boot=0) == F.Interval(tau.value, None, None, len(proxy))  # point only


def test_rank_flips_counts_reversed_pairs():
    assert F.rank_flips([1, 2, 3, 4], [1, 2, 3, 4]) == (0, 6)
    assert F.rank_flips([1, 2, 3, 4], [4, 3, 2, 1]) == (6, 6)
    assert F.rank_flips([1, 2, 3], [2, 1, 3]) == (1, 3)


def test_seed_noise_paired_std_and_snr_by_construction():
    # allocation effects 0, 1, 2 plus a seed effect shared by all (+-0.5) and private noise +-0.1
    seed_effect = np.array([0.5, -0.5, 0.5, -0.5])
    private = np.array([[0.1, -0.1, -0.1, 0.1], [-0.1, 0.1, 0.1, -0.1], [0.1, 0.1, -0.1, -0.1]])
    losses = np.array([[0.0], [1.0], [2.0]]) + seed_effect + private
    within = math.sqrt(np.mean(np.var(losses, axis=1, ddof=1)))
    assert N.pooled_seed_std(losses) == pytest.approx(within)
    assert N.paired_std(losses) < N.pooled_seed_std(losses)  # pairing cancels the shared seed effect
    means = losses.mean(axis=1)
    assert N.signal_to_noise(losses) == pytest.approx(np.std(means, ddof=1) / (within / 2))
    assert N.pooled_seed_std([[1.0], [2.0]]) is None and N.signal_to_noise([[1.0], [2.0]]) is None


def test_signal_to_noise_of_pure_noise_is_about_one():
    rng = np.random.default_rng(3)
    snrs = [N.signal_to_noise(rng.normal(size=(30, 4))) for _ in range(50)]
    assert 0.85 < float(np.median(snrs)) < 1.15


def test_r_squared_and_size_and_compute():
    x = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    assert F.r_squared(3 - 0.5 * x, x) == pytest.approx(1.0)
    assert F.r_squared([1.0, -1.0, 1.0, -1.0, 1.0], [1.0, 2.0, 3.0, 4.0, 5.0]) < 0.1
    flops = [1e6, 2e6, 4e6, 8e6, 16e6]
    loss = [3.0 - 0.1 * math.log(f) for f in flops]
    out = F.size_and_compute(loss, flops, [5e5, 3e5, 9e5, 1e5, 7e5])
    assert out["r2_flops"] == pytest.approx(1.0) and out["r2_both"] == pytest.approx(1.0)
    assert out["r2_materialised"] < 0.9


def test_paired_delta_is_a_t_interval_on_the_differences():
    a, b = [2.0, 2.1, 1.9, 2.05], [2.1, 2.2, 2.0, 2.1]
    d = np.array(a) - np.array(b)
    half = 3.182446305284263 * d.std(ddof=1) / 2  # t(0.975, df=3)
    iv = F.paired_delta(a, b)
    assert iv.value == pytest.approx(d.mean())
    assert (iv.low, iv.high) == pytest.approx((d.mean() - half, d.mean() + half))
    assert iv.high < 0 and not iv.covers(0.0)
