"""Validation of an allocation's parts: every reason one cannot be built, named at once.

`ArchConfig.problems` runs these checks in order and adds the one rule that needs the whole allocation
(which block stores which slot); a non-empty list becomes one ConfigError. They take the parts, not the
allocation, so the allocation's module imports them and nothing here imports it back.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, get_args

from npas.allocation.parts import (
    DTYPE_BYTES,
    HASH_SEED_LIMIT,
    AtomScope,
    AtomSpec,
    Bank,
    ExpertPool,
    ExpertRouter,
    Generator,
    KvMode,
    LoraScaling,
)
from npas.allocation.schema import SCHEMA_VERSION
from npas.allocation.slots import ATTN_SLOTS

PER_LAYER = ("mlp_widths", "block_of_layer", "lora_attn", "lora_mlp", "kv_source")  # one entry per layer each


def layer_problems(version: Any, n_layers: int, per_layer: dict[str, tuple]) -> list[str]:
    """The schema version, and one integer per layer in each of `PER_LAYER`."""
    out = []
    if version != SCHEMA_VERSION:
        out.append(f"version: {version} is not the supported schema version {SCHEMA_VERSION}")
    for name in PER_LAYER:
        seq = per_layer[name]
        if len(seq) != n_layers:
            out.append(f"{name}: needs one entry per layer ({n_layers}), got {len(seq)}")
        elif any(not isinstance(v, int) or isinstance(v, bool) for v in seq):
            out.append(f"{name}: entries must be integers, got {list(seq)}")
    return out


def width_problems(mlp_widths: tuple[int, ...], ranks: tuple[int, ...]) -> list[str]:
    out = []
    if min(mlp_widths) < 1:
        out.append(f"mlp_widths: every width must be >= 1, got {list(mlp_widths)}")
    if min(ranks) < 0:
        out.append("lora ranks must be >= 0")
    return out


def tying_problems(block_of_layer: tuple[int, ...]) -> list[str]:
    """Blocks numbered 0..U-1 in order of first use: one spelling per tying map, so equal models hash equal."""
    seen: list[int] = []
    for b in block_of_layer:
        if b not in seen:
            seen.append(b)
    if seen != list(range(len(seen))):
        return [f"block_of_layer: blocks must be numbered 0..U-1 in order of first use, got {list(block_of_layer)}"]
    return []


def sharing_problems(kv_source: tuple[int, ...], kv_mode: Any, atoms: tuple[AtomSpec, ...]) -> list[str]:
    """KV sources must be earlier sources; atom specs one per attention slot, with readers."""
    out = []
    src = kv_source
    bad = [i for i, s in enumerate(src) if not 0 <= s <= i or src[s] != s]
    if bad:
        out.append(f"kv_source: layer i must read K/V of a layer s <= i that is its own source "
                   f"(kv_source[s] == s); layers {bad} do not in {list(src)}")
    if kv_mode not in get_args(KvMode):
        out.append(f"kv_mode: {kv_mode!r} is not one of {list(get_args(KvMode))}")
    seen: set[str] = set()
    for k, a in enumerate(atoms):
        if a.slot not in ATTN_SLOTS or a.slot in seen:
            out.append(f"atoms[{k}].slot: {a.slot!r} must be one of {list(ATTN_SLOTS)}, each at most once")
        seen.add(a.slot)
        if not isinstance(a.n_atoms, int) or isinstance(a.n_atoms, bool) or a.n_atoms < 1:
            out.append(f"atoms[{k}].n_atoms: must be an integer >= 1, got {a.n_atoms!r}")
        if a.scope not in get_args(AtomScope):
            out.append(f"atoms[{k}].scope: {a.scope!r} is not one of {list(get_args(AtomScope))}")
    return out  # layer 0 is always a KV source, so every atom dictionary has a reader


def expert_problems(e: ExpertPool | None, n_layers: int, lora_mlp: tuple[int, ...]) -> list[str]:
    """Pools with readers and at least top_k experts, one pool per layer, no MLP LoRA."""
    if e is None:
        return []
    out = []
    L = n_layers

    def ints(seq: object) -> bool:
        return isinstance(seq, tuple) and bool(seq) and all(isinstance(v, int) and not isinstance(v, bool)
                                                            for v in seq)

    if not ints(e.pool_sizes) or min(e.pool_sizes) < 1:
        return [f"experts.pool_sizes: must be a non-empty list of integers >= 1, got {e.pool_sizes!r}"]
    if not ints(e.pool_of_layer) or len(e.pool_of_layer) != L:
        return [f"experts.pool_of_layer: needs one pool index per layer ({L}), got {e.pool_of_layer!r}"]
    n = len(e.pool_sizes)
    if sorted(set(e.pool_of_layer)) != list(range(n)):
        out.append(f"experts.pool_of_layer: must read each of the {n} pools and only those (0..{n - 1}), "
                   f"got {list(e.pool_of_layer)}")
    for name in ("d_expert", "top_k"):
        v = getattr(e, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            out.append(f"experts.{name}: must be an integer >= 1, got {v!r}")
    if not out and e.top_k > min(e.pool_sizes):
        out.append(f"experts.top_k: {e.top_k} is more than the smallest pool's {min(e.pool_sizes)} experts; "
                   f"lower top_k or grow the pool")
    if e.router not in get_args(ExpertRouter):
        out.append(f"experts.router: {e.router!r} is not one of {list(get_args(ExpertRouter))}")
    bw = e.balance_weight
    if not isinstance(bw, int | float) or isinstance(bw, bool) or not math.isfinite(bw) or bw < 0:
        out.append(f"experts.balance_weight: must be a finite number >= 0, got {bw!r}")
    if any(lora_mlp):
        out.append("lora_mlp: experts replace the dense MLP and take no LoRA; set lora_mlp to zeros")
    return out


def scalar_problems(lora_alpha: Any, lora_scaling: Any, dtype: Any) -> list[str]:
    out = []
    if (not isinstance(lora_alpha, int | float) or isinstance(lora_alpha, bool)
            or not math.isfinite(lora_alpha) or lora_alpha <= 0):
        out.append(f"lora_alpha: must be a positive finite number, got {lora_alpha!r}")
    if lora_scaling not in get_args(LoraScaling):
        out.append(f"lora_scaling: {lora_scaling!r} is not one of {list(get_args(LoraScaling))}")
    if dtype not in DTYPE_BYTES:
        out.append(f"dtype: {dtype!r} is not one of {sorted(DTYPE_BYTES)}")
    return out


def bank_problems(banks: tuple[Bank, ...], slots: set[str], n_blocks: int, stores: Callable[[int, str], bool],
                  numel: Callable[[int, str], int]) -> list[str]:
    """Each bank's generator, members and sizes: a member must be a slot its block stores (`stores`, the
    allocation's rule) and in one bank only; `numel` gives a member's element count."""
    out = []
    owner: dict[tuple[int, str], int] = {}
    for k, bank in enumerate(banks):
        if bank.generator not in get_args(Generator):
            out.append(f"banks[{k}].generator: {bank.generator!r} is not one of {list(get_args(Generator))}")
            continue
        if not bank.members:
            out.append(f"banks[{k}]: has no members")
            continue
        for blk, slot in bank.members:
            if slot not in slots or not 0 <= blk < n_blocks:
                out.append(f"banks[{k}]: member ({blk}, {slot!r}) is not a block slot of this chassis")
            elif not stores(blk, slot):
                out.append(f"banks[{k}]: member ({blk}, {slot!r}) is not stored by its block (atoms generate "
                           f"it, or every layer of the block reads another layer's K/V)")
            elif (blk, slot) in owner:
                out.append(f"banks[{k}]: member ({blk}, {slot!r}) already belongs to banks[{owner[blk, slot]}]")
            else:
                owner[blk, slot] = k
        if any(k == v for v in owner.values()):
            sizes = [numel(*m) for m in bank.members if owner.get(m) == k]
            out.extend(_size_problems(k, bank, sizes))
    return out


def _size_problems(k: int, bank: Bank, sizes: list[int]) -> list[str]:
    out = []
    if bank.size < 1 or bank.templates < 1:
        out.append(f"banks[{k}]: size and templates must be >= 1, got size={bank.size} templates={bank.templates}")
    elif bank.generator == "tie" and bank.size < max(sizes):
        out.append(f"banks[{k}]: {bank.generator} needs size >= largest member ({max(sizes)}), got {bank.size}")
    elif bank.generator != "template_mix" and bank.templates != 1:
        out.append(f"banks[{k}]: templates={bank.templates} only applies to template_mix")
    out.extend(_hash_problems(k, bank, sizes))
    return out


def _hash_problems(k: int, bank: Bank, sizes: list[int]) -> list[str]:
    """A hash bank reads whole tiles from an array no smaller than one tile and no larger than its
    members (a larger array would hold elements no weight reads); the other generators take no tile or seed."""
    if bank.generator != "hash":
        if bank.tile or bank.seed:
            return [f"banks[{k}]: tile={bank.tile} and seed={bank.seed} only apply to generator hash; remove them"]
        return []
    out = []
    if not isinstance(bank.tile, int) or isinstance(bank.tile, bool) or bank.tile < 1:
        out.append(f"banks[{k}].tile: a hash bank needs a tile of >= 1 elements, got {bank.tile!r}")
    elif not bank.tile <= bank.size <= sum(sizes):
        out.append(f"banks[{k}]: hash needs tile ({bank.tile}) <= size <= its members' elements ({sum(sizes)}), "
                   f"got size {bank.size}")
    if not isinstance(bank.seed, int) or isinstance(bank.seed, bool) or not 0 <= bank.seed < HASH_SEED_LIMIT:
        out.append(f"banks[{k}].seed: must be an integer in [0, {HASH_SEED_LIMIT}), got {bank.seed!r}")
    return out
