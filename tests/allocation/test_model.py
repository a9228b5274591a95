"""The model builder: reference equivalence with a plain transformer, finite values, gradients everywhere."""

from __future__ import annotations

import math

import optuna
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import npas
from npas.allocation.config import ArchConfig, Bank, Chassis, reference_config
from npas.allocation.space_parser import load_space
from npas.errors import NpasError
from tests.conftest import ROOT, SPACES

CH = Chassis(vocab_size=30, context=24, d_model=32, n_layers=3, n_heads=4, d_ff=80, activation="gelu")


class PlainGPT(nn.Module):
    """An independent, hand-written pre-norm GPT (nanoGPT layout) to check the reference against."""

    def __init__(self, c: Chassis) -> None:
        super().__init__()
        self.c = c
        self.wte, self.wpe = nn.Embedding(c.vocab_size, c.d_model), nn.Embedding(c.context, c.d_model)
        self.blocks = nn.ModuleList()
        for _ in range(c.n_layers):
            blk = nn.Module()
            blk.ln_1, blk.ln_2 = nn.LayerNorm(c.d_model, bias=False), nn.LayerNorm(c.d_model, bias=False)
            blk.c_attn = nn.Linear(c.d_model, 3 * c.d_model, bias=False)
            blk.c_proj = nn.Linear(c.d_model, c.d_model, bias=False)
            blk.c_fc = nn.Linear(c.d_model, c.d_ff, bias=False)
            blk.mlp_proj = nn.Linear(c.d_ff, c.d_model, bias=False)
            self.blocks.append(blk)
        self.ln_f = nn.LayerNorm(c.d_model, bias=False)

    def forward(self, idx):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.blocks:
            q, k, v = b.c_attn(b.ln_1(x)).split(self.c.d_model, 2)
            q, k, v = (t.view(B, T, self.c.n_heads, -1).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, -1)
            x = x + b.c_proj(y)
            x = x + b.mlp_proj(F.gelu(b.c_fc(b.ln_2(x))))
        return self.ln_f(x) @ self.wte.weight.T


def test_reference_matches_a_plain_transformer():
    torch.manual_seed(0)
    model = npas.build_model(reference_config(CH))
    plain = PlainGPT(CH)
    assert model.num_params() == sum(p.numel() for p in plain.parameters())
    with torch.no_grad():
        plain.wte.weight.copy_(model.wte.weight)
        plain.wpe.weight.copy_(model.wpe.weight)
        plain.ln_f.weight.copy_(model.ln_f.weight)
        for i, b in enumerate(plain.blocks):
            blk, lay = model.blocks[i], model.h[i]
            b.c_attn.weight.copy_(torch.cat([blk.attn_q, blk.attn_k, blk.attn_v]))  # nanoGPT's fused c_attn
            b.c_proj.weight.copy_(blk.attn_o)
            b.c_fc.weight.copy_(blk.mlp_up)
            b.mlp_proj.weight.copy_(blk.mlp_down)
            b.ln_1.weight.copy_(lay.ln_1.weight)
            b.ln_2.weight.copy_(lay.ln_2.weight)
    idx = torch.randint(0, CH.vocab_size, (2, 20))
    torch.testing.assert_close(model(idx)[0], plain(idx))


def test_budget_1x_with_no_sharing_rebuilds_the_reference_exactly():
    text = (
        "chassis: {vocab_size: 30, context: 24, d_model: 32, n_layers: 3, n_heads: 4, d_ff: 80}\n"
        "budget: 1x\nknobs: {tying: {mode: none}, taper: {schedule: uniform}}\n"
    )
    from npas.allocation.space_parser import parse_space

    space = parse_space(text)
    cand = space.sample(optuna.create_study().ask())
    assert cand.config == reference_config(CH) and cand.fill == 1.0
    outs = []
    for cfg in (cand.config, reference_config(CH)):
        torch.manual_seed(7)
        outs.append(npas.build_model(cfg)(torch.arange(20).view(1, 20) % 30)[0])
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)


def test_lora_starts_equal_to_the_tied_model():
    tied = ArchConfig(chassis=CH, mlp_widths=(80,) * 3, block_of_layer=(0, 0, 0))
    relaxed = ArchConfig(chassis=CH, mlp_widths=(80,) * 3, block_of_layer=(0, 0, 0), lora_attn=(4,) * 3,
                         lora_mlp=(4,) * 3)
    torch.manual_seed(1)
    a = npas.build_model(tied)
    torch.manual_seed(1)
    b = npas.build_model(relaxed)
    b.load_state_dict(a.state_dict(), strict=False)
    idx = torch.randint(0, 30, (2, 16))
    torch.testing.assert_close(a(idx)[0], b(idx)[0])
    assert all(float(lo.B.detach().abs().sum()) == 0 for layer in b.h for lo in layer.lora.values())


def _train_steps(model, steps=2):
    opt = torch.optim.AdamW(model.param_groups(0.1), lr=1e-2)
    idx = torch.randint(0, model.cfg.chassis.vocab_size, (2, 16))
    for _ in range(steps):
        opt.zero_grad()
        logits, loss = model(idx, idx)
        assert math.isfinite(loss.item()) and torch.isfinite(logits).all()
        loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters()}
        opt.step()
    return grads


@pytest.mark.parametrize("path", SPACES, ids=lambda p: p.stem)
def test_gradients_reach_every_bank_coefficient_and_lora_factor(path):
    space = load_space(path)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    checked = 0
    for _ in range(40):
        cand = space.sample(study.ask())
        if not cand.feasible:
            continue
        cfg = ArchConfig.from_dict({**cand.config.to_dict(),
                                    "chassis": {**cand.config.chassis.__dict__, "context": 16}})
        torch.manual_seed(0)
        model = npas.build_model(cfg)
        grads = _train_steps(model)  # after one step B != 0, so LoRA A receives gradient too
        dead = [n for n, g in grads.items() if g is None or not torch.isfinite(g).all() or g.abs().sum() == 0]
        assert not dead, f"{cfg.summary()}: no gradient for {dead}"
        checked += 1
        if checked == 3:
            break
    assert checked, f"no feasible sample in {path.name}"


@pytest.mark.parametrize("generator", ["tie", "slice", "tile", "template_mix"])
def test_each_generator_builds_and_trains(generator):
    members = ((0, "mlp_up"), (1, "mlp_up"), (2, "mlp_up"))
    size = {"tie": 80 * 32, "slice": 3 * 80 * 32, "tile": 500, "template_mix": 700}[generator]
    bank = Bank(members, generator, size=size, templates=3 if generator == "template_mix" else 1)
    cfg = ArchConfig(chassis=CH, mlp_widths=(80,) * 3, block_of_layer=(0, 1, 2), banks=(bank,))
    model = npas.build_model(cfg)
    grads = _train_steps(model)
    assert grads["banks.0.weight"].abs().sum() > 0
    w = model.materialise()
    if generator == "tie":  # same storage: every member is a view of the bank
        assert w[0]["mlp_up"].data_ptr() == w[2]["mlp_up"].data_ptr() == model.banks[0].weight.data_ptr()
    if generator == "slice":  # size == sum of members: disjoint windows, exactly untied
        assert len({t.data_ptr() for t in (w[0]["mlp_up"], w[1]["mlp_up"], w[2]["mlp_up"])}) == 3
    if generator == "tile":
        torch.testing.assert_close(w[0]["mlp_up"].flatten()[:500], w[0]["mlp_up"].flatten()[500:1000])


def test_a_model_saved_under_schema_1_loads_and_computes_what_was_saved(tmp_path):
    # tests/data/schema1_model was written by `save_trained` at schema 1 (699cb4d): fused
    # blocks.N.attn_qkv / attn_out weights, a slice bank, tied blocks and MLP LoRA; expected.json
    # holds the logits that code computed on `idx`
    import json
    import shutil

    from npas.training.train import load_trained

    src = ROOT / "tests" / "data" / "schema1_model"
    expected = json.loads((src / "expected.json").read_text())
    model, _, cfg = load_trained(src)
    assert cfg.version == 2 and model.num_params() == expected["stored_params"]
    logits = model(torch.tensor(expected["idx"]))[0]
    torch.testing.assert_close(logits, torch.tensor(expected["logits"]), rtol=1e-5, atol=1e-5)
    # a schema-1 bank that generated the fused attn_qkv computes something else now: refused, not loaded
    bad = tmp_path / "m"
    shutil.copytree(src, bad)
    text = (bad / "config.yaml").read_text().replace("[0, mlp_down]", "[0, attn_qkv]")
    (bad / "config.yaml").write_text(text)
    with pytest.raises(NpasError, match="train again"):
        load_trained(bad)


@pytest.mark.parametrize("scaling", ["standard", "rslora"])
@pytest.mark.parametrize("rank", [1, 2, 4, 8])
def test_a_relaxed_layer_computes_the_scaled_lora_delta(rank, scaling):
    # every layer of a fully tied model relaxed at rank r, A and B set by hand: the model must compute
    # what an untied model computes with W_i = W + (alpha / r) B_i A_i (alpha / sqrt(r) for rslora)
    alpha = 12.0
    relaxed = ArchConfig(chassis=CH, mlp_widths=(80,) * 3, block_of_layer=(0, 0, 0), lora_attn=(rank,) * 3,
                         lora_mlp=(rank,) * 3, lora_alpha=alpha, lora_scaling=scaling)
    scale = alpha / (rank if scaling == "standard" else math.sqrt(rank))
    torch.manual_seed(0)
    model, untied = npas.build_model(relaxed), npas.build_model(reference_config(CH))
    g = torch.Generator().manual_seed(rank)
    with torch.no_grad():
        for name in ("wte.weight", "wpe.weight", "ln_f.weight"):
            untied.get_parameter(name).copy_(model.get_parameter(name))
        for i, layer in enumerate(model.h):
            untied.h[i].ln_1.weight.copy_(layer.ln_1.weight)
            untied.h[i].ln_2.weight.copy_(layer.ln_2.weight)
            for slot, lo in layer.lora.items():
                lo.A.copy_(torch.randn(lo.A.shape, generator=g))
                lo.B.copy_(torch.randn(lo.B.shape, generator=g) * 0.01)
                w = model.blocks[0].get_parameter(slot) + scale * lo.B @ lo.A
                untied.blocks[i].get_parameter(slot).copy_(w)
    assert len(model.h[0].lora) == 6  # q, k, v, o, up, down
    idx = torch.randint(0, CH.vocab_size, (2, 16))
    torch.testing.assert_close(model(idx)[0], untied(idx)[0], rtol=1e-5, atol=1e-5)
    lo = model.h[1].lora["attn_v"]
    x = torch.randn(5, CH.d_model, generator=g)
    w = model.blocks[0].attn_v
    torch.testing.assert_close(F.linear(x, w + lo.delta()), x @ (w + scale * lo.B @ lo.A).T, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_dtype_means_stored_and_exported_weights_and_accounting_agrees(dtype, tmp_path):
    # every dtype the schema accepts: built parameters, counted bytes and saved weights agree
    from safetensors.torch import load_file

    from npas.allocation.budget import count
    from npas.allocation.config import DTYPE_BYTES
    from npas.training.data import CharTokenizer
    from npas.training.train import MODEL_FILE, load_trained, save_trained

    ch = Chassis(vocab_size=12, context=16, d_model=16, n_layers=3, n_heads=2, d_ff=24, activation="swiglu")
    bank = Bank(((0, "attn_q"), (1, "attn_q")), "template_mix", size=100, templates=2)
    cfg = ArchConfig(chassis=ch, mlp_widths=(24, 16, 24), block_of_layer=(0, 1, 0), lora_mlp=(2, 0, 2),
                     banks=(bank,), dtype=dtype)
    assert DTYPE_BYTES[dtype] == getattr(torch, dtype).itemsize
    model = npas.build_model(cfg)
    acc = count(cfg)
    assert {p.dtype for p in model.parameters()} == {getattr(torch, dtype)}
    assert sum(p.numel() * p.element_size() for p in model.parameters()) == acc.param_bytes
    assert torch.isfinite(model(torch.randint(0, 12, (1, 8)))[0].float()).all()
    trained = model.float()  # what the proxy trains: fp32 master weights
    save_trained(trained, cfg, CharTokenizer.from_text("abcdefghijk\n"), tmp_path)
    saved = load_file(str(tmp_path / MODEL_FILE))
    assert {t.dtype for t in saved.values()} == {getattr(torch, dtype)}
    assert sum(t.numel() * t.element_size() for t in saved.values()) == acc.param_bytes
    loaded, _, back = load_trained(tmp_path)
    assert back == cfg and {p.dtype for p in loaded.parameters()} == {getattr(torch, dtype)}
    for name, p in loaded.named_parameters():
        assert torch.equal(p, trained.get_parameter(name).to(p.dtype)), name
