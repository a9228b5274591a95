"""Hugging Face checkpoints read and loaded as transformers itself would: a Mistral's attention window
is whatever transformers' Mistral applies (`use_sliding_window` is another family's flag), and
`NpasForCausalLM.from_pretrained(..., dtype=...)` gives weights of that dtype, as stock classes do."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM, MistralConfig, MistralForCausalLM  # noqa: E402

import npas  # noqa: E402,F401  (registers the npas model type with the Auto classes)
from npas.allocation.config import Chassis, reference_config  # noqa: E402
from npas.allocation.transformer import build_model  # noqa: E402
from npas.conversion.hf_export import write_hf  # noqa: E402
from npas.conversion.hf_source import read_hf_dir  # noqa: E402
from npas.errors import ConfigError  # noqa: E402

V, CONTEXT, WINDOW = 64, 48, 8


def _mistral(path, **extra) -> MistralForCausalLM:
    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, max_position_embeddings=CONTEXT, **extra)
    model = MistralForCausalLM(cfg).eval()
    model.save_pretrained(path)
    return model


def test_a_mistral_window_with_use_sliding_window_false_is_still_a_window_and_refused(tmp_path):
    """transformers' Mistral windows its attention whenever sliding_window is set: the logits past the
    window differ from full attention's even with use_sliding_window false. npas has no windowed
    attention, so converting it window-free would change the model; it is refused in one line."""
    src = tmp_path / "src"
    _mistral(src, sliding_window=WINDOW)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps(config | {"use_sliding_window": False}))
    x = torch.randint(0, V, (1, 3 * WINDOW), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():  # what transformers computes from that very directory
        windowed = AutoModelForCausalLM.from_pretrained(src).eval()(x).logits
        (src / "config.json").write_text(json.dumps(config | {"sliding_window": None}))
        full = AutoModelForCausalLM.from_pretrained(src).eval()(x).logits
    assert (windowed[0, -1] - full[0, -1]).abs().max() > 1e-3, "the flag does not turn transformers' window off"
    (src / "config.json").write_text(json.dumps(config | {"use_sliding_window": False}))
    with pytest.raises(ConfigError, match=f"sliding_window={WINDOW} is shorter.*whatever use_sliding_window") as info:
        read_hf_dir(src)
    assert "\n" not in str(info.value) and "null" in str(info.value)  # the way out, for a model trained without


def test_the_window_is_read_as_transformers_reads_it():
    from npas.conversion.hf_source import attention_window

    mistral = {"architectures": ["MistralForCausalLM"], "model_type": "mistral"}
    assert attention_window(mistral) == MistralConfig().sliding_window  # its default, when the key is absent
    assert attention_window(mistral | {"sliding_window": None}) is None
    assert attention_window(mistral | {"sliding_window": 16, "use_sliding_window": False}) == 16
    assert attention_window({"architectures": ["LlamaForCausalLM"]}) is None


def test_a_mistral_config_without_the_key_gets_transformers_default_window(tmp_path):
    """MistralConfig's default window (4096) applies to a config.json that leaves the key out: a context
    longer than that is windowed in transformers, so it is refused; one within it reads as before."""
    src = tmp_path / "src"
    _mistral(src, sliding_window=None)
    config = json.loads((src / "config.json").read_text())
    del config["sliding_window"]
    (src / "config.json").write_text(json.dumps(config))
    read_hf_dir(src)  # context 48 <= 4096: the default window changes nothing
    (src / "config.json").write_text(json.dumps(config | {"max_position_embeddings": 8192}))
    with pytest.raises(ConfigError, match="sliding_window=4096 is shorter than max_position_embeddings=8192"):
        read_hf_dir(src)


@pytest.fixture
def bf16_npas_dir(tmp_path):
    """A bf16 allocation written as the npas model type (a tied model: not a plain llama)."""
    ch = Chassis(vocab_size=V, context=16, d_model=16, n_layers=2, n_heads=2, d_ff=32)
    cfg = replace(reference_config(ch), dtype="bfloat16", block_of_layer=(0, 0))
    assert write_hf(build_model(cfg), cfg, tmp_path / "hf")["kind"] == "npas"
    return tmp_path / "hf"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_from_pretrained_dtype_gives_weights_of_that_dtype(bf16_npas_dir, dtype):
    model = AutoModelForCausalLM.from_pretrained(bf16_npas_dir, dtype=dtype)
    assert type(model).__name__ == "NpasForCausalLM"
    assert model.config.dtype == dtype
    assert {p.dtype for p in model.parameters()} == {dtype}
    x = torch.randint(0, V, (1, 8))
    with torch.no_grad():
        assert model(x).logits.dtype == dtype


def test_from_pretrained_without_dtype_keeps_the_checkpoint_dtype(bf16_npas_dir):
    model = AutoModelForCausalLM.from_pretrained(bf16_npas_dir)
    assert model.config.dtype == torch.bfloat16 and {p.dtype for p in model.parameters()} == {torch.bfloat16}
    upcast = AutoModelForCausalLM.from_pretrained(bf16_npas_dir, dtype=torch.float32)
    with torch.no_grad():  # the same weights, only wider
        for (name, a), (_, b) in zip(model.state_dict().items(), upcast.state_dict().items(), strict=True):
            assert torch.equal(a.float(), b), name
