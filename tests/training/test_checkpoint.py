"""A WSD run paused at a rung and resumed from its checkpoint in a fresh climb reaches bit for bit the
losses of a run that never stopped, at every later rung and at T; no step is trained twice."""

from __future__ import annotations

import json
import math

import pytest
import torch

from npas.allocation.config import ArchConfig, Chassis, reference_config
from npas.errors import DataError
from npas.training import checkpoint, climb, forks, trainer
from npas.training.data import load_corpus
from npas.training.recipe import Recipe

CHASSIS = Chassis(vocab_size=68, context=16, d_model=32, n_layers=2, n_heads=2, d_ff=64)
REF = reference_config(CHASSIS)
# both layers share one block (its MLP narrowed for layer 1) and carry LoRA deltas: shared and per-layer
# tensors and their optimizer states must all travel
TIED = ArchConfig(chassis=CHASSIS, mlp_widths=(64, 32), block_of_layer=(0, 0), lora_attn=(2, 2))
# rungs 8 (fork from step 6), 12 (fork from 10) and 16 (the run's own decay from 13)
WSD = Recipe(name="wsd-ckpt", seq_len=16, batch_size=4, steps=16, lr=1e-2, min_lr=1e-3, warmup_steps=2,
             eval_every=4, eval_batches=1, threads=1, schedule="wsd", horizon=16, rungs=(8, 12, 16))


@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


@pytest.fixture()
def small_blocks(monkeypatch):
    # batch offsets drawn 3 steps at a time: the pause (step 6) falls inside a block, so a resume that
    # lost the stream's generator or its current block would read other batches
    monkeypatch.setattr(trainer, "OFFSET_BLOCK", 3)


def test_a_climb_to_the_top_is_the_one_go_wsd_run(corpus, small_blocks):
    whole = forks.run_proxy(REF, WSD, corpus)
    c = climb.start(REF, WSD, corpus, device="cpu")
    assert c.climb() == whole.rung_losses  # bitwise: the same steps as forks.train_model
    assert c.trained_steps == whole.steps_trained == 16 + 2 + 2
    assert c.next_rung is None and c.top == 16


@pytest.mark.parametrize("cfg", [REF, TIED], ids=["reference", "tied"])
def test_resumed_from_a_checkpoint_matches_an_uninterrupted_run_bitwise(corpus, small_blocks, tmp_path, cfg):
    straight = climb.start(cfg, WSD, corpus, device="cpu")
    straight.climb()

    paused = climb.start(cfg, WSD, corpus, device="cpu")
    assert paused.step_up() == (8, straight.rung_losses[8])
    assert paused.trainer.step == WSD.decay_start(8) == 6 and paused.trained_steps == 8
    checkpoint.save(paused, tmp_path / "ckpt")
    del paused
    torch.manual_seed(12345)  # another worker's RNG: the checkpoint's must win
    torch.rand(7)

    resumed = checkpoint.load(tmp_path / "ckpt", cfg, corpus, device="cpu")
    assert resumed.trainer.step == 6 and resumed.rung_losses == {8: straight.rung_losses[8]}
    assert resumed.next_rung == 12
    assert resumed.climb() == straight.rung_losses  # 12 and 16, bit for bit
    assert resumed.rung_losses[12] != resumed.rung_losses[16]
    # top rung 16 plus the forks' decays at 8 (6..7) and 12 (10..11): nothing trained twice
    assert resumed.trained_steps == straight.trained_steps == 20


def test_a_second_pause_and_the_rng_state_travel_too(corpus, small_blocks, tmp_path):
    straight = climb.start(REF, WSD, corpus, device="cpu")
    straight.climb()
    c = climb.start(REF, WSD, corpus, device="cpu")
    for rung in (8, 12):
        c.step_up()
        checkpoint.save(c, tmp_path / f"r{rung}")
        rng = torch.get_rng_state()
        c = checkpoint.load(tmp_path / f"r{rung}", REF, corpus, device="cpu")
        assert torch.equal(rng, torch.get_rng_state())
    c.climb()
    assert c.rung_losses == straight.rung_losses and c.trained_steps == 20


def test_the_checkpoint_is_safetensors_and_json_only(corpus, tmp_path):
    c = climb.start(REF, WSD, corpus, device="cpu", lr_factor=2.0)
    c.step_up()
    d = checkpoint.save(c, tmp_path / "ckpt")
    assert sorted(p.name for p in d.iterdir()) == ["state.json", "tensors.safetensors"]
    state = json.loads((d / "state.json").read_text())
    assert state["step"] == 6 and state["lr_factor"] == 2.0 and state["rung_losses"] == {"8": c.rung_losses[8]}
    loaded = checkpoint.load(d, REF, corpus, device="cpu")
    assert [g["lr_mult"] for g in loaded.trainer.opt.param_groups] == [g["lr_mult"] for g in c.trainer.opt.param_groups]
    other = reference_config(Chassis(vocab_size=68, context=16, d_model=32, n_layers=2, n_heads=2, d_ff=32))
    with pytest.raises(DataError, match="resume it with the allocation it was started with"):
        checkpoint.load(d, other, corpus)
    (d / "state.json").unlink()
    with pytest.raises(DataError, match="not a complete climb checkpoint"):
        checkpoint.load(d, REF, corpus)


def test_a_diverging_climb_stops_with_a_reason(corpus):
    hot = Recipe.from_dict({**WSD.to_dict(), "lr": 1e4, "min_lr": 1e3})
    c = climb.start(REF, hot, corpus, device="cpu")
    c.climb()
    assert c.failed is not None and "non-finite" in c.failed and c.next_rung is None
    assert any(math.isnan(v) for v in c.rung_losses.values())
