"""Hugging Face out for LoRA factors shared across layers: --unroll merges them into a stock
LlamaForCausalLM's plain weights, and the npas model type stores and reloads them (the frozen VeRA pair
and the shared factors once each); both give npas's logits within 1e-5 (fp32)."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM, LlamaForCausalLM  # noqa: E402

import npas  # noqa: E402,F401  (registers the npas model type with the Auto classes)
from npas.allocation.config import ArchConfig, Chassis  # noqa: E402
from npas.allocation.transformer import build_model  # noqa: E402
from npas.conversion.hf_export import write_hf  # noqa: E402

LLAMA = Chassis(vocab_size=50, context=32, d_model=32, n_layers=4, n_heads=4, d_ff=64, activation="swiglu",
                family="llama", n_kv_heads=2)
MODES = {"shared_a": {}, "vera": {"lora_seed": 11}, "shards": {"lora_shards": 6, "lora_private_fraction": 0.5}}


def relaxed_model(mode: str) -> torch.nn.Module:
    cfg = ArchConfig(chassis=LLAMA, mlp_widths=(64, 48, 64, 32), block_of_layer=(0, 1, 0, 1), lora_attn=(4,) * 4,
                     lora_mlp=(2,) * 4, lora_sharing=mode, **MODES[mode])
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    with torch.no_grad():  # trained-looking relaxations: every zero-initialised factor made non-zero
        for name, p in model.named_parameters():
            if (".lora." in name or name.startswith("lora_shared")) and p.requires_grad:
                p.copy_(0.05 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("mode", list(MODES))
def test_shared_lora_unrolls_to_a_stock_llama_and_loads_as_the_npas_type(mode, tmp_path):
    model = relaxed_model(mode)
    x = torch.randint(0, 50, (2, 12))
    with torch.no_grad():
        want = model(x)[0]
        assert all(float(lora.delta().abs().max()) > 1e-4 for layer in model.h for lora in layer.lora.values())
    written = write_hf(model, model.cfg, tmp_path / "un", unroll=True)
    assert written["kind"] == "llama"
    stock = LlamaForCausalLM.from_pretrained(tmp_path / "un").eval()
    written = write_hf(model, model.cfg, tmp_path / "npas")
    config = json.loads((tmp_path / "npas" / "config.json").read_text())
    assert written["kind"] == "npas" and config["allocation"]["lora_sharing"] == mode
    assert written["params"] == model.num_params()  # each shared factor (and the frozen pair) stored once
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "npas").eval()
    with torch.no_grad():
        assert (stock(x).logits - want).abs().max().item() <= 1e-5
        assert (back(x).logits - want).abs().max().item() <= 1e-5
