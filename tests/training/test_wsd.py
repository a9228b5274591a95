"""WSD schedules and cooldown forks: a fork's rung loss is a separate WSD run's, bit for bit on CPU;
the stable run never sees its forks; a cosine recipe trains and serializes exactly as before."""

from __future__ import annotations

import math

import pytest

from npas.allocation.config import Chassis, reference_config
from npas.errors import ConfigError
from npas.training import forks, trainer
from npas.training import proxy as proxy_mod
from npas.training.data import load_corpus
from npas.training.forks import ForkResult, run_proxy
from npas.training.proxy import make_trainer
from npas.training.recipe import Recipe, load_recipe

CHASSIS = Chassis(vocab_size=68, context=16, d_model=32, n_layers=2, n_heads=2, d_ff=64)
REF = reference_config(CHASSIS)
# a tiny WSD run: stable to step 6 (its fork to 8 decays 6..7) and to 13 (its own decay 13..15)
WSD = Recipe(name="wsd-tiny", seq_len=16, batch_size=4, steps=16, lr=1e-2, min_lr=1e-3, warmup_steps=2,
             eval_every=4, eval_batches=1, threads=1, schedule="wsd", horizon=16, rungs=(8, 16))
COSINE = Recipe(name="cos-tiny", seq_len=16, batch_size=4, steps=24, lr=1e-2, min_lr=1e-3, warmup_steps=3,
                eval_every=8, eval_batches=1, threads=1)
# the serialized proxy recipe as npas wrote it before horizon and schedule existed (bench caches key on it)
OLD_PROXY = {"name": "proxy", "seq_len": 64, "batch_size": 48, "steps": 400, "lr": 0.006, "min_lr": 0.0006,
             "warmup_steps": 30, "weight_decay": 0.1, "betas": [0.9, 0.95], "grad_clip": 1.0, "eval_every": 100,
             "eval_batches": 8, "seed": 0, "dtype": "bfloat16", "threads": 1, "val_fraction": 0.1,
             "test_fraction": 0.1, "parameterization": "fair", "data": None, "version": 2}


@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


def alone(t: int) -> Recipe:
    """A separate WSD run of length t: no forks, only its own decay."""
    return Recipe.from_dict({**WSD.to_dict(), "steps": t, "rungs": [t]})


def test_fork_rung_loss_is_a_separate_wsd_run_bitwise_and_the_stable_run_never_sees_it(corpus, monkeypatch):
    # blocks of 3 steps, so the fork (at step 6) and the stable run each draw a fresh batch block: a fork
    # that shared the stable run's generator (or optimizer, or weights) would move the stable run's batches
    monkeypatch.setattr(trainer, "OFFSET_BLOCK", 3)
    forked = run_proxy(REF, WSD, corpus)
    assert isinstance(forked, ForkResult) and forked.status == "ok"
    assert list(forked.rung_losses) == [8, 16]
    short, full = run_proxy(REF, alone(8), corpus), run_proxy(REF, alone(16), corpus)
    assert forked.rung_losses[8] == short.val_loss  # exact: the fork is the WSD-8 run
    assert forked.rung_losses[16] == full.val_loss == forked.val_loss  # the stable run went on untouched
    assert forked.rung_losses[8] != forked.rung_losses[16]
    assert forked.curve == ((8, forked.rung_losses[8]), (16, forked.val_loss))
    assert forked.steps_done == 16
    assert WSD.decay_start(8) == 6 and forked.steps_trained == 16 + 2  # the stable run plus the fork's decay
    assert full.steps_trained == 16 and full.rung_losses == {16: full.val_loss}


def test_fork_leaves_the_trainer_and_global_rng_as_they_were(corpus):
    import torch

    from npas.allocation.transformer import build_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the recipe's runs do: a tiny model on many threads of a busy box crawls
    try:
        torch.manual_seed(0)
        model = build_model(REF).float()
        tr = make_trainer(model, WSD, corpus, torch.device("cpu"))
        tr.advance(WSD.decay_start(8), WSD.steps)
        before = {k: v.clone() for k, v in tr.model.state_dict().items()}
        rng = torch.get_rng_state()
        evals = proxy_mod.eval_batches(corpus, WSD)
        loss = forks.fork_loss(tr, 8, evals)
    finally:
        torch.set_num_threads(threads)
    assert math.isfinite(loss) and tr.step == WSD.decay_start(8)
    assert all(torch.equal(before[k], v) for k, v in tr.model.state_dict().items())
    assert torch.equal(rng, torch.get_rng_state())
    with pytest.raises(ValueError, match="leaves the stable run at step 13"):
        forks.fork_loss(tr, 16, evals)


def test_a_report_stops_a_wsd_run_at_a_rung_with_the_rungs_it_passed(corpus):
    seen = []
    res = run_proxy(REF, WSD, corpus, report=lambda step, loss: seen.append((step, loss)) or True)
    assert res.status == "stopped" and res.steps_done == 8 and list(res.rung_losses) == [8]
    assert seen == [(8, res.rung_losses[8])] and res.val_loss == res.rung_losses[8]
    assert res.steps_trained == 6 + 2  # stable to the fork point, plus the fork
    d = res.to_dict()
    assert d["rung_losses"] == {8: res.rung_losses[8]} and d["steps_trained"] == 8
    assert ForkResult.from_dict(d) == res


def test_cosine_recipe_trains_exactly_as_the_proxy_loop(corpus):
    via_forks = run_proxy(REF, COSINE, corpus)
    direct = forks.train_model(REF, COSINE, corpus)[1]  # one loop now: the golden fixture pins its numerics
    assert type(via_forks) is proxy_mod.ProxyResult  # no rung_losses: a cosine result is what it always was
    assert via_forks.curve == direct.curve and via_forks.train_loss == direct.train_loss
    assert "rung_losses" not in via_forks.to_dict()


def test_wsd_schedule_holds_the_rate_then_decays_to_the_floor():
    r = Recipe.from_dict({**WSD.to_dict(), "steps": 100, "rungs": None, "horizon": 100, "warmup_steps": 3})
    assert [r.lr_at(s) for s in range(3)] == [COSINE.lr_at(s) for s in range(3)]  # the same warmup
    assert r.decay_start(100) == 80 and all(r.lr_at(s) == r.lr for s in range(3, 80))
    assert r.lr_at(99) == pytest.approx(r.min_lr) and r.lr_at(80) < r.lr
    linear = Recipe.from_dict({**r.to_dict(), "decay_shape": "linear"})
    # 1 - sqrt falls faster at first than linear: lower mid-decay rate, same ends
    assert r.lr_at(89) < linear.lr_at(89) and linear.lr_at(99) == pytest.approx(r.min_lr)
    # every WSD run is at the same rate before its own decay starts, whatever its length
    assert all(r.lr_at(s, 40) == r.lr_at(s, 100) for s in range(r.decay_start(40)))
    assert r.fork_rungs() == (6, 25, 100)  # horizon/16, /4, /1
    assert Recipe.from_dict({**r.to_dict(), "steps": 30}).fork_rungs() == (6, 25, 30)  # steps is always a rung


def test_old_recipes_serialize_exactly_as_before():
    assert Recipe.from_dict(OLD_PROXY).to_dict() == OLD_PROXY
    assert load_recipe("proxy").to_dict() == OLD_PROXY  # it says horizon 4000 and cosine: the defaults
    assert list(Recipe().to_dict()) == list(OLD_PROXY)
    wsd = WSD.to_dict()
    assert wsd["schedule"] == "wsd" and wsd["rungs"] == [8, 16] and wsd["horizon"] == 16
    assert Recipe.from_dict(wsd) == WSD
    assert load_recipe("smoke").horizon == 200 and load_recipe("smoke").schedule == "cosine"


def test_schedule_fields_are_validated_in_one_pass():
    with pytest.raises(ConfigError) as err:
        Recipe.from_dict({**OLD_PROXY, "schedule": "wds", "decay_fraction": 0.0, "decay_shape": "sqrt",
                          "rungs": [20, 500], "horizon": 0})
    text = str(err.value)
    for needle in ("schedule: must be one of cosine, wsd, got 'wds'; did you mean 'wsd'?",
                   "decay_fraction: must be in (0, 1]", "decay_shape: must be one of 1-sqrt, linear",
                   "rungs: only a wsd schedule is scored at rungs", "got 20, 500", "horizon: must be >= 1"):
        assert needle in text, needle
    assert text.splitlines()[0].endswith("6 problems")
    cut = WSD.with_steps(12)
    assert cut.rungs == (8,) and cut.steps == 12 and cut.fork_rungs() == (8, 12)
    shorter = WSD.with_steps(5)  # every rung cut: the horizon's defaults (16/4 = 4) and the run's own end
    assert shorter.rungs is None and shorter.fork_rungs() == (4, 5)
