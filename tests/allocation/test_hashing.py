"""Hashed sharing (`generator: hash`): the mapping, its 1x point, its readers, its gradient, its stability."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest
import torch

import npas
from npas.allocation.budget import count, hash_step_bytes, reference_params, stored_params
from npas.allocation.config import ArchConfig, Bank, Chassis, block_slots, reference_config
from npas.allocation.fit import fit_banks
from npas.allocation.hashing import element_index, loads, mapping_checksum, tile_layout
from npas.allocation.layer_maps import bank_members
from npas.errors import ConfigError
from npas.training.parameterization import SHARING_EXPONENT, rules
from tests.conftest import ROOT

CH = Chassis(vocab_size=30, context=24, d_model=32, n_layers=3, n_heads=4, d_ff=80, activation="gelu")
GLOBAL = tuple((b, s) for b in range(3) for s in block_slots("gelu"))  # every slot of every block: one array
N = 3 * (4 * 32 * 32 + 2 * 32 * 80)  # the members' elements


def hashed(size: int, tile: int = 16, seed: int = 5, members=GLOBAL) -> ArchConfig:
    return ArchConfig(chassis=CH, mlp_widths=(80,) * 3, block_of_layer=(0, 1, 2),
                      banks=(Bank(members, "hash", size=size, tile=tile, seed=seed),))


def test_at_1x_the_mapping_is_a_signed_permutation_and_the_model_equals_a_dense_one_bitwise():
    index, sign = element_index(N, 16, N, 5)
    assert torch.equal(torch.sort(index).values, torch.arange(N))  # every array element read exactly once
    assert set(sign.tolist()) == {-1.0, 1.0}
    assert not torch.equal(index, torch.arange(N))  # a real permutation, not the identity
    torch.manual_seed(0)
    model = npas.build_model(hashed(N))
    dense = npas.build_model(reference_config(CH))
    assert model.num_params() == dense.num_params()
    with torch.no_grad():
        weights = model.materialise()
        for name, p in dense.named_parameters():
            if name.startswith("blocks."):
                _, b, slot = name.split(".")
                p.copy_(weights[int(b)][slot])
            else:
                p.copy_(dict(model.named_parameters())[name])
        idx = torch.randint(0, CH.vocab_size, (2, CH.context))
        assert torch.equal(model(idx)[0], dense(idx)[0])


def test_perturbing_one_array_element_changes_exactly_the_weights_hashed_to_it_in_every_layer():
    size = N // 10
    model = npas.build_model(hashed(size))
    index, sign = model.banks[0].element_index()
    j = int(index[12345])
    with torch.no_grad():
        before = torch.cat([w.reshape(-1) for w in model.banks[0].generate()])
        model.banks[0].weight[j] += 1.0
        after = torch.cat([w.reshape(-1) for w in model.banks[0].generate()])
    changed = (after != before).nonzero().flatten()
    assert torch.equal(changed, (index == j).nonzero().flatten())
    torch.testing.assert_close(after[changed] - before[changed], sign[changed], rtol=0, atol=1e-6)
    # the readers span layers: one global array feeds every block
    starts = torch.tensor([0] + [int(x) for x in torch.cumsum(torch.tensor([
        o * i for o, i in (CH.slot_shape(s, 80) for _, s in GLOBAL)]), 0)])
    blocks = {GLOBAL[int(torch.searchsorted(starts, int(p), right=True)) - 1][0] for p in changed}
    assert len(blocks) >= 2, blocks


@pytest.mark.parametrize("size", [N, N - 1, N // 2 + 7, N // 10, 16])
def test_loads_are_optimal_and_the_closed_form_is_exact(size):
    index, _ = element_index(N, 16, size, 3)
    counted = torch.bincount(index, minlength=size)
    assert torch.equal(counted, loads(N, size))
    assert int(counted.max() - counted.min()) <= 1  # floor(N/size) or ceil(N/size), never a hot spot


def test_the_array_gradient_is_the_mean_of_its_readers_signed_gradients():
    size = N // 7
    model = npas.build_model(hashed(size))
    bank = model.banks[0]
    flat = bank.flat()
    g = torch.randn_like(flat)
    (flat * g).sum().backward()
    index, sign = bank.element_index()
    summed = torch.zeros(size).index_add_(0, index, sign * g)
    torch.testing.assert_close(bank.weight.grad, summed / loads(N, size).float())


def test_the_mapping_is_a_pure_function_of_seed_and_shapes_across_processes_and_rng_states():
    torch.manual_seed(123)
    here = mapping_checksum(N, 16, N // 3, 42)
    torch.manual_seed(999)
    assert mapping_checksum(N, 16, N // 3, 42) == here
    code = ("import torch; torch.manual_seed(7); from npas.allocation.hashing import mapping_checksum; "
            f"print(mapping_checksum({N}, 16, {N // 3}, 42))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert int(out.stdout.strip()) == here
    assert mapping_checksum(N, 16, N // 3, 43) != here  # the seed matters
    # pinned: a change to the hash changes every hashed model's function (and every export of one)
    assert mapping_checksum(1000, 8, 300, 1) == 2135804731


def test_tiles_are_read_contiguously_and_the_partial_tile_goes_last():
    offsets, signs = tile_layout(100, 16, 40, 9)
    assert offsets.shape == signs.shape == (7,)
    assert int(offsets[-1]) == 6 * 16 % 40  # 6 full tiles laid first, the 4-element tail after them
    index, _ = element_index(100, 16, 40, 9)
    for t in range(7):
        run = index[16 * t: 16 * t + 16]
        assert torch.equal(run, (int(offsets[t]) + torch.arange(len(run))) % 40)


def test_a_hash_bank_round_trips_with_its_seed_and_other_banks_keep_their_files():
    cfg = hashed(N // 4, tile=8, seed=77)
    assert ArchConfig.from_yaml(cfg.to_yaml()) == cfg
    assert cfg.to_dict()["banks"][0]["seed"] == 77 and cfg.to_dict()["banks"][0]["tile"] == 8
    tie = ArchConfig(chassis=CH, mlp_widths=(80,) * 3, block_of_layer=(0, 1, 2),
                     banks=(Bank(((0, "mlp_up"), (1, "mlp_up")), "tie", size=80 * 32),))
    assert set(tie.to_dict()["banks"][0]) == {"members", "generator", "size", "templates"}


@pytest.mark.parametrize("bank, problem", [
    (Bank(GLOBAL, "hash", size=8, tile=16), "tile (16) <= size"),
    (Bank(GLOBAL, "hash", size=N + 1, tile=16), f"<= its members' elements ({N})"),
    (Bank(GLOBAL, "hash", size=N, tile=0), "needs a tile"),
    (Bank(GLOBAL, "hash", size=N, tile=16, seed=-1), "seed"),
    (Bank(((0, "mlp_up"), (1, "mlp_up")), "tie", size=80 * 32, tile=4), "only apply to generator hash"),
])
def test_bad_hash_banks_are_refused_naming_the_fix(bank, problem):
    with pytest.raises(ConfigError, match="banks\\[0\\]") as e:
        ArchConfig(chassis=CH, mlp_widths=(80,) * 3, block_of_layer=(0, 1, 2), banks=(bank,))
    assert problem in str(e.value)


# ---- accounting, budget fit, learning-rate rule --------------------------------------------------
REF64 = Chassis(vocab_size=68, context=64, d_model=64, n_layers=8, n_heads=4, d_ff=256)


@pytest.mark.parametrize("frac", [1.0, 0.5, 0.25, 0.1, 0.03])
@pytest.mark.parametrize("rule, banks", [("all", 1), ("by_type", 2)])
def test_count_equals_the_built_model_and_the_fit_meets_every_budget_exactly(frac, rule, banks):
    ref = reference_config(REF64)
    budget = int(frac * reference_params(REF64))
    fit = fit_banks(ref, bank_members(ref, rule, banks), "hash", budget, tile=32, seed=3)
    assert fit.config is not None, fit.reason
    assert stored_params(fit.config) == count(fit.config).stored_params == fit.stored == budget  # to the element
    assert npas.build_model(fit.config).num_params() == budget
    assert count(fit.config).flops_per_token == count(ref).flops_per_token  # the reference's shapes
    if frac == 1.0:  # the 1x point is the collision-free one
        assert all(b.size == sum(fit.config.member_numels(b)) for b in fit.config.banks)


def test_the_smallest_hashed_allocation_is_one_tile_per_bank_and_below_it_the_fit_says_why():
    ref = reference_config(REF64)
    members = bank_members(ref, "all", 1)
    fixed = reference_params(REF64) - sum(ref.member_numels(Bank(members[0], "tie", 1)))
    assert fit_banks(ref, members, "hash", fixed + 32, tile=32).stored == fixed + 32
    reason = fit_banks(ref, members, "hash", fixed + 31, tile=32).reason
    assert "one tile (32 elements)" in reason and "lower knobs.pools.tile" in reason


def test_training_memory_counts_the_materialised_view_and_the_gather():
    ref = reference_config(REF64)
    members = bank_members(ref, "all", 1)[0]
    n = sum(ref.member_numels(Bank(members, "tie", 1)))
    size = n // 10
    cfg = replace(ref, banks=(Bank(members, "hash", size=size, tile=32, seed=1),))
    same_stored = replace(ref, banks=(Bank(members, "slice", size=size),))  # materialises the same members
    extra = count(cfg).train_memory_bytes - count(same_stored).train_memory_bytes
    assert extra == hash_step_bytes(cfg) >= 4 * 2 * n + 4 * n  # gathered tiles and their grad, the index
    assert count(cfg).train_memory_bytes >= 16 * size + 8 * n  # weights + AdamW, and the view + its grad


def test_the_fair_rule_reads_a_hashed_array_as_a_bank_read_k_times_per_element():
    for frac in (1.0, 0.25):
        ref = reference_config(REF64)
        members = bank_members(ref, "all", 1)[0]
        n = sum(ref.member_numels(Bank(members, "tie", 1)))
        cfg = replace(ref, banks=(Bank(members, "hash", size=int(frac * n), tile=32),))
        rule = rules(npas.build_model(cfg))["banks.0.weight"]
        # the reference's shapes: w = 1, d = 1, so the multiplier is the sharing count's alone; 1 at 1x
        assert rule.group == "bank" and rule.init_scale == 1.0
        assert rule.lr_mult == pytest.approx((n / int(frac * n)) ** -SHARING_EXPONENT)


def test_load_scaling_never_changes_the_adam_step_a_second_time():
    """The fair rule sets the array's step; the gradient's load scaling is divided out by AdamW (it only
    changes what global-norm clipping sees), so the step with and without it is the same."""
    cfg = hashed(N // 5)
    steps = []
    for scaled in (True, False):
        torch.manual_seed(0)
        model = npas.build_model(cfg)
        if not scaled:
            model.banks[0].inv_load = None
        before = model.banks[0].weight.detach().clone()
        # eps far below every gradient: Adam's m / (sqrt(v) + eps) is then scale-free per element (at
        # the default 1e-8 the few elements with gradients near eps differ slightly: that is all eps does)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0, eps=1e-30)
        idx = torch.randint(0, CH.vocab_size, (2, CH.context))
        model(idx, idx)[1].backward()
        grad = model.banks[0].weight.grad.clone()
        opt.step()
        steps.append((model.banks[0].weight.detach() - before, grad))
    (with_scaling, g1), (without, g0) = steps
    assert not torch.allclose(g1, g0)  # the gradients differ (mean vs sum of the readers')...
    torch.testing.assert_close(with_scaling, without, rtol=0, atol=1e-7)  # ...the Adam step does not


def test_each_member_starts_at_its_own_slots_init_std_as_in_the_untied_model():
    torch.manual_seed(0)
    model = npas.build_model(hashed(N))  # collision-free: one reader per element
    dense = npas.build_model(reference_config(CH))
    weights = model.materialise()
    for b, slot in GLOBAL:
        want = float(dense.blocks[b].get_parameter(slot).std())
        assert abs(float(weights[b][slot].std()) / want - 1) < 0.1, (b, slot)
    resid, other = float(weights[0]["attn_o"].std()), float(weights[0]["attn_q"].std())
    assert resid < 0.5 * other  # residual projections start smaller (0.02 / sqrt(2 L)), as the reference's
