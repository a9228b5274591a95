"""The chassis: the architecture family and the fixed dimensions every allocation of it shares.

Why a module of its own: a chassis is what a space file, an allocation, a trained directory and a
Hugging Face checkpoint all agree on before anything is shared or narrowed, and its checks are the
first ones user input meets. The llama family's own checks (`llama_problems`) follow Hugging Face's
conventions (grouped-query K/V heads, an explicit head_dim, the rotary base and its `rope_scaling`
types, RMSNorm's epsilon, a tied or untied head); `Chassis.problems` runs them for a space file, an
allocation and a checkpoint's config.json (`npas.conversion.hf_source.hf_chassis`) alike, so a value is
refused in the same words wherever it comes from. The weight slots live in `npas.allocation.slots`;
`npas.allocation.config` re-exports the public names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

from npas.allocation.slots import slot_shape

Activation = Literal["gelu", "swiglu"]
# The architecture family of the chassis. classic: bias-free LayerNorm, a learned absolute position
# table, full multi-head attention (npas's original chassis; not GPT-2: no biases anywhere). llama:
# Hugging Face LlamaForCausalLM's conventions -- RMSNorm (fp32, eps), rotary positions (no position
# table), grouped-query attention (n_kv_heads dividing n_heads, head_dim explicit when it is not
# d_model / n_heads) and a tied or untied output head. A config without `family` is classic.
Family = Literal["classic", "llama"]

# Upper bounds of a chassis' dimensions: far above any model npas trains, low enough that counting a
# reference (tuples of per-layer widths, products of sizes) stays cheap and exact for absurd inputs.
CHASSIS_MAX: dict[str, int] = {"vocab_size": 2**22, "context": 2**20, "d_model": 2**16, "n_layers": 2**12,
                               "n_heads": 2**12, "d_ff": 2**18}
# Defaults of the llama-only fields (Hugging Face LlamaConfig's rope_theta and rms_norm_eps). A classic
# chassis keeps every one of them at its default, and its serialisation omits them (old hashes hold).
LLAMA_DEFAULTS: dict[str, Any] = {"n_kv_heads": 0, "head_dim": 0, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
                                  "tie_embeddings": True, "rope_scaling": None}
# llama-only dimensions: 0 means "derived" (n_kv_heads = n_heads, head_dim = d_model / n_heads)
LLAMA_MAX: dict[str, int] = {"n_kv_heads": 2**12, "head_dim": 2**12}
# Hugging Face rope_scaling types npas's rotary embedding computes (`layer_ops.rotary`), and the keys each reads
ROPE_SCALING_KEYS: dict[str, tuple[str, ...]] = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}


@dataclass(frozen=True)
class Chassis:
    """The architecture family and its fixed dimensions: a pre-norm decoder-only transformer LM.

    `family` picks the norms, positions and attention (see `Family`); the fields after it apply to
    the llama family only and stay at their defaults on a classic chassis."""

    vocab_size: int  # characters for the bundled corpus (68)
    context: int  # maximum sequence length; classic: learned position embeddings; llama: rotary
    d_model: int
    n_layers: int
    n_heads: int  # must divide d_model (llama: unless head_dim is given)
    d_ff: int  # MLP width of the uniform reference; tapers keep the mean
    activation: Activation = "gelu"
    family: Family = "classic"
    n_kv_heads: int = 0  # llama: key/value heads (grouped-query attention), dividing n_heads; 0 = n_heads
    head_dim: int = 0  # llama: width of one head, even (rotary pairs); 0 = d_model / n_heads
    rope_theta: float = 10000.0  # llama: rotary base, inv_freq = 1 / theta^(2i / head_dim)
    rms_norm_eps: float = 1e-6  # llama: RMSNorm's epsilon
    tie_embeddings: bool = True  # llama: the output head reads the token embedding (False: own lm_head)
    # llama: Hugging Face's rope_scaling ({"rope_type": "linear" | "llama3", "factor": ..., ...}); None: plain
    # rotary. Held as sorted (key, value) pairs so the chassis stays hashable; written back as a mapping
    rope_scaling: Any = None

    def __post_init__(self) -> None:
        # one canonical form, so equal models hash equal: derived dimensions are stored as 0
        def is_int(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        if is_int(self.n_kv_heads) and is_int(self.n_heads) and self.n_kv_heads == self.n_heads:
            object.__setattr__(self, "n_kv_heads", 0)
        if (is_int(self.head_dim) and is_int(self.d_model) and is_int(self.n_heads) and self.n_heads > 0
                and self.d_model % self.n_heads == 0 and self.head_dim == self.d_model // self.n_heads):
            object.__setattr__(self, "head_dim", 0)
        for name in ("rope_theta", "rms_norm_eps"):  # 10000 and 10000.0 are one chassis
            v = getattr(self, name)
            if is_int(v):
                object.__setattr__(self, name, float(v))
        if isinstance(self.rope_scaling, dict):
            object.__setattr__(self, "rope_scaling", tuple(sorted(self.rope_scaling.items())))

    @property
    def rope(self) -> dict[str, Any]:
        """rope_scaling as a mapping ({} for plain rotary positions)."""
        return dict(self.rope_scaling or ())

    def problems(self) -> list[str]:
        out = _int_problems(self, CHASSIS_MAX, 1, "a positive integer")
        if self.activation not in get_args(Activation):
            out.append(f"chassis.activation: {self.activation!r} is not one of {list(get_args(Activation))}")
        if self.family not in get_args(Family):
            out.append(f"chassis.family: {self.family!r} is not one of {list(get_args(Family))}")
        if out:
            return out
        if self.family == "classic":
            extra = [k for k, v in LLAMA_DEFAULTS.items() if getattr(self, k) != v]
            if extra:
                out.append(f"chassis: {', '.join(extra)} apply to family llama only; set family: llama or "
                           f"remove them")
            elif self.d_model % self.n_heads:
                out.append(f"chassis: n_heads={self.n_heads} does not divide d_model={self.d_model}; "
                           f"pick d_model a multiple of n_heads")
            return out
        return out + llama_problems(self)

    @property
    def llama(self) -> bool:
        return self.family == "llama"

    @property
    def head_size(self) -> int:
        """Width of one attention head: head_dim, or d_model / n_heads when it is derived."""
        return self.head_dim or self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads: n_kv_heads, or n_heads (full multi-head attention)."""
        return self.n_kv_heads or self.n_heads

    @property
    def q_dim(self) -> int:
        """Width of the queries and of the attention output: n_heads x head_dim (d_model on classic)."""
        return self.n_heads * self.head_size

    @property
    def kv_dim(self) -> int:
        """Width of the keys and of the values: n_kv_heads x head_dim (d_model on classic)."""
        return self.kv_heads * self.head_size

    @property
    def width_step(self) -> int:
        """How far the `all` width fit steps d_model: by n_heads, and by 2 x n_heads on a llama chassis
        whose head_dim is derived (it must stay even for the rotary pairs)."""
        return 2 * self.n_heads if self.llama and not self.head_dim else self.n_heads

    def slot_shape(self, slot: str, width: int) -> tuple[int, int]:
        """(out, in) of a block slot for an MLP of `width`, with this chassis' attention widths."""
        return slot_shape(slot, self.d_model, width, self.q_dim, self.kv_dim)

    def to_dict(self) -> dict[str, Any]:
        """The chassis as written in an allocation: a classic chassis is the seven fields it always had
        (so files and hashes written before families existed hold); a llama chassis writes its family,
        its K/V heads and rotary/norm constants, and head_dim only when it is not d_model / n_heads."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.family == "classic":
            for k in ("family", *LLAMA_DEFAULTS):
                del d[k]
            return d
        d["n_kv_heads"] = self.kv_heads
        if not self.head_dim:
            del d["head_dim"]
        if self.rope_scaling is None:  # llama chassis written before rope scaling existed keep their hashes
            del d["rope_scaling"]
        else:
            d["rope_scaling"] = self.rope
        return d



def _int_problems(ch: Chassis, tops: dict[str, int], low: int, must: str) -> list[str]:
    """The integer fields named in ``tops`` that are not integers from ``low`` up to their largest size."""
    out = []
    for name, top in tops.items():
        v = getattr(ch, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            out.append(f"chassis.{name}: must be {must}, got {v!r}")
        elif v > top:
            out.append(f"chassis.{name}: {v:,} is above the largest npas builds ({top:,}); lower it")
    return out


def llama_problems(ch: Chassis) -> list[str]:
    """Why a llama chassis is not one npas builds: its K/V heads, head width, rotary and norm constants."""
    out = _int_problems(ch, LLAMA_MAX, 0, "an integer >= 0 (0: derived)")
    for name in ("rope_theta", "rms_norm_eps"):
        v = getattr(ch, name)
        if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
            out.append(f"chassis.{name}: must be a finite number > 0, got {v!r}")
    if not isinstance(ch.tie_embeddings, bool):
        out.append(f"chassis.tie_embeddings: must be true or false, got {ch.tie_embeddings!r}")
    out += rope_scaling_problems(ch.rope_scaling)
    if out:
        return out
    if not ch.head_dim and ch.d_model % ch.n_heads:
        out.append(f"chassis: n_heads={ch.n_heads} does not divide d_model={ch.d_model}; pick d_model a "
                   f"multiple of n_heads, or give head_dim explicitly")
    elif ch.head_size % 2:
        out.append(f"chassis: head_dim={ch.head_size} is odd; rotary embeddings rotate pairs of channels, "
                   f"so pick an even head_dim (d_model a multiple of 2 x n_heads)")
    if ch.n_heads % ch.kv_heads:
        out.append(f"chassis: n_kv_heads={ch.kv_heads} does not divide n_heads={ch.n_heads}; grouped-query "
                   f"attention gives each K/V head the same number of query heads")
    return out


def rope_scaling_problems(rope_scaling: Any) -> list[str]:
    """Why a rope_scaling value is not one npas computes (empty when it is, or is None)."""
    if rope_scaling is None:
        return []
    if not isinstance(rope_scaling, tuple | dict):
        return [f"chassis.rope_scaling: must be a mapping or null, got {rope_scaling!r}"]
    d = dict(rope_scaling)
    kind = d.get("rope_type", d.get("type"))
    if kind not in ROPE_SCALING_KEYS:
        return [f"chassis.rope_scaling: rope_type {kind!r} is not supported; npas computes the default rotary "
                f"embedding and rope_type {' or '.join(ROPE_SCALING_KEYS)}"]
    bad = [k for k in ROPE_SCALING_KEYS[kind] if isinstance(d.get(k), bool)
           or not isinstance(d.get(k), int | float) or not d[k] > 0]
    if bad:
        return [f"chassis.rope_scaling: {kind} needs positive numbers {list(ROPE_SCALING_KEYS[kind])}, "
                f"got {d!r}"]
    return []

