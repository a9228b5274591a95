"""Every parameter of every mechanism has a documented learning-rate rule (issue #29, defect 2).

Before, attention-atom dictionaries and SwiGLU expert gates fell through to a silent "other" group at
the base rate: atoms read by every layer got no sharing correction, and a gate could step at another
rate than its sibling ``up``. Now a parameter no row covers is refused, and each shipped space's
models (under both activations, so SwiGLU gates appear) are enumerated to prove none is left out.
Expected multipliers are worked out by hand from the module docstring's table, not by the module.
"""

from __future__ import annotations

import dataclasses
import math

import optuna
import pytest
import torch
from torch import nn

from npas.allocation.config import ArchConfig, AtomSpec, Chassis
from npas.allocation.space_parser import parse_space
from npas.allocation.transformer import build_model
from npas.training.parameterization import Rule, UnruledParameter, apply_init, optimizer_groups, rules
from tests.conftest import SPACES

# the groups the docstring table documents; "other" (the old silent fallback) is not one of them
DOCUMENTED = {"embedding", "norm", "matrix", "bank", "coef", "lora", "expert", "router", "atom", "atom_coef",
              "lora_shared", "lora_vec", "frozen"}
SAMPLES = 20


def _models(text: str, source: str, seed: int = 0, must: tuple[str, ...] = ()):
    """The models of a space's feasible samples among SAMPLES draws; then, while a mechanism in `must`
    ("atoms", "experts") has not appeared, the first feasible samples that use it among up to 200 more
    draws (a space with many knobs can miss one in SAMPLES draws, and the test is about every one)."""
    space = parse_space(text, source)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    seen: set[str] = set()
    uses = {"atoms": lambda cfg: bool(cfg.atoms), "experts": lambda cfg: cfg.experts is not None}
    for i in range(SAMPLES + 200):
        missing = [m for m in must if m not in seen]
        if i >= SAMPLES and not missing:
            return
        cand = space.sample(study.ask())
        if not cand.feasible or (i >= SAMPLES and not any(uses[m](cand.config) for m in missing)):
            continue
        seen |= {m for m in must if uses[m](cand.config)}
        yield build_model(cand.config)


def _space_activations() -> list:
    """Every shipped space under gelu and swiglu (swiglu adds the gates); a llama-family space is
    SwiGLU by definition, so it runs as shipped."""
    out = []
    for p in SPACES:
        for act in (("swiglu",) if "family: llama" in p.read_text() else ("gelu", "swiglu")):
            out.append(pytest.param(p, act, id=f"{p.stem}-{act}"))
    return out


@pytest.mark.parametrize(("path", "activation"), _space_activations())
def test_every_parameter_of_every_shipped_space_has_a_documented_rule(path, activation):
    text = path.read_text()
    if "family: llama" not in text:
        assert "activation: gelu" in text  # the classic shipped spaces all run gelu
        text = text.replace("activation: gelu", f"activation: {activation}")
    seen: set[str] = set()
    n = 0
    must = tuple(m for m, stems in (("atoms", ("atoms", "full")), ("experts", ("expert_pool", "full")))
                 if path.stem in stems)
    for model in _models(text, str(path), must=must):
        n += 1
        ch = model.cfg.chassis
        # its own chassis, and a reference of another width and depth (every width/depth factor moves)
        other = dataclasses.replace(ch, d_model=ch.d_model * 2, n_layers=ch.n_layers + 2, d_ff=ch.d_ff * 2)
        for reference in (None, other):
            table = rules(model, reference)  # raises UnruledParameter for a name no row covers
            assert table.keys() == dict(model.named_parameters()).keys()
            unruled = {name: r.group for name, r in table.items() if r.group not in DOCUMENTED}
            assert not unruled, f"{path.stem}/{activation}: parameters without a documented rule: {unruled}"
            params = dict(model.named_parameters())
            # every trained parameter steps; a frozen one (VeRA's projections) never does and takes no grad
            assert all(math.isfinite(r.lr_mult) and r.init_scale > 0 and (r.lr_mult > 0) == (r.group != "frozen")
                       == params[name].requires_grad for name, r in table.items())
        seen |= {name.split(".")[0] for name in table}
    assert n >= SAMPLES // 2  # the space really was sampled
    if path.stem in ("atoms", "full"):
        assert "atoms" in seen  # the mechanism this defect was about was enumerated
    if path.stem in ("expert_pool", "full"):
        assert "experts" in seen


CHASSIS = Chassis(vocab_size=68, context=64, d_model=64, n_layers=2, n_heads=4, d_ff=256)
REFERENCE = Chassis(vocab_size=68, context=64, d_model=32, n_layers=4, n_heads=4, d_ff=128)
W = (32 / 64) ** 0.5  # width factor of a slot reading d_model, (fan_in_ref / fan_in)**1/2
IN, OUT = (4 / 2) ** 0.25, (4 / 2) ** 0.5  # depth factor of input and residual-output slots


def test_atom_dictionaries_are_shared_by_every_reading_layer_like_a_bank():
    # attn_q from 3 atoms per layer (2 layers read it); attn_o from 2 atoms with one coefficient row
    # per block, both layers tied into block 0
    cfg = ArchConfig(chassis=CHASSIS, mlp_widths=(256, 256), block_of_layer=(0, 0),
                     atoms=(AtomSpec("attn_q", 3, "layer"), AtomSpec("attn_o", 2, "block")))
    torch.manual_seed(0)
    model = build_model(cfg)
    table = rules(model, REFERENCE)
    # every atom element is read by both layers (each layer's weight mixes every atom): k = 2
    assert table["atoms.attn_q.atoms"].group == "atom"
    assert table["atoms.attn_q.atoms"].lr_mult == pytest.approx(2**-0.5 * W * IN, rel=1e-12)
    assert table["atoms.attn_o.atoms"].lr_mult == pytest.approx(2**-0.5 * W * OUT, rel=1e-12)
    assert table["atoms.attn_q.atoms"].init_scale == pytest.approx(math.sqrt(32 / 64))
    # coefficients are gains: a row per layer is read once (k = 1), a block's row by its 2 layers
    assert table["atoms.attn_q.coef"] == Rule("atom_coef", 1.0)
    assert table["atoms.attn_o.coef"].lr_mult == pytest.approx(2**-0.5, rel=1e-12)
    assert table["atoms.attn_o.coef"].init_scale == 1.0
    # the init rule reaches the dictionary (rescaled like a bank), not its coefficients
    drawn = {n: p.detach().clone() for n, p in model.named_parameters()}
    apply_init(model, "fair", REFERENCE)
    after = dict(model.named_parameters())
    assert torch.allclose(after["atoms.attn_q.atoms"], drawn["atoms.attn_q.atoms"] * math.sqrt(0.5))
    assert torch.equal(after["atoms.attn_q.coef"], drawn["atoms.attn_q.coef"])
    # and the optimizer sees those rates (no parameter left at the base rate by default)
    groups = {(g["group"], g["lr_mult"]) for g in optimizer_groups(model, 0.1, "fair", REFERENCE)}
    assert ("atom", table["atoms.attn_q.atoms"].lr_mult) in groups
    assert all(group in DOCUMENTED for group, _ in groups)


def test_swiglu_expert_gate_follows_its_sibling_up():
    text = next(p for p in SPACES if p.stem == "expert_pool").read_text()
    text = text.replace("activation: gelu", "activation: swiglu")
    models = [m for m in _models(text, "expert_pool/swiglu", seed=3) if m.cfg.experts is not None]
    assert models
    for model in models:
        ch = model.cfg.chassis
        reference = Chassis(vocab_size=ch.vocab_size, context=ch.context, d_model=ch.d_model // 2,
                            n_layers=ch.n_layers * 2, n_heads=ch.n_heads, d_ff=ch.d_ff // 2)
        table = rules(model, reference)
        for p in range(len(model.cfg.experts.pool_sizes)):
            gate, up = table[f"experts.pools.{p}.gate"], table[f"experts.pools.{p}.up"]
            assert gate == up and gate.group == "expert"
            assert gate.lr_mult != 1.0  # the reference differs, so the rule really acts on both


def test_a_parameter_without_a_rule_is_refused_not_trained_at_the_base_rate():
    cfg = ArchConfig(chassis=CHASSIS, mlp_widths=(256, 256), block_of_layer=(0, 1))
    model = build_model(cfg)
    model.h[1].register_parameter("mystery", nn.Parameter(torch.zeros(3)))
    with pytest.raises(UnruledParameter, match=r"h\.1\.mystery"):
        rules(model)
    with pytest.raises(UnruledParameter):
        optimizer_groups(model, 0.1, "fair")
    # the uniform parameterization applies no rules, so it still trains such a model
    assert optimizer_groups(model, 0.1, "uniform")
