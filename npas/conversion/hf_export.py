"""Writing an allocation as a Hugging Face checkpoint (`--format hf` on `npas train` and `npas convert`).

Three shapes of output, all safetensors with a config.json that `AutoModelForCausalLM.from_pretrained`
reads:
  - a plain dense LLaMA allocation (llama family, one block per layer, uniform MLP, no banks, atoms,
    experts, LoRA or KV sharing) is written as a stock `LlamaForCausalLM`: it loads without npas;
  - `unroll=True` writes *any* llama allocation without KV sharing or experts as a stock
    `LlamaForCausalLM`, each layer's effective weights materialised (tied blocks copied, banks and atoms
    generated, LoRA merged, narrower MLPs zero-padded to the widest: a zero unit adds silu(0) * 0 = 0),
    for serving stacks that know only LLaMA; it is as large as the untied model;
  - otherwise the `npas` model type (`NpasConfig` + `NpasForCausalLM`, registered with the Auto classes
    when npas is imported, see `npas.__init__`): config.json carries the allocation, the weights are
    npas's own state dict, each shared tensor stored once.

`NpasForCausalLM` decodes with transformers' DynamicCache: npas's forward takes the cache, and only
KV *source* layers store keys and values in it (a layer that shares another's keys and values stores
nothing; value-only sharing stores its own keys only), so cross-layer KV sharing shrinks the cache to
the share of source layers, which is what it is for. A 2-D `attention_mask` is honoured: prompts of
different lengths batch left-padded, each row taking its positions from the mask and never attending to
its padding. `from_pretrained(..., dtype=...)` gives weights of that dtype, as stock classes do.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor

from npas.allocation.config import ArchConfig
from npas.allocation.transformer import LLAMA_HF_NAMES, TORCH_DTYPES, TransformerLM, build_model, export_state
from npas.conversion.hf_source import HF_CONFIG, HF_WEIGHTS, require_transformers
from npas.conversion.source import read_source
from npas.errors import ConfigError

MODEL_TYPE = "npas"
RECURSION_NOT_HF = ("cannot write --format hf: the allocation routes each token through its shared stack a number of "
                    "times of its own (recursion), which no Hugging Face architecture expresses; write the npas "
                    "format (--format npas)")


def is_plain_llama(cfg: ArchConfig) -> bool:
    """An allocation a stock LlamaForCausalLM computes exactly, weight for weight."""
    L = cfg.chassis.n_layers
    return (cfg.chassis.llama and tuple(cfg.block_of_layer) == tuple(range(L)) and not cfg.banks
            and not cfg.atoms and cfg.experts is None and not any(cfg.lora_attn) and not any(cfg.lora_mlp)
            and tuple(cfg.kv_source) == tuple(range(L)) and len(set(cfg.mlp_widths)) == 1
            and all(cfg.norms_in_layer(i) for i in range(L)))


def unroll_problems(cfg: ArchConfig) -> list[str]:
    out = []
    if not cfg.chassis.llama:
        out.append("the allocation's chassis is classic (a learned position table, LayerNorm); only a llama "
                   "chassis has a LlamaForCausalLM form")
    if tuple(cfg.kv_source) != tuple(range(cfg.chassis.n_layers)):
        out.append("it shares keys/values across layers, which LlamaForCausalLM cannot express; write it "
                   "without --unroll (the npas model type)")
    if cfg.experts is not None:
        out.append("its MLPs are expert pools, which LlamaForCausalLM cannot express; write it without --unroll")
    return out


def llama_state(model: TransformerLM) -> tuple[dict[str, Tensor], int]:
    """(Hugging Face LLaMA state dict, intermediate_size) of `model`'s effective per-layer weights."""
    src = read_source(model)
    width = max(model.cfg.mlp_widths)
    out: dict[str, Tensor] = {}
    for i, ws in enumerate(src.layers):
        for slot, w in ws.items():
            v = w.value
            n = v.shape[0] if slot in ("mlp_up", "mlp_gate") else v.shape[1] if slot == "mlp_down" else width
            if n < width:  # zero units compute nothing: silu(0) * 0 through a zero column of down
                pad = (0, 0, 0, width - n) if slot != "mlp_down" else (0, width - n)
                v = torch.nn.functional.pad(v, pad)
            out[f"model.layers.{i}.{LLAMA_HF_NAMES[slot]}.weight"] = v
        for ln in ("ln_1", "ln_2"):
            out[f"model.layers.{i}.{LLAMA_HF_NAMES[ln]}.weight"] = src.norms[i][ln].value
    for name, w in src.embed.items():
        out[f"{LLAMA_HF_NAMES[name]}.weight"] = w.value
    return out, width


def llama_config_dict(cfg: ArchConfig, intermediate: int) -> dict[str, Any]:
    """config.json of the stock LlamaForCausalLM computing `cfg` (transformers 5 form)."""
    c = cfg.chassis
    rope = {"rope_type": "default", "rope_theta": c.rope_theta} | c.rope
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": c.vocab_size,
        "hidden_size": c.d_model, "intermediate_size": intermediate, "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads, "num_key_value_heads": c.kv_heads, "head_dim": c.head_size,
        "hidden_act": "silu", "max_position_embeddings": c.context, "rms_norm_eps": c.rms_norm_eps,
        "tie_word_embeddings": c.tie_embeddings, "rope_parameters": rope, "attention_bias": False,
        "mlp_bias": False, "pretraining_tp": 1, "use_cache": True, "dtype": cfg.dtype,
        "bos_token_id": None, "eos_token_id": None, "pad_token_id": None,
    }


def _tensor_bytes(state: dict[str, Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def write_hf(model: TransformerLM, cfg: ArchConfig, out: str | Path, tokenizer: Any = None,
             unroll: bool = False) -> dict[str, Any]:
    """Write `model` (of allocation `cfg`) to `out` as a Hugging Face checkpoint; returns what was written
    ({"kind": "llama" | "npas", "params", "bytes"}). Refuses in one line what cannot be written."""
    require_transformers("--format hf")
    if cfg.recursion is not None:
        raise ConfigError(RECURSION_NOT_HF)
    out = Path(out)
    dtype = TORCH_DTYPES[cfg.dtype]
    if unroll or is_plain_llama(cfg):
        problems = unroll_problems(cfg)
        if problems:
            raise ConfigError("cannot write a stock LlamaForCausalLM: " + "; ".join(problems))
        state, width = llama_state(model)
        state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in state.items()}
        config = llama_config_dict(cfg, width)
        kind = "llama"
    else:
        state = {f"npas.{k}": v for k, v in export_state(model).items()}
        config = npas_config_dict(cfg)
        kind = "npas"
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / HF_WEIGHTS), metadata={"format": "pt"})
    (out / HF_CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (out / "generation_config.json").write_text(json.dumps(
        {"use_cache": True, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}, indent=2)
        + "\n", encoding="utf-8")
    if tokenizer is not None:
        (out / "tokenizer.json").write_text(tokenizer.to_json(), encoding="utf-8")
    return {"kind": kind, "params": sum(t.numel() for t in state.values()), "bytes": _tensor_bytes(state)}


def npas_config_dict(cfg: ArchConfig) -> dict[str, Any]:
    c = cfg.chassis
    return {"architectures": ["NpasForCausalLM"], "model_type": MODEL_TYPE, "allocation": cfg.to_dict(),
            "vocab_size": c.vocab_size, "hidden_size": c.d_model, "num_hidden_layers": c.n_layers,
            "max_position_embeddings": c.context, "tie_word_embeddings": False, "use_cache": True,
            "dtype": cfg.dtype}


_REGISTERED: list[type] = []


def hf_classes() -> tuple[type, type]:
    """(NpasConfig, NpasForCausalLM), defined on first use (they subclass transformers' classes)."""
    if _REGISTERED:
        return _REGISTERED[0], _REGISTERED[1]
    transformers = require_transformers("the npas Hugging Face model type")
    from transformers import GenerationMixin, PreTrainedConfig, PreTrainedModel
    from transformers.modeling_outputs import CausalLMOutputWithPast

    class NpasConfig(PreTrainedConfig):
        """An npas allocation as a transformers config: `allocation` is its `ArchConfig.to_dict()`."""

        model_type = MODEL_TYPE
        allocation: dict | None = None
        vocab_size: int = 0
        hidden_size: int = 0
        num_hidden_layers: int = 0
        max_position_embeddings: int = 0
        use_cache: bool = True

    class NpasForCausalLM(PreTrainedModel, GenerationMixin):
        """npas's TransformerLM (`self.npas`) behind transformers' causal-LM interface. Its KV cache holds
        only the KV source layers (cross-layer sharing shrinks it); a 2-D `attention_mask` lets batches
        of prompts of different lengths run left-padded (positions come from the mask)."""

        config_class = NpasConfig
        base_model_prefix = "npas"
        main_input_name = "input_ids"

        def __init__(self, config: NpasConfig) -> None:
            super().__init__(config)
            # In torch's default dtype, as stock classes are: `from_pretrained(dtype=...)` sets it (to the
            # checkpoint's `dtype` when none is given) while the model is built, and the weights load into
            # tensors of that dtype, so config.dtype and the weights agree. The allocation keeps the dtype
            # it was trained for; only the tensors change.
            self.npas = build_model(ArchConfig.from_dict(config.allocation)).to(torch.get_default_dtype())
            self.post_init()

        def _init_weights(self, module: torch.nn.Module) -> None:
            """Every weight comes from the checkpoint (npas's own init ran in `build_model`)."""

        def get_input_embeddings(self) -> torch.nn.Module:
            return self.npas.wte

        def forward(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                    labels: Tensor | None = None, cache: Any = None, use_cache: bool | None = None,
                    **kwargs: Any) -> CausalLMOutputWithPast:
            if use_cache and cache is None:
                from transformers import DynamicCache

                cache = DynamicCache(config=self.config)
            logits, _ = self.npas(input_ids, cache=cache if use_cache is not False else None,
                                  attention_mask=attention_mask)
            loss = None
            if labels is not None:  # transformers' convention: labels are the inputs, shifted here
                loss = torch.nn.functional.cross_entropy(
                    logits[:, :-1].reshape(-1, logits.size(-1)).float(), labels[:, 1:].reshape(-1), ignore_index=-100)
            return CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache if use_cache is not False else None)

    transformers.AutoConfig.register(MODEL_TYPE, NpasConfig, exist_ok=True)
    transformers.AutoModelForCausalLM.register(NpasConfig, NpasForCausalLM, exist_ok=True)
    _REGISTERED[:] = [NpasConfig, NpasForCausalLM]
    return NpasConfig, NpasForCausalLM


def register() -> None:
    """Register the npas model type with transformers' Auto classes (idempotent)."""
    hf_classes()


__all__ = ["MODEL_TYPE", "hf_classes", "is_plain_llama", "llama_state", "register", "write_hf"]
