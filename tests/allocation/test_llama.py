"""The llama chassis family: Hugging Face Llama's forward, exact accounting for every mechanism on it,
and classic allocations left exactly as they were."""

from __future__ import annotations

import math
import re

import optuna
import pytest
import torch
import torch.nn.functional as F
import yaml

import npas
from npas.allocation.budget import count, stored_params
from npas.allocation.budget_scope import embedding_params
from npas.allocation.config import ArchConfig, AtomSpec, Bank, Chassis, ExpertPool, reference_config
from npas.allocation.space_parser import load_space, parse_space
from npas.errors import ConfigError
from tests.allocation.test_accounting import check_exact
from tests.conftest import SPACES

LLAMA = dict(vocab_size=30, context=16, d_model=32, n_layers=4, n_heads=4, d_ff=48, activation="swiglu",
             family="llama", n_kv_heads=2, rope_theta=500.0, rms_norm_eps=1e-5)


def chassis(**kw) -> Chassis:
    return Chassis(**{**LLAMA, **kw})


# ---- the forward pass against an independent computation ----------------------------------------
def rms(x, w, eps):
    return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def rotate(x, theta):
    """Rotary embedding written as complex rotations: channel i pairs with i + hd/2 (HF's rotate_half
    layout) and turns by position * theta^(-2i/hd)."""
    T, hd = x.shape[-2], x.shape[-1]
    i = torch.arange(hd // 2, dtype=torch.float64)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * theta ** (-2 * i / hd)  # (T, hd/2)
    z = torch.complex(x[..., : hd // 2].double(), x[..., hd // 2:].double()) * torch.polar(torch.ones_like(angle), angle)
    return torch.cat([z.real, z.imag], -1).to(x.dtype)


def reference_logits(model, idx):
    """Llama's forward from the model's weights, by name, without npas' layer code: RMSNorm, rotary q/k,
    grouped K/V heads repeat_interleave'd to the query heads, causal softmax attention, SwiGLU."""
    c = model.cfg.chassis
    p = dict(model.named_parameters())
    B, T = idx.shape
    x = p["wte.weight"][idx]
    hd, H, G = c.head_size, c.n_heads, c.kv_heads
    for i in range(c.n_layers):
        b = model.cfg.block_of_layer[i]
        w = {s: p[f"blocks.{b}.{s}"] for s in ("attn_q", "attn_k", "attn_v", "attn_o", "mlp_gate", "mlp_up", "mlp_down")}
        h = rms(x, p[f"h.{i}.ln_1.weight"], c.rms_norm_eps)
        q = (h @ w["attn_q"].T).view(B, T, H, hd).transpose(1, 2)
        k = (h @ w["attn_k"].T).view(B, T, G, hd).transpose(1, 2)
        v = (h @ w["attn_v"].T).view(B, T, G, hd).transpose(1, 2)
        q, k = rotate(q, c.rope_theta), rotate(k, c.rope_theta)
        k, v = k.repeat_interleave(H // G, dim=1), v.repeat_interleave(H // G, dim=1)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf")).softmax(-1)
        x = x + (att @ v).transpose(1, 2).reshape(B, T, H * hd) @ w["attn_o"].T
        h = rms(x, p[f"h.{i}.ln_2.weight"], c.rms_norm_eps)
        x = x + (F.silu(h @ w["mlp_gate"].T) * (h @ w["mlp_up"].T)) @ w["mlp_down"].T
    head = p["wte.weight"] if c.tie_embeddings else p["lm_head.weight"]
    return rms(x, p["ln_f.weight"], c.rms_norm_eps) @ head.T


@pytest.mark.parametrize("kw", [{}, {"tie_embeddings": False}, {"n_kv_heads": 1, "head_dim": 6},
                                {"n_kv_heads": 4}])
def test_llama_forward_matches_an_independent_reference(kw):
    torch.manual_seed(0)
    model = npas.build_model(reference_config(chassis(**kw)))
    with torch.no_grad():  # norm gains away from 1, so a skipped gain would show
        for name, p in model.named_parameters():
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
                p.uniform_(0.5, 1.5)
    idx = torch.randint(0, 30, (2, 12))
    got, _ = model(idx)
    want = reference_logits(model, idx)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-4), (got - want).abs().max()


def test_rotary_positions_are_relative_and_there_is_no_position_table():
    # a llama model has no wpe; the same tokens shifted in position attend the same way (rotary
    # scores depend on offsets only), which the classic chassis' learned table would not give
    torch.manual_seed(0)
    model = npas.build_model(reference_config(chassis()))
    assert not hasattr(model, "wpe") and "wpe.weight" not in model.state_dict()
    names = {n for n, _ in model.named_parameters()}
    assert {"blocks.0.attn_k", "h.0.ln_1.weight", "ln_f.weight", "wte.weight"} <= names
    assert tuple(model.blocks[0].attn_k.shape) == (2 * 8, 32) and tuple(model.blocks[0].attn_o.shape) == (32, 32)


# ---- accounting -----------------------------------------------------------------------------------
def test_gqa_shapes_kv_cache_and_embeddings_are_counted():
    ch = chassis(tie_embeddings=False)
    cfg = reference_config(ch)
    acc = count(cfg)
    d, kv, L, V = 32, 16, 4, 30  # kv = 2 heads x head_dim 8
    per_layer = d * d + 2 * kv * d + d * d + 3 * d * 48 + 2 * d
    assert acc.stored_params == 2 * V * d + L * per_layer + d == npas.build_model(cfg).num_params()
    assert acc.embedding_params == embedding_params(ch) == 2 * V * d  # token embedding + untied head, no table
    assert acc.kv_cache_bytes_per_token == L * 2 * kv * 4  # K and V of n_kv_heads x head_dim, fp32
    shared = ArchConfig(chassis=ch, mlp_widths=(48,) * L, block_of_layer=tuple(range(L)), kv_source=(0, 0, 2, 2))
    assert count(shared).kv_cache_bytes_per_token == acc.kv_cache_bytes_per_token // 2
    assert count(shared).stored_params == stored_params(shared) == npas.build_model(shared).num_params()


MECHANISMS = {
    "tied_lora": dict(block_of_layer=(0, 1, 0, 1), lora_attn=(4, 2, 4, 2), lora_mlp=(0, 3, 0, 3), untied_norms=False),
    "banks": dict(block_of_layer=(0, 1, 0, 1), banks=(
        Bank(((0, "attn_k"), (1, "attn_k"), (0, "attn_v"), (1, "attn_v")), "slice", 700),
        Bank(((0, "mlp_up"), (1, "mlp_up")), "template_mix", 1000, templates=3),
        Bank(((0, "attn_q"), (1, "attn_o")), "tile", 300))),
    "atoms": dict(atoms=(AtomSpec("attn_k", 2), AtomSpec("attn_o", 3, "block")), block_of_layer=(0, 0, 1, 1)),
    "experts": dict(experts=ExpertPool((3,), (0, 0, 0, 0), 16, 2, "shared")),
    "kv_sharing_v": dict(kv_source=(0, 0, 2, 2), kv_mode="v", lora_attn=(2, 2, 2, 2), block_of_layer=(0, 1, 0, 1)),
    "kv_sharing_kv_atoms": dict(kv_source=(0, 0, 0, 3), atoms=(AtomSpec("attn_v", 2),)),
}


@pytest.mark.parametrize("name", list(MECHANISMS))
@pytest.mark.parametrize("tie", [True, False])
def test_every_mechanism_builds_exactly_and_trains_on_llama(name, tie):
    kw = MECHANISMS[name]
    cfg = ArchConfig(chassis=chassis(tie_embeddings=tie), mlp_widths=(48, 40, 48, 32),
                     block_of_layer=kw.get("block_of_layer", (0, 1, 2, 3)),
                     **{k: v for k, v in kw.items() if k != "block_of_layer"})
    torch.manual_seed(0)
    model = npas.build_model(cfg)
    acc = count(cfg)
    assert acc.stored_params == stored_params(cfg) == model.num_params()
    assert sum(acc.layer_stored) == pytest.approx(acc.stored_params - acc.embedding_params - 32, rel=1e-6)
    logits, loss = model(torch.randint(0, 30, (2, 10)), torch.randint(0, 30, (2, 10)))
    (loss + model.aux_loss).backward()
    assert torch.isfinite(logits).all()
    assert all(p.grad is not None for n, p in model.named_parameters() if not n.endswith(".B")), \
        [n for n, p in model.named_parameters() if p.grad is None]
    assert ArchConfig.from_yaml(cfg.to_yaml()) == cfg


def _as_llama(text: str) -> str:
    """A shipped space switched to the llama family: its chassis gains family: llama and GQA (half the
    heads for K/V), everything else as written."""
    data = yaml.safe_load(text)
    ch = data["chassis"]
    ch["family"] = "llama"
    ch["n_kv_heads"] = max(1, ch["n_heads"] // 2)
    return yaml.safe_dump(data, sort_keys=False)


SWITCHED = [p for p in SPACES if p.stem != "llama"]


@pytest.mark.parametrize("path", SWITCHED, ids=[p.stem for p in SWITCHED])
def test_shipped_spaces_switched_to_llama_count_exactly(path):
    space = parse_space(_as_llama(path.read_text()), path.stem)
    assert space.reference_chassis.llama
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    feasible = 0
    for _ in range(16):
        cand = space.sample(study.ask())
        if not cand.feasible:
            assert isinstance(cand.reason, str) and cand.reason
            continue
        feasible += 1
        check_exact(space, cand)
        c = cand.config.chassis
        assert c.llama and c.head_size % 2 == 0 and c.kv_heads == max(1, c.n_heads // 2)
    assert feasible >= 8, f"{path.stem}: only {feasible}/16 feasible on llama"


def test_llama_space_samples_are_exact_and_reach_every_mechanism():
    space = load_space(next(p for p in SPACES if p.stem == "llama"))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen, feasible = set(), 0
    for _ in range(80):
        trial = study.ask()
        cand = space.sample(trial)
        study.tell(trial, 0.0)
        if not cand.feasible:
            continue
        feasible += 1
        check_exact(space, cand)
        cfg = cand.config
        seen |= {b.generator for b in cfg.banks} | ({"lora"} if any(cfg.lora_attn + cfg.lora_mlp) else set())
        seen |= {"tied"} if cfg.n_blocks < 8 else set()
        seen |= {"atoms"} if cfg.atoms else set()
        seen |= {"experts"} if cfg.experts else set()
        seen |= {"kv"} if cfg.kv_source != tuple(range(8)) else set()
    assert feasible >= 64, feasible
    assert seen >= {"slice", "tile", "template_mix", "lora", "tied", "atoms", "experts", "kv"}, seen
    for name, vals in space.baselines().items():
        cand = space.candidate({**{k: kn.default for k, kn in space.chassis.items()}, **vals})
        assert cand.feasible, (name, cand.reason)
        check_exact(space, cand)
        assert cand.config.chassis.family == "llama" and cand.config.chassis.kv_heads == 2


# ---- the file format: llama chassis written out, classic left as it was ------------------------------
def test_classic_allocations_serialise_as_before():
    ch = Chassis(vocab_size=30, context=16, d_model=32, n_layers=2, n_heads=4, d_ff=64)
    d = reference_config(ch).to_dict()["chassis"]
    assert list(d) == ["vocab_size", "context", "d_model", "n_layers", "n_heads", "d_ff", "activation"]
    assert ArchConfig.from_dict(reference_config(ch).to_dict()).chassis.family == "classic"


def test_llama_chassis_round_trips_and_is_canonical():
    a = reference_config(chassis(n_kv_heads=4, head_dim=8, rope_theta=500))
    b = reference_config(chassis(n_kv_heads=0, head_dim=0, rope_theta=500.0))
    assert a == b and a.hash == b.hash  # derived head counts and widths are one chassis
    written = a.to_dict()["chassis"]
    assert written["family"] == "llama" and written["n_kv_heads"] == 4 and "head_dim" not in written
    explicit = reference_config(chassis(head_dim=6, n_kv_heads=1))
    assert explicit.to_dict()["chassis"]["head_dim"] == 6
    assert ArchConfig.from_yaml(explicit.to_yaml()) == explicit


@pytest.mark.parametrize("kw, message", [
    ({"n_kv_heads": 3}, "n_kv_heads=3 does not divide n_heads=4"),
    ({"head_dim": 7}, "head_dim=7 is odd"),
    ({"d_model": 36, "n_heads": 6}, "head_dim=6"),  # 36 / 6 = 6: even, accepted (the check below)
    ({"family": "classic", "n_kv_heads": 2}, "apply to family llama only"),
    ({"family": "gpt", "n_kv_heads": 2}, "chassis.family"),
    ({"rms_norm_eps": 0.0}, "rms_norm_eps"),
])
def test_bad_llama_chassis_is_refused_with_the_fix(kw, message):
    ch = chassis(**kw)
    if message == "head_dim=6":
        assert ch.problems() == []
        return
    assert any(message in p for p in ch.problems()), ch.problems()
    with pytest.raises(ConfigError, match=re.escape(message)):
        ArchConfig.from_dict({**reference_config(chassis()).to_dict(), "chassis": {**LLAMA, **kw}})


def test_llama_space_narrows_d_model_in_steps_that_keep_head_dim_even():
    space = load_space(next(p for p in SPACES if p.stem == "llama"))
    cand = space.candidate({**{k: kn.default for k, kn in space.chassis.items()}, **space.baselines()["narrow_untied"]})
    c = cand.config.chassis
    assert c.d_model < 128 and c.head_size % 2 == 0 and c.d_model % (2 * c.n_heads) == 0
    npas.build_model(cand.config)(torch.randint(0, 68, (1, 8)))


def test_classic_spaces_record_no_family_keys_and_llama_spaces_record_theirs():
    # a space that names no family samples exactly the values it always did (trial attributes, resumes)
    full = load_space(next(p for p in SPACES if p.stem == "full"))
    values = full.sample(optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()).values
    assert not {"family", "n_kv_heads", "head_dim", "rope_theta", "rms_norm_eps", "tie_embeddings"} & set(values)
    llama = load_space(next(p for p in SPACES if p.stem == "llama"))
    values = llama.sample(optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()).values
    assert values["family"] == "llama" and values["n_kv_heads"] == 2


# ---- conversion between allocations of one llama chassis ------------------------------------------------
def test_llama_converts_within_its_chassis_and_nowhere_else():
    from npas.conversion.convert import convert_model

    ch = chassis(tie_embeddings=False)
    torch.manual_seed(0)
    dense = npas.build_model(reference_config(ch))
    idx = torch.randint(0, 30, (2, 10))
    same = convert_model(dense, reference_config(ch))
    assert torch.equal(same.model(idx)[0], dense(idx)[0])  # every weight, the head included, carried over
    shared = ArchConfig(chassis=ch, mlp_widths=(48, 32, 48, 32), block_of_layer=(0, 1, 0, 1), lora_attn=(4,) * 4,
                        atoms=(AtomSpec("attn_k", 4),))
    out = convert_model(dense, shared)  # provenance for every entry, or it raises
    assert max(out.errors[f"{i}.attn_k"] for i in range(4)) < 1e-4  # 4 GQA-shaped k atoms span 4 layers: exact
    assert torch.isfinite(out.model(idx)[0]).all()
    with pytest.raises(ConfigError, match="n_kv_heads differs"):
        convert_model(dense, reference_config(chassis(tie_embeddings=False, n_kv_heads=1)))
    with pytest.raises(ConfigError, match="family differs"):
        convert_model(dense, reference_config(Chassis(**{k: v for k, v in LLAMA.items()
                                                          if k not in ("family", "n_kv_heads", "rope_theta",
                                                                       "rms_norm_eps")})))


@pytest.mark.slow  # loads and tokenizes the bundled corpus
def test_a_shared_llama_allocation_trains_through_the_proxy():
    from npas.training.data import load_corpus
    from npas.training.forks import run_proxy
    from npas.training.recipe import Recipe

    cfg = ArchConfig(chassis=chassis(vocab_size=68), mlp_widths=(48,) * 4, block_of_layer=(0, 1, 0, 1),
                     lora_attn=(2,) * 4, kv_source=(0, 0, 2, 2), atoms=(AtomSpec("attn_q", 2),))
    recipe = Recipe(name="t", seq_len=16, batch_size=4, steps=6, lr=3e-3, min_lr=3e-4, warmup_steps=1,
                    eval_every=6, eval_batches=1, threads=1)
    res = run_proxy(cfg, recipe, load_corpus(), device="cpu")
    assert res.status == "ok", res.failure_reason
    assert res.stored_params == count(cfg).stored_params and math.isfinite(res.val_loss)
