"""The checks of a llama chassis: the fields Hugging Face's LlamaConfig adds to npas's dimensions.

Why a module of its own: these checks follow Hugging Face's conventions (grouped-query K/V heads, an
explicit head_dim, the rotary base and its `rope_scaling` types, RMSNorm's epsilon, a tied or untied
head) and grow with each checkpoint family npas reads, while `Chassis` itself only holds dimensions,
the same for every family. `Chassis.problems` runs them for a space file, an allocation and a
checkpoint's config.json (`npas.conversion.hf_source.hf_chassis`) alike, so a value is refused in the
same words wherever it comes from. `npas.allocation.config` re-exports the public names.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from npas.allocation.chassis import Chassis

# llama-only dimensions: 0 means "derived" (n_kv_heads = n_heads, head_dim = d_model / n_heads)
LLAMA_MAX: dict[str, int] = {"n_kv_heads": 2**12, "head_dim": 2**12}
# Hugging Face rope_scaling types npas's rotary embedding computes (`transformer.rotary`), and the keys each reads
ROPE_SCALING_KEYS: dict[str, tuple[str, ...]] = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}


def llama_problems(ch: Chassis) -> list[str]:
    """Why a llama chassis is not one npas builds: its K/V heads, head width, rotary and norm constants."""
    out = []
    for name, top in LLAMA_MAX.items():
        v = getattr(ch, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            out.append(f"chassis.{name}: must be an integer >= 0 (0: derived), got {v!r}")
        elif v > top:
            out.append(f"chassis.{name}: {v:,} is above the largest npas builds ({top:,}); lower it")
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

