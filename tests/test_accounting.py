"""Analytic accounting equals the built module, exactly, on random samples of every shipped space."""

from __future__ import annotations

import optuna
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import npas
from npas.allocation.budget import count, parse_budget, stored_params
from npas.allocation.config import ArchConfig, Bank, Chassis, reference_config
from npas.allocation.space import load_space
from npas.errors import BudgetError

from .conftest import SPACES

SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def sample(space, seed: int):
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    return space.sample(study.ask())


@pytest.mark.parametrize("path", SPACES, ids=lambda p: p.stem)
@SETTINGS
@given(seed=st.integers(0, 2**31 - 1))
def test_count_equals_built_model_and_fits_budget(path, seed):
    space = load_space(path)
    cand = sample(space, seed)
    if not cand.feasible:
        assert cand.reason  # infeasible always says why
        return
    model = npas.build_model(cand.config)
    acc = count(cand.config)
    assert acc.stored_params == sum(p.numel() for p in model.parameters()) == cand.fit.stored
    assert stored_params(cand.config) == acc.stored_params  # the fit's closed form agrees
    assert acc.stored_params <= space.budget_params
    if not cand.fit.capped:
        # as close as the shapes allow: one more increment of the free size would break the budget
        assert space.budget_params - acc.stored_params < max(cand.fit.step, 1)
    assert acc.param_bytes == acc.stored_params * 4
    assert sum(acc.layer_stored) == pytest.approx(acc.stored_params - acc.embedding_params
                                                  - cand.config.chassis.d_model, rel=1e-6)


def test_tied_layers_share_parameter_objects_not_copies():
    ch = Chassis(vocab_size=20, context=16, d_model=16, n_layers=4, n_heads=2, d_ff=32)
    cfg = ArchConfig(chassis=ch, mlp_widths=(48, 32, 16, 32), block_of_layer=(0, 1, 0, 1))
    model = npas.build_model(cfg)
    weights = model.materialise()
    # both layers of block 0 read the same Parameter; the narrower one takes a nested slice (a view)
    assert weights[0]["mlp_up"] is model.blocks[0].mlp_up
    assert tuple(model.blocks[0].mlp_up.shape) == (48, 16)
    assert count(cfg).stored_params == model.num_params()
    # named_parameters() would list a copy twice; de-duplicated .parameters() lists each tensor once
    assert len(list(model.parameters())) == len({id(p) for p in model.parameters()})


def test_materialised_exceeds_stored_when_sharing():
    ch = Chassis(vocab_size=20, context=16, d_model=16, n_layers=4, n_heads=2, d_ff=32)
    tied = ArchConfig(chassis=ch, mlp_widths=(32,) * 4, block_of_layer=(0,) * 4)
    ref = reference_config(ch)
    assert count(tied).materialised_params == count(ref).materialised_params
    assert count(tied).stored_params < count(ref).stored_params
    assert count(tied).flops_per_token == count(ref).flops_per_token


def test_template_mix_counts_coefficients():
    ch = Chassis(vocab_size=20, context=16, d_model=16, n_layers=2, n_heads=2, d_ff=32)
    bank = Bank(((0, "mlp_up"), (1, "mlp_up")), "template_mix", size=100, templates=3)
    cfg = ArchConfig(chassis=ch, mlp_widths=(32, 32), block_of_layer=(0, 1), banks=(bank,))
    acc = count(cfg)
    assert acc.bank_params == 3 * 100 + 2 * 3
    assert acc.generation_flops_per_step == 2 * 2 * 3 * 100
    assert acc.stored_params == npas.build_model(cfg).num_params()


@pytest.mark.parametrize("spec, expected", [("1.5M", 1_500_000), ("250k", 250_000), ("0.25x", 250), ("2x", 2000),
                                            (1200, 1200), ("1e3", 1000)])
def test_parse_budget(spec, expected):
    assert parse_budget(spec, 1000) == expected


@pytest.mark.parametrize("spec", ["lots", "0.25y", "-1x", "0x", True])
def test_parse_budget_rejects(spec):
    with pytest.raises(BudgetError, match="budget"):
        parse_budget(spec, 1000)


def test_kv_cache_and_flops_scale_with_depth():
    ch = Chassis(vocab_size=20, context=16, d_model=16, n_layers=2, n_heads=2, d_ff=32)
    deeper = Chassis(vocab_size=20, context=16, d_model=16, n_layers=4, n_heads=2, d_ff=32)
    a, b = count(reference_config(ch)), count(reference_config(deeper))
    assert b.kv_cache_bytes_per_token == 2 * a.kv_cache_bytes_per_token == 2 * 4 * 16 * 4  # K and V, 4 layers, d=16, fp32
    head = 2 * 20 * 16
    assert b.flops_per_token - head == 2 * (a.flops_per_token - head)
    assert torch.is_tensor(torch.zeros(1))  # torch imports alongside accounting without building anything


def test_lora_is_merged_per_step_so_per_token_flops_match_the_untied_model():
    ch = Chassis(vocab_size=20, context=16, d_model=16, n_layers=4, n_heads=2, d_ff=32)
    relaxed = ArchConfig(chassis=ch, mlp_widths=(32,) * 4, block_of_layer=(0, 1, 0, 1), lora_attn=(4,) * 4,
                         lora_mlp=(0, 2, 0, 2))
    ref, acc = count(reference_config(ch)), count(relaxed)
    assert acc.flops_per_token == ref.flops_per_token
    per_layer_attn = 2 * 4 * (3 * 16 * 16 + 16 * 16)
    per_layer_mlp = 2 * 2 * (32 * 16 + 16 * 32)
    assert acc.generation_flops_per_step == 4 * per_layer_attn + 2 * per_layer_mlp
    assert acc.lora_params == 4 * 4 * 4 * (16 + 16) + 2 * 2 * 2 * (16 + 32)  # q, k, v, o: r * (d + d) each
