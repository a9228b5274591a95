"""Cross-layer KV sharing and MASA attention atoms: the real mechanism, counted exactly, rebuilt exactly."""

from __future__ import annotations

import optuna
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import npas
from npas.allocation.budget import count, stored_params
from npas.allocation.config import ArchConfig, AtomSpec, Bank, Chassis
from npas.allocation.space_parser import parse_space
from npas.errors import ConfigError
from tests.allocation.test_accounting import SETTINGS, sample_checked, sweep
from tests.conftest import check_export_round_trip, small_space, space_refusal

CH = Chassis(vocab_size=20, context=16, d_model=16, n_layers=6, n_heads=2, d_ff=32)

# KV sharing and atoms composed with everything else they may meet: tying, pools, LoRA, SwiGLU, tapers
MECHANISMS = small_space("""
    taper: {schedule: [uniform, cosine]}
    tying: {mode: [none, all, sequential, cycle], unique_blocks: {low: 2, high: 4}}
    pools: {enabled: [false, true], rule: [by_type, all], banks: {low: 1, high: 2},
            generator: [tie, slice, tile, template_mix], templates: [1, 2]}
    relaxation: {rank: [0, 2], targets: [attn, mlp, both]}
    kv_sharing: {group: {low: 1, high: 6}, mode: [kv, v]}
    atoms: {slots: [none, qkvo, qk, kv, o], count: {low: 1, high: 4}, scope: [layer, block]}
""", composed=True)


def cfg_of(**kw) -> ArchConfig:
    kw.setdefault("block_of_layer", tuple(range(CH.n_layers)))
    return ArchConfig(chassis=CH, mlp_widths=(32,) * CH.n_layers, **kw)


def direct_slots(model, block: int) -> set[str]:
    return {n for n, _ in model.blocks[block].named_parameters(recurse=False) if n.startswith("attn")}


# ---- KV sharing -----------------------------------------------------------------------------
@pytest.mark.parametrize("mode, dropped", [("kv", {"attn_k", "attn_v"}), ("v", {"attn_v"})])
def test_consumer_layers_own_no_kv_projections(mode, dropped):
    cfg = cfg_of(kv_source=(0, 0, 0, 3, 3, 3), kv_mode=mode)
    model = npas.build_model(cfg)
    full = {"attn_q", "attn_k", "attn_v", "attn_o"}
    for i in range(6):
        assert direct_slots(model, i) == (full if i in (0, 3) else full - dropped), i
    names = set(model.state_dict())
    assert "blocks.1.attn_v" not in names and "blocks.0.attn_v" in names
    d = CH.d_model
    assert stored_params(cfg) == stored_params(cfg_of()) - 4 * len(dropped) * d * d  # 4 consumers
    assert model.num_params() == count(cfg).stored_params


def _consumer_output(model, perturb: str | None, x_fixed: torch.Tensor | None, layer: int = 1):
    """Run the model with layer `layer`'s input replaced by `x_fixed`, so the only way a change in
    another layer reaches this layer's output is through the K/V it is handed."""
    out = {}

    def pre(mod, args):
        out["x"] = args[0]
        return (x_fixed, *args[1:]) if x_fixed is not None else None

    def post(mod, args, result):
        out["y"] = result[0]

    h1 = model.h[layer].register_forward_pre_hook(pre)
    h2 = model.h[layer].register_forward_hook(post)
    try:
        with torch.no_grad():
            # a random change (a constant one would vanish: LayerNorm outputs sum to zero)
            delta = torch.randn(model.get_parameter(perturb).shape) if perturb else None
            if perturb:
                model.get_parameter(perturb).add_(delta)
            model(torch.arange(12).view(1, 12) % CH.vocab_size)
            if perturb:
                model.get_parameter(perturb).sub_(delta)
    finally:
        h1.remove()
        h2.remove()
    return out


@pytest.mark.parametrize("mode", ["kv", "v"])
def test_perturbing_the_source_projection_changes_the_consumer(mode):
    torch.manual_seed(0)
    model = npas.build_model(cfg_of(kv_source=(0, 0, 2, 2, 4, 4), kv_mode=mode))
    base = _consumer_output(model, None, None)
    x, y = base["x"], base["y"]
    assert torch.equal(_consumer_output(model, None, x)["y"], y)  # the hook itself changes nothing
    # the source's V always reaches the consumer; its K only when keys are shared too
    assert not torch.allclose(_consumer_output(model, "blocks.0.attn_v", x)["y"], y)
    k_changed = not torch.allclose(_consumer_output(model, "blocks.0.attn_k", x)["y"], y)
    assert k_changed == (mode == "kv")
    # a layer that is not its source does not reach it with the consumer's input held fixed
    assert torch.allclose(_consumer_output(model, "blocks.2.attn_v", x)["y"], y)


def test_unshared_kv_layer_is_unaffected_by_its_neighbour():
    # control for the test above: without sharing, layer 0's K/V cannot reach layer 1 with its input held fixed
    torch.manual_seed(0)
    model = npas.build_model(cfg_of())
    base = _consumer_output(model, None, None)
    assert torch.allclose(_consumer_output(model, "blocks.0.attn_v", base["x"])["y"], base["y"])


@pytest.mark.parametrize("g", [1, 2, 3, 6])
def test_kv_cache_per_token_divides_by_the_group(g):
    kv1 = count(cfg_of()).kv_cache_bytes_per_token
    src = tuple(i // g * g for i in range(6))
    acc = count(cfg_of(kv_source=src))
    assert acc.kv_cache_bytes_per_token * g == kv1 == 2 * 6 * CH.d_model * 4
    assert acc.inference_bytes == acc.param_bytes + acc.kv_cache_bytes_per_token * CH.context
    v_only = count(cfg_of(kv_source=src, kv_mode="v")).kv_cache_bytes_per_token
    assert v_only == (6 + 6 // g) * CH.d_model * 4  # every layer's K, the sources' V


def test_kv_cache_is_an_objective_the_search_can_trade():
    space = parse_space(MECHANISMS.replace("budget: 0.5x", "budget: 0.5x\nobjectives: [val_loss, "
                                                            "kv_cache_bytes_per_token]"))
    assert space.objectives == ("val_loss", "kv_cache_bytes_per_token")


def test_consumer_flops_skip_the_kv_projections():
    d = CH.d_model
    shared, plain = count(cfg_of(kv_source=(0, 0, 2, 2, 4, 4))), count(cfg_of())
    assert plain.flops_per_token - shared.flops_per_token == 3 * 2 * 2 * d * d  # 3 consumers x (K, V)


@pytest.mark.parametrize("change, fragment", [
    ({"kv_source": (0, 2, 2, 3, 4, 5)}, "kv_source"),
    ({"kv_source": (0, 0, 1, 3, 4, 5)}, "kv_source"),  # layer 1 is a consumer, not a source
    ({"kv_source": (0, 0, 2, 3, 4, 5), "kv_mode": "k"}, "kv_mode"),
    ({"atoms": (AtomSpec("mlp_up", 2),)}, "atoms[0].slot"),
    ({"atoms": (AtomSpec("attn_q", 0),)}, "n_atoms"),
    ({"atoms": (AtomSpec("attn_q", 2, "row"),)}, "scope"),
    ({"kv_source": (0, 0, 2, 3, 4, 5), "banks": (Bank(((0, "attn_v"), (1, "attn_v")), "tie", 256),)},
     "not stored by its block"),
    ({"atoms": (AtomSpec("attn_q", 2),), "banks": (Bank(((0, "attn_q"), (1, "attn_q")), "tie", 256),)},
     "not stored by its block"),
])
def test_invalid_sharing_names_the_problem(change, fragment):
    with pytest.raises(ConfigError, match=None) as e:
        cfg_of(**change)
    assert fragment in str(e.value)


def test_tied_consumer_keeps_the_kv_its_block_holds_for_a_source():
    # cycle tying ABAB with groups of 2: layer 0 (block A) is a source, layer 2 (block A) is a source,
    # layers 1, 3 (block B) are consumers only -> block B stores no K/V, block A does
    cfg = cfg_of(block_of_layer=(0, 1, 0, 1, 0, 1), kv_source=(0, 0, 2, 2, 4, 4))
    model = npas.build_model(cfg)
    assert direct_slots(model, 0) == {"attn_q", "attn_k", "attn_v", "attn_o"}
    assert direct_slots(model, 1) == {"attn_q", "attn_o"}
    assert model.num_params() == count(cfg).stored_params
    # groups of 3 over ABAB: block B holds layer 3 (a source), so it keeps K/V that layers 1 and 5 do not read
    cfg = cfg_of(block_of_layer=(0, 1, 0, 1, 0, 1), kv_source=(0, 0, 0, 3, 3, 3))
    assert direct_slots(npas.build_model(cfg), 1) == {"attn_q", "attn_k", "attn_v", "attn_o"}


# ---- atoms ----------------------------------------------------------------------------------
def test_one_dictionary_per_projection_type_with_l_by_k_coefficients():
    atoms = tuple(AtomSpec(s, 3) for s in ("attn_q", "attn_k", "attn_v", "attn_o"))
    cfg = cfg_of(atoms=atoms)
    model = npas.build_model(cfg)
    d, L = CH.d_model, CH.n_layers
    assert set(model.atoms) == {"attn_q", "attn_k", "attn_v", "attn_o"}
    for slot, dic in model.atoms.items():
        assert dic.atoms.shape == (3, d, d) and dic.coef.shape == (L, 3), slot
    assert all(not direct_slots(model, b) for b in range(L))  # no layer owns a direct attention weight
    acc = count(cfg)
    assert acc.atom_params == 4 * (3 * d * d + L * 3)
    assert acc.stored_params == stored_params(cfg_of()) - 4 * L * d * d + acc.atom_params == model.num_params()
    # block scope: coefficients shared like the blocks (U rows)
    blk = cfg_of(block_of_layer=(0, 1, 0, 1, 0, 1), atoms=(AtomSpec("attn_q", 2, "block"),))
    assert npas.build_model(blk).atoms["attn_q"].coef.shape == (2, 2)
    assert count(blk).atom_params == 2 * d * d + 2 * 2


def test_a_layer_computes_with_the_combination_of_atoms():
    # the atom model equals a dense model whose layer i weight is sum_k coef[i, k] atoms[k]
    torch.manual_seed(0)
    cfg = cfg_of(atoms=(AtomSpec("attn_q", 2), AtomSpec("attn_o", 3)))
    model = npas.build_model(cfg)
    dense = npas.build_model(cfg_of())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.startswith("atoms."):
                dense.get_parameter(name).copy_(p)
        for slot, dic in model.atoms.items():
            for i in range(CH.n_layers):
                w = torch.einsum("k,kij->ij", dic.coef[i], dic.atoms)
                dense.blocks[i].get_parameter(slot).copy_(w)
        x = torch.randint(0, CH.vocab_size, (2, 10))
        assert torch.allclose(model(x)[0], dense(x)[0], atol=1e-5)
        model.atoms["attn_q"].coef[3, 0] += 1.0  # one layer's coefficient changes that layer's weight
        assert not torch.allclose(model(x)[0], dense(x)[0], atol=1e-5)


def test_gradients_reach_atoms_and_coefficients():
    torch.manual_seed(0)
    cfg = cfg_of(block_of_layer=(0, 1, 0, 1, 0, 1), kv_source=(0, 0, 2, 2, 4, 4),
                 atoms=(AtomSpec("attn_k", 2), AtomSpec("attn_o", 2, "block")))
    model = npas.build_model(cfg)
    x = torch.randint(0, CH.vocab_size, (2, 10))
    model(x, x)[1].backward()
    for name, p in model.named_parameters():
        if name.startswith("atoms."):
            assert p.grad is not None and p.grad.abs().sum() > 0, name
    # attn_k atoms have rows only for the layers that compute their own keys (the KV sources)
    assert model.atoms["attn_k"].coef.shape == (3, 2)


# ---- both, through the space ----------------------------------------------------------------
@SETTINGS
@given(seed=st.integers(0, 2**31 - 1))
def test_count_equals_built_model_with_kv_sharing_and_atoms(seed):
    sample_checked(parse_space(MECHANISMS, "mechanisms"), seed)


def test_the_space_reaches_every_combination():
    def features(cfg: ArchConfig) -> set[str]:
        consumers = [i for i in range(6) if cfg.kv_consumer(i)]
        seen = {f"atoms_{a.scope}" for a in cfg.atoms}
        seen |= {f"kv_{cfg.kv_mode}"} if consumers else set()
        seen |= {"banks+atoms"} if cfg.banks and cfg.atoms else set()
        return seen | ({"tied+kv"} if consumers and cfg.n_blocks < 6 else set())

    feasible, seen = sweep(parse_space(MECHANISMS, "mechanisms"), 120, features)
    assert feasible >= 100
    assert seen >= {"kv_kv", "kv_v", "atoms_layer", "atoms_block", "banks+atoms", "tied+kv"}, seen


def test_export_round_trip_rebuilds_exactly(tmp_path):
    check_export_round_trip(cfg_of(block_of_layer=(0, 1, 0, 1, 0, 1), kv_source=(0, 0, 0, 3, 3, 3), kv_mode="v",
                                   atoms=(AtomSpec("attn_q", 2), AtomSpec("attn_v", 3, "block")),
                                   lora_attn=(0, 0, 2, 2, 2, 2)), tmp_path)


def test_allocations_without_the_mechanisms_keep_their_files():
    # kv_source / kv_mode / atoms are left out at their defaults: older files, hashes and exports stand
    d = cfg_of().to_dict()
    assert not {"kv_source", "kv_mode", "atoms"} & set(d)
    assert {"kv_source", "kv_mode"} <= set(cfg_of(kv_source=(0, 0, 2, 3, 4, 5)).to_dict())
    assert cfg_of(kv_source=(0, 1, 2, 3, 4, 5), kv_mode="v") == cfg_of()  # nothing shared: one canonical form


def test_baselines_are_unshared_and_atom_free():
    space = parse_space(MECHANISMS.replace("slots: [none, qkvo, qk, kv, o]", "slots: [qkvo]")
                        .replace("group: {low: 1, high: 6}", "group: [3]"), "m")
    study = optuna.create_study()
    for name, fixed in space.baselines().items():
        cand = space.sample(study.ask(), fixed=fixed)
        assert cand.feasible, name
        assert not cand.config.atoms and not any(cand.config.kv_consumer(i) for i in range(6)), name
    assert "cycle_tying" in space.baselines()  # the natural baseline of atoms


@pytest.mark.parametrize("knobs, fragment", [
    ("atoms: {slots: [qk], count: 2, fraction: 0.5}", "count or fraction, not both"),
    ("kv_sharing: {group: [1, 7]}", "knobs.kv_sharing.group"),
    ("kv_sharing: {mode: [kv, k]}", "knobs.kv_sharing.mode"),
    ("atoms: {slots: [qx]}", "knobs.atoms.slots"),
])
def test_bad_mechanism_knobs_are_refused(knobs, fragment):
    assert fragment in str(space_refusal(small_space(knobs)))


def test_atom_fraction_sets_k_from_the_depth():
    cand = parse_space(small_space("atoms: {slots: [qkvo], fraction: 0.5}")).sample(optuna.create_study().ask())
    assert {a.n_atoms for a in cand.config.atoms} == {3}
