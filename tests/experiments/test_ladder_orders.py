"""The replay over sampler orders (experiments/ladder_orders.py) on a tiny synthetic cache: the product's cap
holds, a closing rung sends its best waiting trial on, compute adds up, and the default rule."""

from __future__ import annotations

import math

import pytest

from experiments import ladder_orders as lo
from experiments.proxy_fidelity_ladder import replay, segment_steps
from npas import Recipe

T = 160
NAMES = ("b0", "b1", *(f"c{k}" for k in range(6)))


def _cache() -> lo.Cache:
    recipe = Recipe.from_dict({"name": "w", "steps": T, "horizon": T, "warmup_steps": 5, "seq_len": 16,
                               "batch_size": 2, "eval_every": T, "schedule": "wsd", "rungs": [10, 40, T]})
    # candidate k is k-th best at T; the low rungs order them otherwise (curves cross)
    truth = {n: 1.5 + 0.01 * k for k, n in enumerate(NAMES)}
    rungs = {n: {10: 2.5 - 0.02 * k, 40: 2.0 + 0.03 * ((3 * k) % 8), T: truth[n] - 0.01} for k, n in enumerate(NAMES)}
    return lo.Cache(NAMES, NAMES[:2], recipe, rungs, truth, {n: 2.0 + 0.01 * ((5 * k) % 8) for k, n in enumerate(NAMES)},
                    40, dict.fromkeys(NAMES, 1.0), {n: 1000.0 * (1 + k % 3) for k, n in enumerate(NAMES)}, 0.01)


@pytest.mark.parametrize("config", lo.configs(T), ids=lambda c: c.label(T))
def test_the_cap_holds_and_compute_adds_up(config):
    cache = _cache()
    recipe = Recipe.from_dict({**cache.recipe.to_dict(), "rungs": list(config.rungs)})
    N = len(NAMES)
    for order in lo.orders(cache, 4, 0):
        assert order[:2] == ["b0", "b1"] and sorted(order) == sorted(NAMES)
        rep = replay(order, cache.rung_losses, recipe, cache.flops, config.eta, target=N,
                     objectives={c: (cache.memory[c],) for c in NAMES}, tie_width=0.05 if config.tie else None)
        rungs = config.rungs
        for k, rung in enumerate(rungs[:-1], start=1):
            went = rep.ladder.promoted.get(rung, [])
            assert len(went) <= max(N // config.eta ** k, 1)  # floor(N / eta^k); a close may send one on
            above = [c for c, t in rep.reached.items() if t > rung]
            assert sorted(above) == sorted(went)  # who climbed past a rung is who it promoted
        assert rep.pick() is not None  # the closes bring someone to T
        for c, t in rep.reached.items():  # each candidate trained its segments up to its top rung, no more
            steps = sum(segment_steps(recipe, rungs, i) for i in range(rungs.index(t) + 1))
            assert rep.steps[c] == steps and rep.flops[c] == steps * cache.flops[c]
        assert set(rep.reached) == set(NAMES)  # every candidate is scored at the first rung


def test_a_rung_whose_cap_is_zero_sends_its_best_waiting_trial_on():
    cache = _cache()
    # N = 8, eta 4: rung 10 promotes at most 2, rung 40 none (floor(8/16) = 0) until it closes
    rep = replay(list(NAMES), cache.rung_losses, cache.recipe, cache.flops, 4, target=8)
    at_40 = [c for c, t in rep.reached.items() if t >= 40]
    assert len(at_40) == 2
    at_T = [c for c, t in rep.reached.items() if t == T]
    assert at_T == [min(at_40, key=lambda c: cache.rung_losses[c][40])]
    assert rep.closed[-1] == (40, tuple(at_T))
    # without a target (the pre-cap replay) the same order sends more on and closes nothing
    old = replay(list(NAMES), cache.rung_losses, cache.recipe, cache.flops, 4)
    assert not old.closed


def test_a_noise_tie_admits_the_next_trial_within_the_width_never_past_the_cap():
    recipe = Recipe.from_dict({**_cache().recipe.to_dict(), "rungs": [10, T]})
    names = [f"c{k}" for k in range(8)]
    losses = {n: {10: 2.0 + 0.001 * k, T: 1.5 + 0.01 * k} for k, n in enumerate(names)}
    flops = dict.fromkeys(names, 1.0)
    worst_first = names[::-1]
    run = lambda width: replay(worst_first, losses, recipe, flops, 4, workers=1, target=8, tie_width=width)  # noqa: E731
    off, on, narrow = run(None), run(0.01), run(0.0005)
    # one worker, worst first: at n = 4 the quota is 1 and c4 goes on; c3 (n = 5) fills the cap, floor(8/4) = 2
    assert off.ladder.promoted[10] == ["c4", "c3"]
    # tie on: c5, 0.001 behind c4, goes on with it and the cap is full before c3 arrives
    assert on.ladder.promoted[10] == ["c4", "c5"]
    assert narrow.ladder.promoted[10] == off.ladder.promoted[10]  # 0.001 apart is not within 0.0005
    assert on.total_steps == off.total_steps  # the cap, not the tie, bounds the compute


def test_the_default_rule_takes_the_lowest_regret_within_budget_and_ties_to_the_cheaper():
    a, b, c, d = (lo.Config((10, T), e, False) for e in (2, 3, 4, 5))
    rows = {a: {"regret": 0.001, "flops": 0.6},  # best, but over half of N x T
            b: {"regret": 0.0100, "flops": 0.40},
            c: {"regret": 0.0105, "flops": 0.30},  # within 0.001 of b: a tie, and cheaper
            d: {"regret": 0.0200, "flops": 0.10}}
    assert lo.choose(rows) == c
    assert lo.choose({a: rows[a]}) is None


def test_evaluate_and_the_fixed_rows_on_the_synthetic_cache():
    cache = _cache()
    sampled = lo.orders(cache, 3, 1)
    r = lo.evaluate(cache, lo.Config((10, 40, T), 2, False), sampled)
    assert r["orders"] == 3 and r["regret"] >= 0 and r["regret_p10"] <= r["regret"] <= r["regret_p90"] + 1e-12
    assert math.isclose(r["regret_sigma"], r["regret"] / cache.sigma)
    assert 0 < r["steps"] < 1 and 0 < r["flops"] < 1
    fixed = lo.fixed_rows(cache)
    ceiling = fixed["ceiling: every candidate to T"]
    assert ceiling["regret"] == 0 and ceiling["steps"] == ceiling["flops"] == 1.0 and ceiling["all3"] == 1.0
    proxy = next(v for k, v in fixed.items() if k.startswith("cosine"))
    assert proxy["pick"] == "b0" and math.isclose(proxy["regret"], 0.0) and proxy["steps"] == 40 / T
