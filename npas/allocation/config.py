"""The allocation (`ArchConfig`): one complete candidate as plain, frozen, hashable data.

An allocation is what a search samples, what `export` writes and what `build_model` reads, so it is
fully explicit: every layer's MLP width, the layer -> block tying map, every parameter bank with its
members, generator and sizes, every LoRA rank. Nothing in it depends on the search space that
produced it, which is why a YAML file of it rebuilds the exact module on any machine.

The chassis with its llama checks (`npas.allocation.chassis`), the weight slots
(`npas.allocation.slots`) and the parts an allocation names (`npas.allocation.parts`: banks, atom
dictionaries, expert pools, the fields' closed choices) live in modules of their own, and so do reading
a file (`schema`) and the parts' checks (`validation`); the public names are re-exported here, so
`from npas.allocation.config import Chassis, Bank` keeps working.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, fields
from functools import cached_property
from typing import Any

import yaml

from npas.allocation.chassis import (
    CHASSIS_MAX,
    LLAMA_DEFAULTS,
    LLAMA_MAX,
    ROPE_SCALING_KEYS,
    Activation,
    Chassis,
    Family,
    llama_problems,
    rope_scaling_problems,
)
from npas.allocation.lora_sharing import LoraSharing, rank_problems, sharing_field_problems
from npas.allocation.parts import (
    DEFAULT_LORA_ALPHA,
    DTYPE_BYTES,
    AtomScope,
    AtomSpec,
    Bank,
    DType,
    ExpertPool,
    ExpertRouter,
    Generator,
    KvMode,
    LoraScaling,
    lora_scale,
)
from npas.allocation.recursion import RecursionSpec, recursion_problems
from npas.allocation.schema import SCHEMA_VERSION, json_mapping, read_allocation, yaml_mapping
from npas.allocation.slots import ATTN_SLOTS, MLP_SLOTS, block_slots, slot_shape
from npas.allocation.validation import (
    PER_LAYER,
    bank_problems,
    expert_problems,
    layer_problems,
    scalar_problems,
    sharing_problems,
    tying_problems,
    width_problems,
)
from npas.errors import ConfigError


@dataclass(frozen=True)
class ArchConfig:
    """One candidate allocation. Plain data: YAML/JSON round-trip, schema version, stable hash."""

    chassis: Chassis
    mlp_widths: tuple[int, ...]  # per layer; tied layers slice nested sub-matrices of their block
    block_of_layer: tuple[int, ...]  # tying map; blocks numbered 0..U-1 in order of first use
    banks: tuple[Bank, ...] = ()  # block slots not in any bank own a direct Parameter
    lora_attn: tuple[int, ...] = ()  # LoRA rank per layer on each of attn_q/k/v/o; () = all zero
    lora_mlp: tuple[int, ...] = ()  # LoRA rank per layer on the MLP slots
    lora_alpha: float = DEFAULT_LORA_ALPHA  # delta = lora_scale(alpha, r) * B @ A; part of the function
    lora_scaling: LoraScaling = "standard"  # standard: alpha / r (PEFT); rslora: alpha / sqrt(r)
    untied_norms: bool = True  # tied layers keep their own LayerNorms (WideNet/MoEUT differentiation)
    dtype: DType = "float32"  # dtype of the stored and exported weights (see DTYPE_BYTES)
    version: int = SCHEMA_VERSION
    # Cross-layer KV sharing: layer i attends with the keys and values computed by layer kv_source[i]
    # (itself by default). A consumer (kv_source[i] < i) reads neither attn_k nor attn_v ("kv") or
    # only not attn_v ("v"), so it owns no such projection and the KV cache holds only the sources'.
    # With tying, a block stores a K/V projection when any of its layers reads it; a tied consumer
    # simply does not read the one its block holds for a source layer.
    kv_source: tuple[int, ...] = ()
    kv_mode: KvMode = "kv"
    atoms: tuple[AtomSpec, ...] = ()  # attention slots generated from shared atom dictionaries
    # The MLP as top-k experts from pools shared across layers; None = dense MLPs. With experts no
    # block stores an MLP slot, and mlp_widths hold each layer's activated width, top_k x d_expert.
    experts: ExpertPool | None = None
    # Low-rank relaxations shared across layers (npas.allocation.lora_sharing): private LoRA, one A per
    # slot type (shared_a), VeRA's frozen pair regenerated from lora_seed (vera), or a pool of
    # lora_shards shared shards per factor with lora_private_fraction of each rank private (shards).
    lora_sharing: LoraSharing = "private"
    lora_seed: int = 0  # vera: the frozen projections' seed; shards: the per-layer indices' seed
    lora_shards: int = 0  # shards: shared rank-1 shards in each factor's pool, per slot type
    lora_private_fraction: float = 0.0  # shards: the share of each layer's rank that is its own
    # Per-token recursion depth (Mixture-of-Recursions, npas.allocation.recursion): the tying map is
    # its layout, and a router decides which tokens run each pass through the shared stack; None = off.
    recursion: RecursionSpec | None = None

    def __post_init__(self) -> None:
        L = self.chassis.n_layers
        if not self.lora_attn:
            object.__setattr__(self, "lora_attn", (0,) * L)
        if not self.lora_mlp:
            object.__setattr__(self, "lora_mlp", (0,) * L)
        if not any(self.lora_attn) and not any(self.lora_mlp):
            # with no LoRA the scale computes nothing: one canonical form, so equal models hash equal
            object.__setattr__(self, "lora_alpha", DEFAULT_LORA_ALPHA)
            object.__setattr__(self, "lora_scaling", "standard")
        self._canonical_sharing()
        if not self.kv_source:
            object.__setattr__(self, "kv_source", tuple(range(L)))
        if (self.recursion is not None and self.recursion.kv == "shared_first"
                and self.kv_source == tuple(range(L)) and self.recursion.n_layers == L):
            object.__setattr__(self, "kv_source", self.recursion.kv_source())  # the policy names its sources
        if self.kv_source == tuple(range(L)):
            object.__setattr__(self, "kv_mode", "kv")  # nothing is shared: one canonical form
        if self.experts is not None and isinstance(self.experts.top_k, int) and isinstance(self.experts.d_expert, int):
            # the widths a token activates: what activation memory and the dashboard read
            object.__setattr__(self, "mlp_widths", (self.experts.top_k * self.experts.d_expert,) * L)
        if len(set(self.block_of_layer)) == len(self.block_of_layer):
            # with no shared block, tied-or-untied norms build the same model: keep one canonical form
            object.__setattr__(self, "untied_norms", True)
        problems = self.problems()
        if problems:
            raise ConfigError("invalid allocation: " + "; ".join(problems))

    def _canonical_sharing(self) -> None:
        """Sharing fields a mode does not read take their defaults, so equal models hash equal."""
        if not any(self.lora_attn) and not any(self.lora_mlp):
            object.__setattr__(self, "lora_sharing", "private")
        if self.lora_sharing in ("private", "shared_a"):
            object.__setattr__(self, "lora_seed", 0)
        if self.lora_sharing == "vera":  # d and b are VeRA's scale: alpha / r multiplies nothing
            object.__setattr__(self, "lora_alpha", DEFAULT_LORA_ALPHA)
            object.__setattr__(self, "lora_scaling", "standard")
        if self.lora_sharing != "shards":
            object.__setattr__(self, "lora_shards", 0)
            object.__setattr__(self, "lora_private_fraction", 0.0)
        elif isinstance(self.lora_private_fraction, int) and not isinstance(self.lora_private_fraction, bool):
            object.__setattr__(self, "lora_private_fraction", float(self.lora_private_fraction))

    # ---- derived structure -------------------------------------------------------------------
    # Derived structure is cached on the (immutable) instance: accounting asks for it per slot and
    # per bank member, and the budget fit counts dozens of candidates per sample.
    @cached_property
    def n_blocks(self) -> int:
        return max(self.block_of_layer) + 1

    @cached_property
    def _members(self) -> tuple[tuple[int, ...], ...]:
        out: list[list[int]] = [[] for _ in range(self.n_blocks)]
        for i, b in enumerate(self.block_of_layer):
            out[b].append(i)
        return tuple(tuple(m) for m in out)

    @cached_property
    def _block_widths(self) -> tuple[int, ...]:
        return tuple(max(self.mlp_widths[i] for i in m) for m in self._members)

    @cached_property
    def atom_slots(self) -> frozenset[str]:
        return frozenset(a.slot for a in self.atoms)

    def kv_consumer(self, layer: int) -> bool:
        return self.kv_source[layer] != layer

    def layer_reads(self, layer: int, slot: str) -> bool:
        """Whether this depth position multiplies with `slot`'s weight (KV consumers skip K and/or V;
        with experts no layer reads a dense MLP slot)."""
        if self.experts is not None and slot.startswith("mlp"):
            return False
        if self.kv_source[layer] == layer or slot not in ("attn_k", "attn_v"):
            return True
        return slot == "attn_k" and self.kv_mode == "v"

    @cached_property
    def _block_stores(self) -> frozenset[tuple[int, str]]:
        slots = block_slots(self.chassis.activation)
        return frozenset((b, s) for b in range(self.n_blocks) for s in slots if s not in self.atom_slots
                         and any(self.layer_reads(i, s) for i in self._members[b]))

    def block_stores(self, block: int, slot: str) -> bool:
        """A block holds a slot's weight (direct or banked) unless atoms generate it or no layer reads it."""
        return (block, slot) in self._block_stores

    def atom_rows(self, spec: AtomSpec) -> tuple[int, ...]:
        """Who owns a coefficient row: the layers reading the slot, or (scope block) their blocks."""
        layers = [i for i in range(self.chassis.n_layers) if self.layer_reads(i, spec.slot)]
        if spec.scope == "layer":
            return tuple(layers)
        return tuple(sorted({self.block_of_layer[i] for i in layers}))

    def members_of(self, block: int) -> tuple[int, ...]:
        return self._members[block]

    def block_width(self, block: int) -> int:
        """A block stores the widest of its layers; narrower ones slice a nested sub-matrix."""
        return self._block_widths[block]

    def block_is_shared(self, block: int) -> bool:
        return len(self.members_of(block)) > 1

    def norms_in_layer(self, layer: int) -> bool:
        """Layers own their norms unless they share a block and norms are tied with it."""
        return self.untied_norms or not self.block_is_shared(self.block_of_layer[layer])

    def slot_shape(self, block: int, slot: str) -> tuple[int, int]:
        return self.chassis.slot_shape(slot, self.block_width(block))

    def bank_of(self) -> dict[tuple[int, str], int]:
        return {m: k for k, bank in enumerate(self.banks) for m in bank.members}

    # ---- validation --------------------------------------------------------------------------
    def problems(self) -> list[str]:
        """Every reason this allocation cannot be built, as text (empty when it can)."""
        # the parts' checks (npas.allocation.validation), each stage only once the one before it passed (a
        # later check reads what an earlier one vouched for), then what only the whole allocation knows:
        # which slots each block stores, for the banks' members
        c = self.chassis
        out = c.problems() or layer_problems(self.version, c.n_layers, {n: getattr(self, n) for n in PER_LAYER})
        if out:
            return out
        out = width_problems(self.mlp_widths, self.lora_attn + self.lora_mlp)
        if numbering := tying_problems(self.block_of_layer):
            return out + numbering
        out += sharing_problems(self.kv_source, self.kv_mode, self.atoms)
        out += expert_problems(self.experts, c.n_layers, self.lora_mlp)
        out += recursion_problems(self.recursion, c.n_layers, self.block_of_layer, self.kv_source, self.kv_mode,
                                  self.experts is not None)
        if out:
            return out
        out = sharing_field_problems(self.lora_sharing, self.lora_seed, self.lora_shards, self.lora_private_fraction)
        if out:
            return out
        return rank_problems(self) + scalar_problems(self.lora_alpha, self.lora_scaling, self.dtype) + bank_problems(
            self.banks, set(block_slots(c.activation)), self.n_blocks, self.block_stores,
            lambda b, s: math.prod(self.slot_shape(b, s)))

    def lora_scale(self, rank: int) -> float:
        """The factor on B @ A at this rank: alpha / r, or alpha / sqrt(r) with rslora."""
        return lora_scale(self.lora_alpha, rank, self.lora_scaling)

    def _numel(self, member: tuple[int, str]) -> int:
        o, i = self.slot_shape(*member)
        return o * i

    def member_numels(self, bank: Bank) -> list[int]:
        return [self._numel(m) for m in bank.members]

    # ---- serialisation -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["chassis"] = self.chassis.to_dict()
        d["mlp_widths"] = list(self.mlp_widths)
        d["block_of_layer"] = list(self.block_of_layer)
        d["lora_attn"] = list(self.lora_attn)
        d["lora_mlp"] = list(self.lora_mlp)
        d["kv_source"] = list(self.kv_source)
        d["atoms"] = [{"slot": a.slot, "n_atoms": a.n_atoms, "scope": a.scope} for a in self.atoms]
        d["banks"] = [
            {
                "members": [[b, s] for b, s in bank.members],
                "generator": bank.generator,
                "size": bank.size,
                "templates": bank.templates,
                **({"tile": bank.tile, "seed": bank.seed} if bank.generator == "hash" else {}),
            }
            for bank in self.banks
        ]
        # mechanisms left at their defaults are omitted, so allocations written before they existed
        # keep their files and hashes
        if self.kv_source == tuple(range(self.chassis.n_layers)):
            del d["kv_source"], d["kv_mode"]
        if not self.atoms:
            del d["atoms"]
        if self.experts is None:
            del d["experts"]
        else:
            d["experts"] = self.experts.to_dict()
        if self.lora_sharing == "private":
            del d["lora_sharing"], d["lora_seed"], d["lora_shards"], d["lora_private_fraction"]
        elif self.lora_sharing != "shards":
            del d["lora_shards"], d["lora_private_fraction"]
        if self.recursion is None:
            del d["recursion"]
        else:
            d["recursion"] = self.recursion.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ArchConfig:
        """Read an allocation strictly: a wrongly typed field is refused, never coerced ("false" is
        not False, 64.0 is not 64), and every problem is named at once. Schema 1 files upgrade."""
        return cls(**read_allocation(d, [f.name for f in fields(cls)]))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> ArchConfig:
        return cls.from_dict(json_mapping(text))

    def to_yaml(self) -> str:
        return "# npas allocation; rebuild with npas.build_model(ArchConfig.from_yaml(text))\n" + yaml.safe_dump(
            self.to_dict(), sort_keys=False, default_flow_style=None, width=120
        )

    @classmethod
    def from_yaml(cls, text: str) -> ArchConfig:
        return cls.from_dict(yaml_mapping(text))

    @property
    def hash(self) -> str:
        """Stable content hash: sha256 of canonical JSON, so equal allocations agree on any machine."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    def summary(self) -> str:
        """One short human line: widths, tying, banks, LoRA."""
        L = self.chassis.n_layers
        parts = [f"d={self.chassis.d_model} L={L} U={self.n_blocks}"]
        c = self.chassis
        if c.llama:  # the family, and its grouped K/V heads when fewer than the query heads
            parts.insert(0, "llama" + (f" kv={c.kv_heads}/{c.n_heads}" if c.kv_heads < c.n_heads else ""))
        w = self.mlp_widths
        parts.append(f"ff={w[0]}" if len(set(w)) == 1 else f"ff={w[0]}..{w[-1]}")
        if self.banks:
            gens = sorted({b.generator for b in self.banks})
            parts.append(f"banks={len(self.banks)}:{'/'.join(gens)}")
        sources = sum(1 for i in range(L) if not self.kv_consumer(i))
        if sources < L:
            parts.append(f"{self.kv_mode}:{sources}src")
        if self.atoms:
            parts.append("atoms=" + ",".join(f"{a.slot[-1]}{a.n_atoms}" for a in self.atoms))
        if self.experts is not None:
            e = self.experts
            parts.append(f"experts={len(e.pool_sizes)}x{max(e.pool_sizes)}:k{e.top_k}:w{e.d_expert}")
        if self.recursion is not None:
            r = self.recursion
            caps = "/".join(f"{c:.2g}" for c in r.capacities) if r.capacities else "full"
            parts.append(f"mor={r.first}+{r.stack}x{r.steps}+{r.last}:{r.router}" + (
                f":{caps}" if r.router == "expert_choice" else ""))
        ranks = sorted(set(self.lora_attn) | set(self.lora_mlp))
        if ranks != [0]:
            parts.append(f"lora<={max(ranks)}" + ("" if self.lora_sharing == "private" else f":{self.lora_sharing}"))
        return " ".join(parts)


def reference_config(chassis: Chassis, dtype: DType = "float32") -> ArchConfig:
    """The untied, uniform model of a chassis: the 1x reference every budget is relative to."""
    L = chassis.n_layers
    return ArchConfig(
        chassis=chassis,
        mlp_widths=(chassis.d_ff,) * L,
        block_of_layer=tuple(range(L)),
        dtype=dtype,
    )


__all__ = [
    "ATTN_SLOTS",
    "CHASSIS_MAX",
    "DEFAULT_LORA_ALPHA",
    "DTYPE_BYTES",
    "LLAMA_DEFAULTS",
    "LLAMA_MAX",
    "MLP_SLOTS",
    "ROPE_SCALING_KEYS",
    "SCHEMA_VERSION",
    "Activation",
    "ArchConfig",
    "AtomScope",
    "AtomSpec",
    "Bank",
    "Chassis",
    "DType",
    "ExpertPool",
    "ExpertRouter",
    "Family",
    "RecursionSpec",
    "Generator",
    "KvMode",
    "LoraScaling",
    "LoraSharing",
    "block_slots",
    "llama_problems",
    "lora_scale",
    "reference_config",
    "rope_scaling_problems",
    "slot_shape",
]
