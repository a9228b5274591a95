"""The parts an allocation names besides its chassis: parameter banks, atom dictionaries, expert pools,
and the closed choices and constants of its fields (generators, dtypes, LoRA scaling, KV sharing).

Why a module of its own: these are the vocabulary that reading an allocation file (`schema`), checking
it (`validation`), the allocation itself (`config`), the space that samples one and the modules that
build one all share; they depend on nothing but each other, so they sit below all of those.
`npas.allocation.config` re-exports them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

Generator = Literal["tie", "slice", "tile", "template_mix", "hash"]
DType = Literal["float32", "bfloat16", "float16"]
LoraScaling = Literal["standard", "rslora"]
KvMode = Literal["kv", "v"]  # cross-layer sharing of keys and values, or of values only
AtomScope = Literal["layer", "block"]  # atom coefficients per depth position, or per unique block
ExpertRouter = Literal["per_layer", "shared"]  # a router per layer, or one per expert pool read by all its layers

# LoRA deltas are scaled alpha / r (PEFT's convention; rslora: alpha / sqrt(r)) with alpha fixed
# across ranks, so the update size of a delta does not grow with r and a rank sweep is not also a
# learning-rate sweep. 16 is a common PEFT setting (r = 8..16 gives a scale of 1..2 at the proxy's
# ranks 4..16); B starts at zero, so alpha changes how fast a delta learns, never the initial model.
DEFAULT_LORA_ALPHA = 16.0

# `dtype` is the dtype the allocation's weights are stored and exported in: `build_model` returns
# parameters of that dtype, `count(...).param_bytes` and `inference_bytes` count its size, and the
# safetensors weights `npas train` writes hold it. Training keeps fp32 master weights whatever the
# dtype (the proxy casts the built model up; low-precision AdamW states lose small updates on CPU),
# so the training-memory estimate counts 4 bytes for weights and for gradients.
DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}

# A hash bank's default tile (elements read contiguously per hashed offset) and the seeds its mapping
# takes: the hash works modulo the prime 2**31 - 1, so a seed is one residue of it.
DEFAULT_HASH_TILE = 32
HASH_SEED_LIMIT = 2**31 - 1


@dataclass(frozen=True)
class Bank:
    """A shared parameter bank (Shapeshifter-style) and the block slots it generates.

    `members` are (block, slot) pairs. `size` is the flat length of one template; `templates` is T
    for `template_mix` (1 otherwise). Generators:
      tie          - every member is the leading n elements of the bank (nested slice); size >= max n
      slice        - member i reads a circular window at an offset spread over the bank; size = sum n
                     is exactly untied, size = max n nearly tied, in between partial overlap
      tile         - every member repeats the bank to its length (SSN 'repeat'); size <= max n
      template_mix - member i is (coef[i] @ templates)[:n], tiled when templates are shorter than n;
                     T templates, learned per-member coefficients (m, T)
      hash         - randomized parameter sharing (ROAST / STABLE-RPS): the members' weights, cut into
                     tiles of `tile` consecutive elements, each read contiguously, with a sign, from a
                     hashed offset into one array of `size` (npas.allocation.hashing); `seed` fixes the
                     mapping; tile <= size <= sum n, and size = sum n reads every element exactly once
    `tile` and `seed` belong to `hash` alone (0 for the other generators).
    """

    members: tuple[tuple[int, str], ...]
    generator: Generator
    size: int
    templates: int = 1
    tile: int = 0  # hash: elements per tile (read contiguously from the array)
    seed: int = 0  # hash: the mapping's seed, 0 <= seed < HASH_SEED_LIMIT


@dataclass(frozen=True)
class AtomSpec:
    """One projection type generated from a shared dictionary of matrix atoms (MASA).

    Every layer (or block, with scope "block") that reads `slot` gets its (d, d) weight as
    sum_k coef[row, k] * atoms[k]: `n_atoms` atoms of d x d shared across depth, plus one row of
    `n_atoms` coefficients per reader. Stored: n_atoms * d^2 + rows * n_atoms. On a llama chassis
    an atom has the slot's shape (Chassis.slot_shape: GQA's K/V atoms are n_kv_heads x head_dim by d).
    """

    slot: str  # one of attn_q, attn_k, attn_v, attn_o
    n_atoms: int
    scope: AtomScope = "layer"


@dataclass(frozen=True)
class ExpertPool:
    """The MLP as a mixture of experts drawn from pools shared across layers (UniPool / MoEUT / WideNet).

    Pool p stores `pool_sizes[p]` experts, each an MLP of width `d_expert` (up/down, plus gate for
    SwiGLU). Layer i's router scores the experts of pool `pool_of_layer[i]` and each token runs its
    `top_k` best, weighted by their router probabilities. One pool read by every layer is the global
    pool; one pool per layer of E experts is the per-layer MoE. Routers are per layer (d x P rows
    each) or, with `router: shared`, one per pool. `balance_weight` scales the Switch-style
    load-balancing loss (pool size x sum_e f_e P_e, over the pool's layers) added to the training loss.
    Stored: sum(pool_sizes) x experts' matrices + routers; a token activates k experts per layer.
    """

    pool_sizes: tuple[int, ...]
    pool_of_layer: tuple[int, ...]
    d_expert: int
    top_k: int = 1
    router: ExpertRouter = "per_layer"
    balance_weight: float = 0.01

    @property
    def n_experts(self) -> int:
        return sum(self.pool_sizes)

    def router_rows(self) -> tuple[int, ...]:
        """Experts each stored router scores: one router per layer, or one per pool."""
        if self.router == "shared":
            return self.pool_sizes
        return tuple(self.pool_sizes[p] for p in self.pool_of_layer)

    def to_dict(self) -> dict[str, Any]:
        return {"pool_sizes": list(self.pool_sizes), "pool_of_layer": list(self.pool_of_layer),
                "d_expert": self.d_expert, "top_k": self.top_k, "router": self.router,
                "balance_weight": self.balance_weight}


def lora_scale(alpha: float, rank: int, scaling: str = "standard") -> float:
    """alpha / r (PEFT's LoRA) or alpha / sqrt(r) (rsLoRA, stable as r grows); 0 at rank 0."""
    if rank <= 0:
        return 0.0
    return alpha / (math.sqrt(rank) if scaling == "rslora" else rank)
