"""The allocation (`ArchConfig`): one complete candidate as plain, frozen, hashable data.

An allocation is what a search samples, what `export` writes and what `build_model` reads, so it is
fully explicit: every layer's MLP width, the layer -> block tying map, every parameter bank with its
members, generator and sizes, every LoRA rank. Nothing in it depends on the search space that
produced it, which is why a YAML file of it rebuilds the exact module on any machine.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, fields
from functools import cached_property
from typing import Any, Literal, get_args

import yaml

from npas.errors import ConfigError

SCHEMA_VERSION = 2  # 2: attention as four slots attn_q/k/v/o (1: fused attn_qkv + attn_out); 1 still loads

Activation = Literal["gelu", "swiglu"]
Generator = Literal["tie", "slice", "tile", "template_mix"]
DType = Literal["float32", "bfloat16", "float16"]
LoraScaling = Literal["standard", "rslora"]

# LoRA deltas are scaled alpha / r (PEFT's convention; rslora: alpha / sqrt(r)) with alpha fixed
# across ranks, so the update size of a delta does not grow with r and a rank sweep is not also a
# learning-rate sweep. 16 is a common PEFT setting (r = 8..16 gives a scale of 1..2 at the proxy's
# ranks 4..16); B starts at zero, so alpha changes how fast a delta learns, never the initial model.
DEFAULT_LORA_ALPHA = 16.0

# Weight slots of one transformer block, in forward order. Q, K, V and O are separate (d x d) slots so
# banks, atoms, cross-layer KV sharing and conversion can address each; the forward still runs one
# matmul for q, k and v (see transformer.Layer).
ATTN_SLOTS: tuple[str, ...] = ("attn_q", "attn_k", "attn_v", "attn_o")
MLP_SLOTS: dict[str, tuple[str, ...]] = {
    "gelu": ("mlp_up", "mlp_down"),
    "swiglu": ("mlp_gate", "mlp_up", "mlp_down"),
}
# `dtype` is the dtype the allocation's weights are stored and exported in: `build_model` returns
# parameters of that dtype, `count(...).param_bytes` and `inference_bytes` count its size, and the
# safetensors weights `npas train` writes hold it. Training keeps fp32 master weights whatever the
# dtype (the proxy casts the built model up; low-precision AdamW states lose small updates on CPU),
# so the training-memory estimate counts 4 bytes for weights and for gradients.
DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}


def block_slots(activation: str) -> tuple[str, ...]:
    """Names of the weight matrices one block owns, attention first."""
    return ATTN_SLOTS + MLP_SLOTS[activation]


def slot_shape(slot: str, d_model: int, width: int) -> tuple[int, int]:
    """(out_features, in_features) of a slot for an MLP of `width`; F.linear's weight layout."""
    if slot in ATTN_SLOTS:
        return (d_model, d_model)
    if slot in ("mlp_up", "mlp_gate"):
        return (width, d_model)
    if slot == "mlp_down":
        return (d_model, width)
    raise ConfigError(f"unknown weight slot {slot!r}; known: {', '.join(ATTN_SLOTS + MLP_SLOTS['swiglu'])}")


@dataclass(frozen=True)
class Chassis:
    """The architecture family and its fixed dimensions: a pre-norm decoder-only transformer LM."""

    vocab_size: int  # characters for the bundled corpus (68)
    context: int  # maximum sequence length; learned position embeddings
    d_model: int
    n_layers: int
    n_heads: int  # must divide d_model
    d_ff: int  # MLP width of the uniform reference; tapers keep the mean
    activation: Activation = "gelu"

    def problems(self) -> list[str]:
        out = []
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "activation":
                if v not in get_args(Activation):
                    out.append(f"chassis.activation: {v!r} is not one of {list(get_args(Activation))}")
            elif not isinstance(v, int) or isinstance(v, bool) or v < 1:
                out.append(f"chassis.{f.name}: must be a positive integer, got {v!r}")
        if not out and self.d_model % self.n_heads:
            out.append(
                f"chassis: n_heads={self.n_heads} does not divide d_model={self.d_model}; "
                f"pick d_model a multiple of n_heads"
            )
        return out

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


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
    """

    members: tuple[tuple[int, str], ...]
    generator: Generator
    size: int
    templates: int = 1


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
        if len(set(self.block_of_layer)) == len(self.block_of_layer):
            # with no shared block, tied-or-untied norms build the same model: keep one canonical form
            object.__setattr__(self, "untied_norms", True)
        problems = self.problems()
        if problems:
            raise ConfigError("invalid allocation: " + "; ".join(problems))

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
        return slot_shape(slot, self.chassis.d_model, self.block_width(block))

    def bank_of(self) -> dict[tuple[int, str], int]:
        return {m: k for k, bank in enumerate(self.banks) for m in bank.members}

    # ---- validation --------------------------------------------------------------------------
    def problems(self) -> list[str]:
        c = self.chassis
        out = c.problems()
        if out:
            return out
        L = c.n_layers
        if self.version != SCHEMA_VERSION:
            out.append(f"version: {self.version} is not the supported schema version {SCHEMA_VERSION}")
        for name in ("mlp_widths", "block_of_layer", "lora_attn", "lora_mlp"):
            seq = getattr(self, name)
            if len(seq) != L:
                out.append(f"{name}: needs one entry per layer ({L}), got {len(seq)}")
            elif any(not isinstance(v, int) or isinstance(v, bool) for v in seq):
                out.append(f"{name}: entries must be integers, got {list(seq)}")
        if out:
            return out
        if min(self.mlp_widths) < 1:
            out.append(f"mlp_widths: every width must be >= 1, got {list(self.mlp_widths)}")
        if min(self.lora_attn + self.lora_mlp) < 0:
            out.append("lora ranks must be >= 0")
        seen: list[int] = []
        for b in self.block_of_layer:
            if b not in seen:
                seen.append(b)
        if seen != list(range(len(seen))):
            out.append(
                f"block_of_layer: blocks must be numbered 0..U-1 in order of first use, got "
                f"{list(self.block_of_layer)}"
            )
            return out
        if (not isinstance(self.lora_alpha, int | float) or isinstance(self.lora_alpha, bool)
                or not math.isfinite(self.lora_alpha) or self.lora_alpha <= 0):
            out.append(f"lora_alpha: must be a positive finite number, got {self.lora_alpha!r}")
        if self.lora_scaling not in get_args(LoraScaling):
            out.append(f"lora_scaling: {self.lora_scaling!r} is not one of {list(get_args(LoraScaling))}")
        if self.dtype not in DTYPE_BYTES:
            out.append(f"dtype: {self.dtype!r} is not one of {sorted(DTYPE_BYTES)}")
        slots = set(block_slots(c.activation))
        owner: dict[tuple[int, str], int] = {}
        for k, bank in enumerate(self.banks):
            if bank.generator not in get_args(Generator):
                out.append(f"banks[{k}].generator: {bank.generator!r} is not one of {list(get_args(Generator))}")
                continue
            if not bank.members:
                out.append(f"banks[{k}]: has no members")
                continue
            for blk, slot in bank.members:
                if slot not in slots or not 0 <= blk < len(seen):
                    out.append(f"banks[{k}]: member ({blk}, {slot!r}) is not a block slot of this chassis")
                elif (blk, slot) in owner:
                    out.append(f"banks[{k}]: member ({blk}, {slot!r}) already belongs to banks[{owner[blk, slot]}]")
                else:
                    owner[blk, slot] = k
            if any(k == v for v in owner.values()):
                sizes = [self._numel(m) for m in bank.members if owner.get(m) == k]
                out.extend(_bank_problems(k, bank, sizes))
        return out

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
        d["mlp_widths"] = list(self.mlp_widths)
        d["block_of_layer"] = list(self.block_of_layer)
        d["lora_attn"] = list(self.lora_attn)
        d["lora_mlp"] = list(self.lora_mlp)
        d["banks"] = [
            {
                "members": [[b, s] for b, s in bank.members],
                "generator": bank.generator,
                "size": bank.size,
                "templates": bank.templates,
            }
            for bank in self.banks
        ]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ArchConfig:
        """Read an allocation strictly: a wrongly typed field is refused, never coerced ("false" is
        not False, 64.0 is not 64), and every problem is named at once. Schema 1 files upgrade."""
        if not isinstance(d, dict):
            raise ConfigError(f"an allocation must be a mapping, got {type(d).__name__}")
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(d) - set(known))
        if unknown:
            raise ConfigError(f"unknown allocation keys {unknown}; allowed: {sorted(known)}")
        from npas.allocation.schema import read_fields, upgrade_v1  # reads Chassis and Bank from here

        problems: list[str] = []
        kwargs = read_fields(d, problems)
        if problems:
            raise ConfigError("invalid allocation: " + "; ".join(problems))
        if kwargs["version"] == 1:
            kwargs = upgrade_v1(kwargs)
        return cls(**kwargs)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> ArchConfig:
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as e:
            raise ConfigError(f"allocation JSON does not parse: {e}") from None

    def to_yaml(self) -> str:
        return "# npas allocation; rebuild with npas.build_model(ArchConfig.from_yaml(text))\n" + yaml.safe_dump(
            self.to_dict(), sort_keys=False, default_flow_style=None, width=120
        )

    @classmethod
    def from_yaml(cls, text: str) -> ArchConfig:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"allocation YAML does not parse: {e}") from None
        if isinstance(data, dict) and "allocation" in data:  # an export with metrics beside it
            data = data["allocation"]
        return cls.from_dict(data)

    @property
    def hash(self) -> str:
        """Stable content hash: sha256 of canonical JSON, so equal allocations agree on any machine."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    def summary(self) -> str:
        """One short human line: widths, tying, banks, LoRA."""
        L = self.chassis.n_layers
        parts = [f"d={self.chassis.d_model} L={L} U={self.n_blocks}"]
        w = self.mlp_widths
        parts.append(f"ff={w[0]}" if len(set(w)) == 1 else f"ff={w[0]}..{w[-1]}")
        if self.banks:
            gens = sorted({b.generator for b in self.banks})
            parts.append(f"banks={len(self.banks)}:{'/'.join(gens)}")
        ranks = sorted(set(self.lora_attn) | set(self.lora_mlp))
        if ranks != [0]:
            parts.append(f"lora<={max(ranks)}")
        return " ".join(parts)


def _bank_problems(k: int, bank: Bank, sizes: list[int]) -> list[str]:
    out = []
    if bank.size < 1 or bank.templates < 1:
        out.append(f"banks[{k}]: size and templates must be >= 1, got size={bank.size} templates={bank.templates}")
    elif bank.generator == "tie" and bank.size < max(sizes):
        out.append(f"banks[{k}]: {bank.generator} needs size >= largest member ({max(sizes)}), got {bank.size}")
    elif bank.generator != "template_mix" and bank.templates != 1:
        out.append(f"banks[{k}]: templates={bank.templates} only applies to template_mix")
    return out


def lora_scale(alpha: float, rank: int, scaling: str = "standard") -> float:
    """alpha / r (PEFT's LoRA) or alpha / sqrt(r) (rsLoRA, stable as r grows); 0 at rank 0."""
    if rank <= 0:
        return 0.0
    return alpha / (math.sqrt(rank) if scaling == "rslora" else rank)


def reference_config(chassis: Chassis, dtype: DType = "float32") -> ArchConfig:
    """The untied, uniform model of a chassis: the 1x reference every budget is relative to."""
    L = chassis.n_layers
    return ArchConfig(
        chassis=chassis,
        mlp_widths=(chassis.d_ff,) * L,
        block_of_layer=tuple(range(L)),
        dtype=dtype,
    )


def canonical_blocks(assignment: list[int] | tuple[int, ...]) -> tuple[int, ...]:
    """Renumber a layer -> group assignment so blocks are 0..U-1 in order of first use."""
    ids: dict[int, int] = {}
    return tuple(ids.setdefault(a, len(ids)) for a in assignment)


__all__ = [
    "ArchConfig",
    "Bank",
    "Chassis",
    "SCHEMA_VERSION",
    "block_slots",
    "canonical_blocks",
    "reference_config",
    "slot_shape",
]
