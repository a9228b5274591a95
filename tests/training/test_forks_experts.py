"""A WSD run of an allocation with expert pools forks like any other (regression: the model kept its
last forward's graph-attached balance loss and routing statistics, which a fork's deep copy refused)."""

from __future__ import annotations

import copy

import pytest
import torch

from npas.allocation.config import ArchConfig, Chassis, ExpertPool
from npas.allocation.transformer import build_model
from npas.training import climb, forks
from npas.training.data import load_corpus
from npas.training.recipe import Recipe

CH = Chassis(vocab_size=68, context=16, d_model=16, n_layers=2, n_heads=2, d_ff=32)
CFG = ArchConfig(chassis=CH, mlp_widths=(1, 1), block_of_layer=(0, 1),
                 experts=ExpertPool((4,), (0, 0), 8, 1, "per_layer", 0.01))
WSD = Recipe(name="wsd-moe", seq_len=16, batch_size=4, steps=16, lr=1e-2, min_lr=1e-3, warmup_steps=2,
             eval_every=4, eval_batches=1, threads=1, schedule="wsd", horizon=16, rungs=(8, 16))


@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


def test_a_model_copied_after_a_training_forward_keeps_its_weights_not_its_graph():
    model = build_model(CFG)
    x = torch.randint(0, 68, (2, 8))
    _, loss = model(x, x)
    assert model.aux_loss.requires_grad  # the loop adds it to the loss: it must stay attached
    (loss + model.aux_loss).backward()
    twin = copy.deepcopy(model)  # raised "Only Tensors created explicitly by the user..." before the fix
    assert float(twin.aux_loss) == 0.0 and not twin.experts._stats
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), twin.state_dict().values(), strict=True))
    _, again = twin(x, x)
    assert torch.equal(again, model(x, x)[1]) and twin.aux_loss.requires_grad


def test_a_wsd_run_with_expert_pools_forks_and_its_fork_equals_a_run_of_that_length(corpus):
    _, res = forks.train_model(CFG, WSD, corpus)
    assert res.status == "ok" and set(res.rung_losses) == {8, 16}
    alone = Recipe.from_dict({**WSD.to_dict(), "steps": 8, "rungs": [8]})
    _, short = forks.train_model(CFG, alone, corpus)
    assert res.rung_losses[8] == short.val_loss  # bitwise on CPU, as for any allocation


def test_a_climb_with_expert_pools_steps_up_every_rung(corpus):
    c = climb.start(CFG, WSD, corpus)
    assert c.climb() == {8: c.rung_losses[8], 16: c.rung_losses[16]} and c.failed is None
