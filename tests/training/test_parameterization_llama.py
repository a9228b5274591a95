"""The fair parameterization's rules for a llama chassis' parameter kinds: RMSNorm gains, grouped-query
K/V projections, the untied output head."""

from __future__ import annotations

import pytest
import torch

import npas
from npas.allocation.config import ArchConfig, Chassis, reference_config
from npas.training.parameterization import apply_init, rules

LLAMA = dict(vocab_size=30, context=16, d_model=32, n_layers=4, n_heads=4, d_ff=48, activation="swiglu",
             family="llama", n_kv_heads=2, tie_embeddings=False)


def test_the_llama_reference_trains_at_the_base_rate_everywhere():
    # the reference's multipliers are all 1 and its init untouched: GQA's narrower K/V, RMSNorm gains and
    # the untied head each have a rule (none falls through to "other")
    model = npas.build_model(reference_config(Chassis(**LLAMA)))
    table = rules(model)
    assert {r.group for r in table.values()} == {"embedding", "matrix", "norm"}
    assert table["lm_head.weight"].group == "embedding" and table["h.0.ln_1.weight"].group == "norm"
    assert all(r.lr_mult == pytest.approx(1.0) and r.init_scale == pytest.approx(1.0) for r in table.values())
    before = {n: p.clone() for n, p in model.named_parameters()}
    apply_init(model)
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())


def test_gqa_key_value_projections_step_like_queries_by_their_fan_in():
    ref = Chassis(**LLAMA)
    narrow = Chassis(**{**LLAMA, "d_model": 16})  # head_dim 4: q (16, 16), k/v (8, 16), o (16, 16)
    cfg = ArchConfig(chassis=narrow, mlp_widths=(48,) * 4, block_of_layer=(0, 1, 0, 1))
    table = rules(npas.build_model(cfg), ref)
    q, k, v, o = (table[f"blocks.0.attn_{s}"] for s in "qkvo")
    # k and v read d_model like q (fan-in 16 vs the reference's 32): the same width factor and init scale
    assert k.lr_mult == pytest.approx(q.lr_mult) and v.lr_mult == pytest.approx(q.lr_mult)
    assert k.init_scale == pytest.approx(2**0.5) == q.init_scale
    assert o.init_scale == pytest.approx(2**0.5)  # o's fan-in n_heads x head_dim = 16 of the reference's 32
    # with head_dim explicit, q's width n_heads x head_dim stays the reference's while d_model narrows:
    # o reads that width (factor 1, init untouched), q, k and v read the narrower d_model
    wide_heads = ArchConfig(chassis=Chassis(**{**LLAMA, "d_model": 16, "head_dim": 8}), mlp_widths=(48,) * 4,
                            block_of_layer=(0, 1, 2, 3))
    t = rules(npas.build_model(wide_heads), ref)
    assert t["blocks.0.attn_o"].init_scale == pytest.approx(1.0) and t["blocks.0.attn_o"].lr_mult == pytest.approx(1.0)
    assert t["blocks.0.attn_k"].init_scale == pytest.approx(2**0.5) == t["blocks.0.attn_q"].init_scale
    # tied norms of a block read by two layers: the sharing rule, as for LayerNorm gains
    tied = ArchConfig(chassis=ref, mlp_widths=(48,) * 4, block_of_layer=(0, 1, 0, 1), untied_norms=False)
    assert rules(npas.build_model(tied))["blocks.0.ln_1.weight"].lr_mult == pytest.approx(2**-0.5)
