"""Reading a Hugging Face `save_pretrained` directory of a LLaMA-layout causal LM, the one place that does.

`npas convert HF_DIR` and `npas search --init-from HF_DIR` both start here. A directory is a Hugging
Face checkpoint when it holds `config.json` and no npas `config.yaml`. Its chassis is read from
config.json, each field's JSON type checked first (`hf_fields`: a string where a number belongs is
refused in one line, never truncated or compared): every field that changes the forward pass is either
honoured (head_dim, grouped K/V heads, rms_norm_eps, rope_theta, rope_scaling default/linear/llama3,
tie_word_embeddings) or refused in one line
(attention or MLP biases, an activation other than SiLU, a sliding window shorter than the context, other
rope types); fields that change nothing npas computes (dropout, token ids, initializer_range,
pretraining_tp -- which only slices the same matmuls) are ignored. Weights come from safetensors only
(single or sharded through model.safetensors.index.json); pickled `.bin` weights are refused because
loading them runs arbitrary code. Reading needs no `transformers`: config.json is JSON and the weights
are safetensors.

The weights load into the untied uniform allocation of that chassis (`reference_config`), name for
name through `LLAMA_HF_NAMES`, upcast to fp32 (the SVD and least-squares fits of a conversion need it);
`HFCheckpoint.dtype` remembers the source's dtype so the output can keep it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor

from npas.allocation.config import ArchConfig, Chassis, reference_config
from npas.allocation.transformer import LLAMA_HF_NAMES, TransformerLM, build_model
from npas.conversion.hf_fields import check_fields
from npas.errors import ConfigError, DataError
from npas.training.tokenizers import tokenizer_from_json
from npas.training.train import check_finite

HF_CONFIG = "config.json"
HF_WEIGHTS = "model.safetensors"
HF_INDEX = "model.safetensors.index.json"
TOKENIZER_JSON = "tokenizer.json"
SENTENCEPIECE = "tokenizer.model"
# architectures whose state dict and forward are LlamaForCausalLM's exactly (Mistral: the same modules,
# its sliding window refused unless it covers the whole context)
ACCEPTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")
MISTRAL_WINDOW = 4096  # MistralConfig's sliding_window when config.json leaves it out
INSTALL_HF = 'pip install "npas[hf]"'
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def require_transformers(what: str) -> Any:
    """The `transformers` module, or a one-line NpasError naming the install command."""
    try:
        import transformers
    except ImportError:
        raise ConfigError(f"{what} needs Hugging Face transformers, which is not installed; run "
                          f"`{INSTALL_HF}`") from None
    return transformers


def is_hf_dir(path: str | Path) -> bool:
    """A Hugging Face checkpoint directory (config.json, and no npas config.yaml beside it)."""
    d = Path(path).expanduser()
    return (d / HF_CONFIG).is_file() and not (d / "config.yaml").is_file()


def _rope(config: dict, where: str) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling or None) from either form: transformers 5's `rope_parameters`, or
    the older `rope_theta` + `rope_scaling`."""
    params = dict(config.get("rope_parameters") or {})
    legacy = config.get("rope_scaling") or {}
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    scaling = dict(legacy) | params
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return float(theta), None
    if kind not in ("linear", "llama3"):
        raise ConfigError(f"{where}: rope_scaling type {kind!r} is not supported; npas computes the default "
                          "rotary embedding and the linear and llama3 scalings")
    keep = ("factor",) if kind == "linear" else ("factor", "low_freq_factor", "high_freq_factor",
                                                "original_max_position_embeddings")
    out: dict[str, Any] = {"rope_type": kind}
    for k in keep:
        v = scaling.get(k)
        if v is None and k == "original_max_position_embeddings":
            v = config.get("max_position_embeddings")
        if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
            raise ConfigError(f"{where}: rope_scaling {kind} needs a positive {k}, got {v!r}")
        out[k] = v
    return float(theta), out


def attention_window(config: dict) -> Any:
    """The attention window transformers applies to this checkpoint, or None for full attention.

    Read as transformers' own code for the accepted families reads it: `MistralForCausalLM` windows
    whenever `sliding_window` is set (MistralConfig's default is `MISTRAL_WINDOW` when the key is
    absent), and `use_sliding_window` is a flag of other families (Qwen2's) that neither Mistral nor
    Llama reads, so it is ignored here too; converting such a checkpoint window-free would change its
    logits past the window. LlamaForCausalLM's forward ignores the key, but its compiled-cache
    generation windows by it, so a Llama config that sets one is taken at its word as well."""
    mistral = config.get("model_type") == "mistral" or "MistralForCausalLM" in (config.get("architectures") or [])
    return config.get("sliding_window", MISTRAL_WINDOW if mistral else None)


def hf_chassis(config: dict, where: str) -> Chassis:
    """The llama chassis a Hugging Face config.json describes, or a one-line refusal naming the field."""
    check_fields(config, where)  # first: every conversion below trusts the fields' JSON types
    archs = config.get("architectures") or []
    if "NpasForCausalLM" in archs:
        raise ConfigError(f"{where}: this is npas's own Hugging Face model type (NpasForCausalLM, from "
                          "`--format hf`), which npas reads only through transformers (`import npas`, then "
                          "AutoModelForCausalLM); to train or convert a model further, write it with --format npas "
                          "(the default), or as a stock LlamaForCausalLM (--format hf --unroll)")
    bad = [a for a in archs if a not in ACCEPTED_ARCHITECTURES]
    if not archs or bad:
        raise ConfigError(f"{where}: architecture {', '.join(map(str, bad or archs)) or '(none given)'} is not "
                          f"supported; npas reads {' and '.join(ACCEPTED_ARCHITECTURES)} checkpoints (the "
                          "LLaMA layout)")
    for flag in ("attention_bias", "mlp_bias"):
        if config.get(flag):
            raise ConfigError(f"{where}: {flag} is true; npas's llama chassis has bias-free projections, so "
                              "this checkpoint cannot be read")
    act = config.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ConfigError(f"{where}: hidden_act {act!r} is not supported; npas's llama MLP is SwiGLU (silu)")
    context = config.get("max_position_embeddings", 2048)
    window = attention_window(config)
    if window is not None and window < context:
        raise ConfigError(f"{where}: sliding_window={window} is shorter than max_position_embeddings={context}, and "
                          f"transformers applies it whatever use_sliding_window says; npas attends over the whole "
                          f"context, so this model cannot be read (if it was trained without a window, set "
                          f"sliding_window to null in its config.json)")
    theta, scaling = _rope(config, where)
    try:
        d, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        chassis = Chassis(
            vocab_size=int(config["vocab_size"]), context=int(context), d_model=d,
            n_layers=int(config["num_hidden_layers"]), n_heads=heads, d_ff=int(config["intermediate_size"]),
            activation="swiglu", family="llama",
            n_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or d // heads), rope_theta=theta,
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            # LlamaConfig's default is untied; Mistral's too
            tie_embeddings=bool(config.get("tie_word_embeddings", False)), rope_scaling=scaling)
    except (KeyError, TypeError, ValueError) as err:
        raise ConfigError(f"{where}: missing or malformed field {err}; re-save it with save_pretrained") from None
    problems = chassis.problems()
    if problems:
        raise ConfigError(f"{where}: {problems[0]}")
    return chassis


def weight_files(d: Path) -> list[Path]:
    """The safetensors files holding a checkpoint's weights (the index's shards, or model.safetensors)."""
    if (d / HF_INDEX).is_file():
        try:
            index = json.loads((d / HF_INDEX).read_text(encoding="utf-8"))
            shards = sorted(set(index["weight_map"].values()))
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, AttributeError, TypeError) as err:
            raise DataError(f"{d / HF_INDEX} is not a safetensors index ({err}); re-save the model") from None
        if bad := [s for s in shards if not _is_shard_name(s)]:
            raise DataError(f"{d / HF_INDEX}: weight_map must map each tensor to a file name in {d}, got "
                            f"{bad[0]!r}; re-save the model with save_pretrained")
        missing = [s for s in shards if not (d / s).is_file()]
        if missing:
            raise DataError(f"{d}: shards {missing[:3]} named in {HF_INDEX} are missing; copy the whole directory")
        return [d / s for s in shards]
    if (d / HF_WEIGHTS).is_file():
        return [d / HF_WEIGHTS]
    pickles = sorted(p.name for p in d.glob("*.bin"))
    if pickles:
        raise DataError(f"{d} holds only pickled weights ({', '.join(pickles[:2])}); npas reads safetensors only, "
                        "because loading a pickle runs arbitrary code; re-save it with "
                        "save_pretrained(dir, safe_serialization=True)")
    raise DataError(f"{d} has no {HF_WEIGHTS} or {HF_INDEX}; pass a directory written by save_pretrained")


def _is_shard_name(name: object) -> bool:
    """A file name inside the checkpoint's directory: a string, relative, never climbing out of it (an
    index naming /etc/passwd or ../other/model.safetensors would read a file the directory does not hold)."""
    if not isinstance(name, str) or not name.strip():
        return False
    p = Path(name)
    return not p.is_absolute() and ".." not in p.parts and p.name not in ("", ".")


def fingerprint_hf_weights(d: str | Path) -> str:
    """sha256 (16 hex) over a checkpoint's safetensors files in order: which source a study started from."""
    h = hashlib.sha256()
    for path in weight_files(Path(d)):
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:16]


def read_hf_state(d: Path) -> dict[str, Tensor]:
    """Every tensor of the checkpoint under its Hugging Face name, in its stored dtype."""
    state: dict[str, Tensor] = {}
    for path in weight_files(d):
        try:
            with safe_open(str(path), framework="pt") as f:
                for k in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    state[k] = f.get_tensor(k)
        except (SafetensorError, OSError) as err:
            raise DataError(f"cannot read {path}: {str(err).splitlines()[0]}; the file is damaged") from None
    return state


def npas_names(chassis: Chassis) -> dict[str, str]:
    """Hugging Face name -> npas name of the untied uniform allocation of `chassis` (LLAMA_HF_NAMES)."""
    out = {f"{LLAMA_HF_NAMES[n]}.weight": f"{n}.weight" for n in ("wte", "ln_f")}
    if not chassis.tie_embeddings:
        out["lm_head.weight"] = "lm_head.weight"
    for i in range(chassis.n_layers):
        for slot in ("attn_q", "attn_k", "attn_v", "attn_o", "mlp_gate", "mlp_up", "mlp_down"):
            out[f"model.layers.{i}.{LLAMA_HF_NAMES[slot]}.weight"] = f"blocks.{i}.{slot}"
        for ln in ("ln_1", "ln_2"):
            out[f"model.layers.{i}.{LLAMA_HF_NAMES[ln]}.weight"] = f"h.{i}.{ln}.weight"
    return out


@dataclass
class HFCheckpoint:
    """A Hugging Face checkpoint read as npas's untied reference allocation of its chassis."""

    dir: Path
    cfg: ArchConfig  # the untied uniform allocation, dtype = the source's
    model: TransformerLM  # fp32
    dtype: str  # the stored weights' dtype: float32, bfloat16 or float16
    tokenizer: Any  # npas Tokenizer from tokenizer.json, or None
    tokenizer_note: str | None  # why there is no usable tokenizer (None when there is one)


def read_hf_tokenizer(d: Path, vocab_size: int) -> tuple[Any, str | None]:
    """(tokenizer, None) from tokenizer.json, or (None, the one-line reason there is none usable).

    A tokenizer with fewer tokens than the model's `vocab_size` is usable: checkpoints often pad the
    embedding to a multiple of 64 or 128 for faster matmuls, and the rows past the tokenizer's ids are
    never read (the model keeps them; npas's sampler never emits them). More tokens than rows is not."""
    if not (d / TOKENIZER_JSON).is_file():
        what = f"only {SENTENCEPIECE}" if (d / SENTENCEPIECE).is_file() else "no tokenizer"
        return None, f"{d} has {what} (npas reads tokenizer.json)"
    tok = tokenizer_from_json((d / TOKENIZER_JSON).read_text(encoding="utf-8"), name=str(d / TOKENIZER_JSON))
    if tok.vocab_size > vocab_size:
        return tok, (f"{d / TOKENIZER_JSON} has {tok.vocab_size} tokens but the model's vocab_size is only "
                     f"{vocab_size}")
    return tok, None


def read_hf_dir(path: str | Path) -> HFCheckpoint:
    """Read a checkpoint directory; every refusal is one line naming the problem and the fix."""
    d = Path(path).expanduser()
    where = str(d / HF_CONFIG)
    try:
        config = json.loads((d / HF_CONFIG).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{d} has no {HF_CONFIG}; pass a directory written by save_pretrained") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(f"{where} is not valid JSON ({err}); re-save the model") from None
    if not isinstance(config, dict):
        raise DataError(f"{where} is not a JSON object; re-save the model")
    chassis = hf_chassis(config, where)
    state = read_hf_state(d)
    names = npas_names(chassis)
    ignored = {"lm_head.weight"} if chassis.tie_embeddings else set()  # a tied head saved anyway is wte
    unknown = sorted(k for k in state if k not in names and k not in ignored and not k.endswith("rotary_emb.inv_freq"))
    missing = sorted(k for k in names if k not in state)
    if unknown or missing:
        raise DataError(f"{d}: the weights are not the LLaMA layout its config.json describes (unexpected "
                        f"{unknown[:3]}, missing {missing[:3]}); re-save it with save_pretrained")
    if ints := sorted(k for k in names if not state[k].is_floating_point()):
        raise DataError(f"{d}: {ints[0]} is stored as {str(state[ints[0]].dtype).removeprefix('torch.')}, not "
                        "floating point (a quantized checkpoint?); npas reads float32, bfloat16 and float16 "
                        "weights: save the model dequantized")
    dtypes = {str(state[k].dtype).removeprefix("torch.") for k in names}
    dtype = "float32" if len(dtypes) > 1 or not dtypes <= set(_DTYPES) else dtypes.pop()
    cfg = reference_config(chassis, dtype)  # type: ignore[arg-type]
    model = build_model(cfg).float()
    try:
        model.load_state_dict({names[k]: state[k].float() for k in names}, strict=True)
    except RuntimeError as err:
        raise DataError(f"{d}: a tensor's shape does not match its config.json ({str(err).splitlines()[-1].strip()})"
                        "; re-save it with save_pretrained") from None

    check_finite(model, d)
    tokenizer, note = read_hf_tokenizer(d, chassis.vocab_size)
    model.eval()
    return HFCheckpoint(d, cfg, model, dtype, tokenizer, note)


__all__ = ["ACCEPTED_ARCHITECTURES", "HFCheckpoint", "INSTALL_HF", "fingerprint_hf_weights", "hf_chassis",
           "is_hf_dir", "read_hf_dir", "require_transformers"]
