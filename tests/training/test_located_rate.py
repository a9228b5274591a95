"""The located rate: lr_factor scales every group's fair rate; the rung-1 grid extends past an edge
optimum (at most twice); the grid's discarded runs are counted apart from the trial's own steps."""

from __future__ import annotations

import math

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from npas.allocation.config import ArchConfig, Chassis, reference_config
from npas.training import climb, forks
from npas.training.data import load_corpus
from npas.training.located_rate import DEFAULT_GRID, best_factor, locate, next_factor, search
from npas.training.parameterization import rules
from npas.training.recipe import Recipe

CHASSIS = Chassis(vocab_size=68, context=16, d_model=32, n_layers=2, n_heads=2, d_ff=64)
REFERENCE = Chassis(vocab_size=68, context=16, d_model=16, n_layers=4, n_heads=2, d_ff=32)  # rules act
TIED = ArchConfig(chassis=CHASSIS, mlp_widths=(64, 32), block_of_layer=(0, 0))
WSD = Recipe(name="wsd-lr", seq_len=16, batch_size=4, steps=16, lr=1e-2, min_lr=1e-3, warmup_steps=2,
             eval_every=4, eval_batches=1, threads=1, schedule="wsd", horizon=16, rungs=(8, 16))


@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


def quadratic(optimum: float):
    """A rung-1 loss with its minimum at ``optimum`` on a log2 scale; each try costs 8 steps."""
    return lambda f: ((math.log2(f) - math.log2(optimum)) ** 2, 8)


def test_the_optimizer_sees_the_factor_times_the_fair_rule_for_every_group_mid_schedule(corpus):
    seen: list[dict[int, float]] = []
    handle = register_optimizer_step_pre_hook(
        lambda opt, args, kwargs: seen.append({id(p): g["lr"] for g in opt.param_groups for p in g["params"]}))
    try:
        c = climb.start(TIED, WSD, corpus, device="cpu", reference=REFERENCE, lr_factor=2.0)
        c.trainer.advance(15, WSD.steps)  # stable to 13, then two steps into the run's own decay
    finally:
        handle.remove()
    mid = 14  # 0-based: inside the decay, below the peak and above the floor
    base = WSD.lr_at(mid)
    assert WSD.decay_start(16) < mid and WSD.min_lr < base < WSD.lr
    table = rules(c.trainer.model, REFERENCE)
    mults = {name: table[name].lr_mult for name, _ in c.trainer.model.named_parameters()}
    assert len(set(mults.values())) > 2  # the fair rules differ between groups: each must keep its own
    for name, p in c.trainer.model.named_parameters():
        assert seen[mid][id(p)] == pytest.approx(2.0 * base * mults[name], rel=1e-12), name
        assert seen[1][id(p)] == pytest.approx(2.0 * WSD.lr_at(1) * mults[name], rel=1e-12), name  # warmup too
    assert c.lr_factor == 2.0


def test_factor_one_trains_exactly_as_the_plain_wsd_run(corpus):
    plain = forks.run_proxy(reference_config(CHASSIS), WSD, corpus)
    c = climb.start(reference_config(CHASSIS), WSD, corpus, device="cpu", lr_factor=1.0)
    assert c.climb() == plain.rung_losses


def test_an_interior_optimum_needs_no_extension():
    located = search(quadratic(2.0))
    assert located.factor == 2.0 and list(located.losses) == list(DEFAULT_GRID) and not located.at_edge
    assert located.lr_grid_steps == 3 * 8  # the three runs not kept


def test_an_edge_optimum_extends_the_grid_that_way_at_most_twice():
    up = search(quadratic(8.0))  # best at x4 (the top edge): try x8, now best and interior after x16
    assert list(up.losses) == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0] and up.factor == 8.0 and not up.at_edge
    far = search(quadratic(100.0))  # still at the edge after two steps: bounded, not located
    assert list(far.losses) == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0] and far.factor == 16.0 and far.at_edge
    down = search(quadratic(0.2))  # x1 is clearly past the optimum: x2 and x4 are not trained
    assert list(down.losses) == [0.5, 1.0, 0.25, 0.125] and down.factor == 0.25
    assert far.lr_grid_steps == 5 * 8 and down.lr_grid_steps == 3 * 8


def test_the_rule_on_its_own():
    assert next_factor({}) == 0.5 and next_factor({0.5: 1.0}) == 1.0
    grid = {0.5: 3.0, 1.0: 2.0, 2.0: 1.0, 4.0: 0.5}
    assert next_factor(grid) == 8.0 and next_factor({**grid, 8.0: 0.4}) == 16.0
    assert next_factor({**grid, 8.0: 0.4, 16.0: 0.3}) is None  # two extensions: stop
    assert best_factor({0.5: math.nan, 1.0: 2.0, 2.0: 2.0}) == 1.0  # a tie stays nearest x1; NaN never wins
    assert next_factor({0.5: math.nan, 1.0: math.nan, 2.0: 1.0, 4.0: 1.5}) is None


def test_the_grid_stops_going_up_past_a_clearly_worse_factor_but_not_within_the_noise():
    from npas.training.located_rate import CLEARLY_WORSE

    # narrow_untied at rung 1 (experiments/located_rate.py's cache): x2 is 0.22 nats worse: x4 is skipped and
    # the edge optimum at x0.5 extends downwards
    assert next_factor({0.5: 2.484, 1.0: 2.489, 2.0: 2.701}) == 0.25
    assert next_factor({0.5: 2.484, 1.0: 2.489, 2.0: math.nan}) == 0.25  # a diverged run, the same
    near = {0.5: 2.459, 1.0: 2.457, 2.0: 2.457 + CLEARLY_WORSE / 2}  # within the noise: x4 is still tried
    assert next_factor(near) == 4.0
    assert next_factor({0.5: 2.0, 1.0: 1.9, 2.0: 1.9 + 2 * CLEARLY_WORSE}) is None  # x1 interior: located


def test_locate_trains_the_grid_to_rung_one_and_keeps_the_winning_run(corpus):
    slow = Recipe.from_dict({**WSD.to_dict(), "lr": 1e-4, "min_lr": 1e-5})  # too low: higher is better
    run, located = locate(TIED, slow, corpus, device="cpu", reference=REFERENCE)
    assert list(located.losses) == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0]  # the edge optimum extended the grid
    assert located.factor == 16.0 and located.at_edge and run.lr_factor == 16.0
    assert run.rung_losses == {8: located.losses[16.0]} and run.trained_steps == 8  # rung 1: 6 stable + 2 fork
    assert located.lr_grid_steps == 5 * 8  # the five runs not kept, apart from the trial's own steps
    assert located.to_dict()["lr_grid_steps"] == 40 and located.to_dict()["lr_factor"] == 16.0
    # the kept run goes on up: it is the trial's run, exactly a straight climb at that factor
    straight = climb.start(TIED, slow, corpus, device="cpu", reference=REFERENCE, lr_factor=16.0)
    assert run.climb() == straight.climb()
    assert run.trained_steps == 16 + 2 and torch.get_num_threads() >= 1


def test_the_locating_rung_is_the_highest_below_the_top_at_or_under_a_quarter_of_the_run():
    from npas.training.located_rate import locate_rung

    def at(steps: int, rungs: tuple[int, ...]) -> int:
        return locate_rung(Recipe.from_dict({**WSD.to_dict(), "steps": steps, "horizon": steps, "rungs": list(rungs)}))

    assert at(1600, (100, 400, 1600)) == 400  # the default ladder: T/4, not the first rung (T/16)
    assert at(4000, (250, 1000, 4000)) == 1000  # the shipped `ladder` recipe
    assert at(16, (8, 16)) == 8  # no rung at or below T/4: the first
    assert at(16, (3, 4, 8, 16)) == 4


def test_locate_at_a_later_rung_continues_the_fair_climb_as_the_grids_x1_run(corpus):
    three = Recipe.from_dict({**WSD.to_dict(), "rungs": [3, 4, 16]})  # locating rung 4 = T/4
    fair = climb.start(TIED, three, corpus, device="cpu", reference=REFERENCE)
    fair.step_up()  # the trial was scored at rung 3 at its fair rate, then promoted
    run, located = locate(TIED, three, corpus, device="cpu", reference=REFERENCE, fair=fair)
    assert located.rung == 4 and located.to_dict()["lr_rung"] == 4
    straight = {f: climb.start(TIED, three, corpus, device="cpu", reference=REFERENCE, lr_factor=f) for f in located.losses}
    for f, c in straight.items():  # every grid run is a straight climb to rung 4 at its factor: bit for bit
        assert c.climb(until=4)[4] == located.losses[f] or (math.isnan(c.rung_losses[4]) and math.isnan(located.losses[f]))
    assert run.lr_factor == located.factor and run.top == 4
    assert run.rung_losses == straight[located.factor].rung_losses  # rung 3's fork included
    per = straight[1.0].trained_steps  # to rung 4 through rung 3's fork
    assert per > 4 and located.lr_grid_steps == per * (len(located.losses) - 1)  # x1 counted when it loses
    with pytest.raises(ValueError, match="x1 below rung 4"):
        locate(TIED, three, corpus, device="cpu", reference=REFERENCE, fair=run)  # already at the rung
    with pytest.raises(ValueError, match="not one of the recipe's rungs"):
        locate(TIED, three, corpus, device="cpu", reference=REFERENCE, rung=5)
