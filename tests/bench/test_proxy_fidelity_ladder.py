"""The ladder row's replay (bench/proxy_fidelity_ladder.py): the ladder's own rule over cached rung losses."""

from __future__ import annotations

import random

from bench.proxy_fidelity import wsd_recipe
from bench.proxy_fidelity_ladder import replay, segment_steps
from npas import Recipe


def _recipe() -> Recipe:
    proxy = Recipe.from_dict({"name": "p", "steps": 400, "warmup_steps": 30, "seq_len": 64, "batch_size": 48})
    return wsd_recipe(proxy, Recipe.from_dict({**proxy.to_dict(), "steps": 1600}))


def test_segments_add_up_to_the_climbs_trained_steps() -> None:
    r = _recipe()
    rungs = r.fork_rungs()
    assert rungs == (100, 400, 1600)
    # a candidate that reaches T trains T plus the decays of the forks below it, no step twice
    forks = sum(t - r.decay_start(t) for t in rungs[:-1])
    assert sum(segment_steps(r, rungs, i) for i in range(3)) == 1600 + forks == 1600 + 20 + 80
    # one paused at rung 1 trained the fork point plus the fork's decay: the rung itself
    assert segment_steps(r, rungs, 0) == 100


def test_replay_promotes_the_best_and_spends_under_half_of_n_times_t() -> None:
    r = _recipe()
    names = [f"c{k}" for k in range(16)]
    # candidate k is k-th best at every rung, but the sampler proposes them worst first
    losses = {n: {t: 3.0 + 0.1 * k + (0.05 if t == 100 else 0.0) for t in r.fork_rungs()}
              for k, n in enumerate(names)}
    rep = replay(list(reversed(names)), losses, r, dict.fromkeys(names, 1_000_000))
    assert set(rep.reached) == set(names)  # every candidate scored at the first rung
    assert rep.reached["c0"] == 1600  # the best reaches T although it arrived last
    at_2 = [n for n, t in rep.reached.items() if t >= 400]
    assert len(at_2) >= 16 // 4  # asynchronous: at least the finished rung's quota moved on
    score = rep.score()
    assert min(score, key=score.get) == "c0"
    # rung reached dominates loss: every candidate at a higher rung ranks before every one below
    for a in names:
        for b in names:
            if rep.reached[a] > rep.reached[b]:
                assert score[a] < score[b]
    # worst first is asynchronous promotion's worst case (each arrival is the best so far): still under N x T
    assert rep.total_steps < 16 * 1600
    order = names[:]
    random.Random(0).shuffle(order)
    shuffled = replay(order, losses, r, dict.fromkeys(names, 1_000_000))
    assert shuffled.reached["c0"] == 1600
    assert shuffled.total_steps < rep.total_steps and shuffled.total_steps < 0.5 * 16 * 1600
    assert rep.total_steps == sum(rep.steps.values()) == sum(
        sum(segment_steps(r, r.fork_rungs(), i) for i in range(r.fork_rungs().index(t) + 1))
        for t in rep.reached.values())


def test_a_non_finite_rung_loss_is_never_promoted() -> None:
    r = _recipe()
    names = [f"c{k}" for k in range(8)]
    losses = {n: dict.fromkeys(r.fork_rungs(), 3.0 + 0.1 * k) for k, n in enumerate(names)}
    losses["c0"] = dict.fromkeys(r.fork_rungs(), float("nan"))
    rep = replay(names, losses, r, dict.fromkeys(names, 1))
    assert rep.reached["c0"] == 100
