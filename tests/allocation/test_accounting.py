"""Analytic accounting equals the built module, exactly, on random samples of every shipped space."""

from __future__ import annotations

from collections.abc import Callable

import optuna
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import npas
from npas.allocation.budget import count, stored_params
from npas.allocation.budget_scope import parse_budget
from npas.allocation.config import ArchConfig, Bank, Chassis, reference_config
from npas.allocation.space_parser import load_space
from npas.errors import BudgetError
from tests.conftest import SPACES

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Every mechanism at once, so the exactness property meets what the shipped spaces leave out: SwiGLU,
# the tie generator, explicit tying groups and explicit pools, per-position ranks, every dtype.
EVERYTHING = """
chassis: {vocab_size: 30, context: 16, d_model: 32, n_layers: 6, n_heads: 4, d_ff: 64, activation: [gelu, swiglu]}
budget: 0.5x
dtype: bfloat16
knobs:
  taper: {schedule: [uniform, cosine, hourglass], ratio: {low: 1.0, high: 3.0}}
  tying: {mode: [none, all, sequential, cycle, middle_loop, explicit], unique_blocks: {low: 2, high: 5},
          groups: [[0, 5], [1, 2], [3, 4]]}
  pools: {enabled: [false, true], rule: [by_type, by_type_and_shape, all, explicit], banks: {low: 1, high: 3},
          generator: [tie, slice, tile, template_mix, hash], templates: [1, 2, 3], groups: [[0, 1], [2, 3, 4]],
          tile: [4, 16]}
  relaxation: {rank: [0, 2, 4], targets: [attn, mlp, both], per_position: true, alpha: 8, scaling: rslora,
               sharing: [private, shared_a, vera, shards], shard_fraction: [0.25, 1.0], private_fraction: [0.0, 0.5],
               seed: 7}
  untied_norms: [true, false]
"""
SPACE_IDS = [p.stem for p in SPACES] + ["everything"]


def space_of(which: str):
    from npas.allocation.space_parser import parse_space

    return parse_space(EVERYTHING, "everything") if which == "everything" else load_space(
        next(p for p in SPACES if p.stem == which))


def sample(space, seed: int):
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    return space.sample(study.ask())


def check_exact(space, cand) -> None:
    """count == closed form == the fit's number == sum of numel of the built module (on the meta
    device: shapes without storage, so every sample is built, not just a few)."""
    with torch.device("meta"):
        model = npas.build_model(cand.config)
    acc = count(cand.config)
    assert acc.stored_params == sum(p.numel() for p in model.parameters()) == cand.fit.stored
    assert acc.param_bytes == sum(p.numel() * p.element_size() for p in model.parameters())
    assert stored_params(cand.config) == acc.stored_params  # the fit's closed form agrees
    assert acc.stored_params <= space.budget_params
    if not cand.fit.capped:
        # as close as the shapes allow: one more increment of the free size would break the budget
        assert space.budget_params - acc.stored_params < max(cand.fit.step, 1)
    assert sum(acc.layer_stored) == pytest.approx(acc.stored_params - acc.embedding_params
                                                  - cand.config.chassis.d_model, rel=1e-6)


def sample_checked(space, seed: int):
    """One random sample of space, checked exactly when feasible; an infeasible one must say why.
    The candidate comes back when feasible (None otherwise), for a caller to assert more about it."""
    cand = sample(space, seed)
    if not cand.feasible:
        assert isinstance(cand.reason, str) and cand.reason  # infeasible always says why
        return None
    check_exact(space, cand)
    return cand


def sweep(space, trials: int, features: Callable[[ArchConfig], set[str]]) -> tuple[int, set[str]]:
    """Ask one seeded random study `trials` times, check every feasible sample exactly, and gather
    features(config) over them: (how many were feasible, the union of their features), so a test can
    assert that the space reaches each combination it means to offer."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen, feasible = set(), 0
    for _ in range(trials):
        cand = space.sample(study.ask())
        if not cand.feasible:
            continue
        feasible += 1
        check_exact(space, cand)
        seen |= features(cand.config)
    return feasible, seen


@pytest.mark.parametrize("which", SPACE_IDS)
@SETTINGS
@given(seed=st.integers(0, 2**31 - 1))
def test_count_equals_built_model_and_fits_budget(which, seed):
    sample_checked(space_of(which), seed)


# measured at seed 0: full 144/150, recursive_lora 136 (middle_loop with U=2), shapeshifter 125 (tie
# banks above a 0.1x budget), taper 150, everything 141; the floors sit a little below
@pytest.mark.parametrize("which, floor", [("full", 0.9), ("recursive_lora", 0.85), ("shapeshifter", 0.75),
                                          ("taper", 0.99), ("everything", 0.85)])
def test_most_samples_are_feasible_and_every_mechanism_is_met(which, floor):
    # one seeded study of 150 trials per space: infeasible ones say why as text, and no more of them
    # than the floor allows (a regression in the fit shows up here as a collapse of the feasible share)
    space = space_of(which)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    feasible, seen = 0, set()
    for _ in range(150):
        trial = study.ask()
        cand = space.sample(trial)
        study.tell(trial, 0.0)
        if not cand.feasible:
            assert isinstance(cand.reason, str) and cand.reason
            continue
        feasible += 1
        check_exact(space, cand)
        cfg = cand.config
        seen |= {cfg.chassis.activation, *(b.generator for b in cfg.banks)}
        seen |= {"lora"} if any(cfg.lora_attn + cfg.lora_mlp) else set()
        seen |= {"tied"} if cfg.n_blocks < cfg.chassis.n_layers else set()
        seen |= {cfg.lora_sharing} if any(cfg.lora_attn + cfg.lora_mlp) else set()
        seen |= {"private_shards"} if cfg.lora_private_fraction > 0 else set()
    assert feasible / 150 >= floor, f"{which}: only {feasible}/150 samples feasible"
    if which == "everything":
        assert seen >= {"gelu", "swiglu", "tie", "slice", "tile", "template_mix", "hash", "lora", "tied"}, seen
    if which in ("everything", "recursive_lora", "full"):  # every sharing mode is counted exactly above
        assert seen >= {"private", "shared_a", "vera", "shards"}, seen
    if which in ("everything", "recursive_lora"):
        assert "private_shards" in seen, seen


@pytest.mark.parametrize("which", SPACE_IDS)
def test_sampled_models_build_and_run_for_real(which):
    # a few real (not meta) builds per space: the analytic count is what torch allocates and runs
    space = space_of(which)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    built = 0
    while built < 3:
        cand = space.sample(study.ask())
        if not cand.feasible:
            continue
        cfg = cand.config
        model = npas.build_model(cfg)
        assert model.num_params() == count(cfg).stored_params
        logits, _ = model(torch.randint(0, cfg.chassis.vocab_size, (1, 8)))
        assert torch.isfinite(logits.float()).all()
        built += 1


def test_tied_layers_share_parameter_objects_not_copies():
    ch = Chassis(vocab_size=20, context=16, d_model=16, n_layers=4, n_heads=2, d_ff=32)
    cfg = ArchConfig(chassis=ch, mlp_widths=(48, 32, 16, 32), block_of_layer=(0, 1, 0, 1))
    model = npas.build_model(cfg)
    weights = model.materialise()
    # both layers of block 0 read the same Parameter; the narrower one takes a nested slice (a view)
    assert weights[0]["mlp_up"] is model.blocks[0].mlp_up
    assert tuple(model.blocks[0].mlp_up.shape) == (48, 16)
    assert count(cfg).stored_params == model.num_params()
    # layers 0 and 2 both run on block 0's Parameter: no Parameter is registered under a second name
    # (so state dicts hold no aliases) and no two Parameters share storage (so no copy hides a tie)
    assert model.block_of_layer[0] == model.block_of_layer[2] == 0
    named = list(model.named_parameters(remove_duplicate=False))
    assert len(named) == len({id(p) for _, p in named}) == len({p.data_ptr() for _, p in named})
    idx = torch.randint(0, 20, (1, 8))
    model(idx)[0].sum().backward()
    g_both = model.blocks[0].mlp_up.grad.clone()  # gradients from both tied layers accumulate in one tensor
    model.zero_grad()
    model.h[2].width = 0  # layer 2 now reads an empty slice of block 0's mlp_up: only layer 0 contributes
    model(idx)[0].sum().backward()
    assert not torch.equal(g_both, model.blocks[0].mlp_up.grad)


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
    # analytic: a 175B-parameter chassis is counted without allocating a byte of it
    big = Chassis(vocab_size=50257, context=2048, d_model=12288, n_layers=96, n_heads=96, d_ff=4 * 12288)
    assert 174e9 < count(reference_config(big)).stored_params < 176e9


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


def test_gpu_memory_estimate_fuses_attention_and_halves_matmul_outputs_under_bf16():
    """On CUDA attention is fused (no T x T probabilities saved) and bf16 autocast saves matmul
    outputs in 2 bytes; the CPU estimate (fp32, probabilities kept) is unchanged by either knob."""
    from npas.allocation.config import Chassis, reference_config

    ch = Chassis(vocab_size=68, context=256, d_model=128, n_layers=4, n_heads=4, d_ff=512)
    cfg = reference_config(ch)
    B, T = 8, 256
    cpu = npas.count(cfg, batch_size=B, seq_len=T)
    assert npas.count(cfg, batch_size=B, seq_len=T, autocast="bfloat16").activation_bytes == cpu.activation_bytes
    fp32 = npas.count(cfg, batch_size=B, seq_len=T, device="cuda")
    bf16 = npas.count(cfg, batch_size=B, seq_len=T, device="cuda", autocast="bfloat16")
    probs, lse = 4 * B * ch.n_heads * T * T * ch.n_layers, 4 * B * ch.n_heads * T * ch.n_layers
    assert cpu.activation_bytes - fp32.activation_bytes == probs - lse
    # matmul outputs (q, k, v, attention out and the MLP's two widths per layer) at 2 bytes instead of 4
    matmul_elems = B * T * ch.n_layers * (4 * ch.d_model + 2 * ch.d_ff)
    assert fp32.activation_bytes - bf16.activation_bytes == 2 * matmul_elems
    assert bf16.stored_params == cpu.stored_params and bf16.train_memory_bytes < fp32.train_memory_bytes
