"""A proxy run of a per-token recursion allocation: it trains with its router losses through the one
Trainer, reports its losses under the causal rule, and reports the training rule's loss beside them."""

from __future__ import annotations

import pytest
import torch

from npas.allocation.config import Chassis
from npas.allocation.recursion import RecursionSpec
from npas.allocation.recursion_allocation import recursion_config
from npas.allocation.transformer import build_model
from npas.training.data import load_corpus
from npas.training.forks import run_proxy
from npas.training.parameterization import rules
from npas.training.proxy import ProxyResult
from npas.training.recipe import Recipe

CHASSIS = Chassis(vocab_size=68, context=64, d_model=32, n_layers=6, n_heads=4, d_ff=64)
MOR = recursion_config(CHASSIS, RecursionSpec(steps=3, stack=2, capacities=(1.0, 0.5, 0.25), aux_weight=0.01))
QUICK = Recipe(name="quick", seq_len=32, batch_size=8, steps=30, lr=1e-2, min_lr=1e-3, warmup_steps=5,
               eval_every=10, eval_batches=2, threads=1)


@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


def test_a_recursion_run_reports_both_rules_and_the_realised_depth(corpus):
    res = run_proxy(MOR, QUICK, corpus)
    assert res.status == "ok"
    rec = res.recursion
    assert rec["causal_rule_loss"] == pytest.approx(res.val_loss)  # what npas reports is the causal rule
    assert rec["train_rule_loss"] != rec["causal_rule_loss"]
    assert len(rec["step_share"]) == 3 and rec["step_share"][0] == 1.0
    assert 1.0 <= rec["realised_depth"] <= 3.0
    assert res.flops_per_token == rec["flops_per_token"]
    assert ProxyResult.from_dict(res.to_dict()) == res


def test_the_router_and_the_stack_have_fair_rules():
    model = build_model(MOR)
    table = rules(model)
    assert table["recursion.router"].group == "router"
    plain = build_model(recursion_config(CHASSIS, RecursionSpec(steps=3, stack=2)))
    # the stack is read by fewer tokens at capacities below 1: a smaller sharing count, a larger step
    assert table["blocks.0.attn_q"].lr_mult > rules(plain)["blocks.0.attn_q"].lr_mult


def test_a_trial_stores_the_seed_means_and_its_front_reads_the_realised_costs():
    from npas.service.execution.outcome import combine_repeats, objective_values

    def run(loss: float, depth: float, kv: int) -> dict:
        return {"val_loss": loss, "train_loss": loss, "tokens_per_s": 1.0, "steps_done": 10, "wall_s": 1.0,
                "curve": [[10, loss]], "flops_per_token": 100,
                "recursion": {"causal_rule_loss": loss, "train_rule_loss": loss - 0.1, "step_share": [1.0, depth - 1],
                              "realised_depth": depth, "flops_per_token": 100 * depth, "kv_cache_bytes_per_token": kv}}

    rec = combine_repeats([run(2.0, 1.5, 100), run(3.0, 1.7, 140)], [0, 1])
    assert rec["recursion"]["realised_depth"] == pytest.approx(1.6)
    assert rec["recursion"]["step_share"] == pytest.approx([1.0, 0.6])
    assert rec["flops_per_token"] == 160
    accounting = {"flops_per_token": 999, "kv_cache_bytes_per_token": 999}
    assert objective_values(["flops_per_token", "kv_cache_bytes_per_token"], accounting, rec, 2.5) == [160, 120]


def test_sampling_a_recursion_model_decodes_with_the_causal_rule(corpus):
    from npas.training.train import sample

    torch.manual_seed(0)
    model = build_model(MOR)
    model.train()  # sample switches to evaluation (the causal rule) and back
    text = sample(model, corpus.tokenizer, "To be", tokens=6, temperature=0)
    assert len(corpus.tokenizer.encode(text)) == 6 and model.training
    # greedy decoding by the full prefix: the last token's logits of the whole text equal its prefix's run
    ids = torch.tensor([corpus.tokenizer.encode("To be" + text)])
    model.eval()
    with torch.no_grad():
        full, prefix = model(ids)[0], model(ids[:, :-1])[0]
    assert (full[:, :-1] - prefix).abs().max() < 1e-5
