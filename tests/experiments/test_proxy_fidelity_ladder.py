"""The ladder row's replay (experiments/proxy_fidelity_ladder.py): the ladder's own rule over cached rung losses."""

from __future__ import annotations

import functools
import random
import re

from experiments.proxy_fidelity import wsd_recipe
from experiments.proxy_fidelity_ladder import replay, segment_steps
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


def test_the_report_s_ladder_row_replays_the_search_s_rule_and_says_it_is_one_order(tmp_path, capsys, monkeypatch):
    """The proxy-fidelity report's ladder row, fed planted rung losses: the search's cap (N = 8, eta 4:
    at most 2 past the first rung, 1 to T by the second rung's close), FLOPs beside steps, and recall
    said to be one order's. Its intervals are not what is checked: no bootstrap resamples (seconds)."""
    from experiments import proxy_fidelity as pf
    from experiments import proxy_fidelity_report as report
    from experiments.proxy_fidelity_report import DEFAULT_PAR, _ladder_rows

    monkeypatch.setattr(report, "rank_correlation", functools.partial(report.rank_correlation, n_boot=0))
    monkeypatch.setattr(report, "_delta_target", functools.partial(report._delta_target, n_boot=0))

    setup = pf.make_setup(False, None, None, tmp_path, 1)
    cands = pf.frozen_candidates(8)
    res = {(c.config.hash, "wsd", setup.proxy.seed, DEFAULT_PAR):
           {"status": "ok", "rung_losses": {"100": 2.4 + 0.01 * k, "400": 1.9 + 0.01 * k}, "val_loss": 1.5 + 0.01 * k}
           for k, c in enumerate(cands)}
    truth = {c.name: 1.5 + 0.01 * k for k, c in enumerate(cands)}
    out = _ladder_rows(setup, cands, res, {c.name: 2.0 - 0.01 * k for k, c in enumerate(cands)}, truth, 0.02)
    text = capsys.readouterr().out
    assert "under the search's rule: target N = 8, ranked on (rung loss, train memory); one order of many, see " \
           "experiments/ladder_orders.py): reached " in text, text
    reached = out["ladder"]["reached"]
    assert reached[1600] == 1 and reached[400] + reached[1600] <= 2 and sum(reached.values()) == 8
    assert re.search(r"^target: ladder compute [\d,]+ steps \(forks counted\) = \d\.\d{3} x N x T \(8 x 1,600\) "
                     r"<= 0\.5: (PASS|MISS); in FLOPs \d\.\d{3} x N x T$", text, re.M), text
    assert re.search(r"^target: ladder top-3 recall \d\.\d\d >= 2/3 in this one order: (PASS|MISS)$", text, re.M), text
    assert 0 < out["ladder"]["flops_fraction"] < 1
