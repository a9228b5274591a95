"""The knob table: every searchable value of a search space, declared once.

Parsing (`space_parser.parse_space`), sampling (`Space.sample`), candidate construction (`Space.candidate`),
validation messages and the dashboard all read this table, so a knob's name, YAML location, kind,
allowed values or range, default and the condition under which it applies cannot disagree between
them. Adding a knob is one `KnobSpec` entry here plus the code in `Space.candidate` (or the builder)
that gives it meaning.

The table's order is the sampling order (define-by-run): a knob's `applies` condition may only read
knobs listed above it. Keep new entries after the ones they depend on, and append rather than
reorder: the order in which knobs are suggested is part of what makes a seeded sampler reproducible.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import combinations
from typing import Any, Literal, get_args

from npas.allocation.budget_scope import BUDGET_SCOPES
from npas.allocation.config import (
    CHASSIS_MAX,
    DEFAULT_LORA_ALPHA,
    LLAMA_DEFAULTS,
    LLAMA_MAX,
    Activation,
    AtomScope,
    DType,
    ExpertRouter,
    Family,
    Generator,
    KvMode,
    LoraScaling,
)
from npas.allocation.lora_sharing import LORA_SHARING
from npas.allocation.parts import DEFAULT_HASH_TILE, HASH_SEED_LIMIT
from npas.allocation.recursion import (
    CapacitySchedule,
    RecursionGate,
    RecursionKv,
    RecursionLayout,
    RecursionRouter,
)

Taper = Literal["uniform", "linear", "cosine", "step", "reverse", "hourglass"]
# learned: groups clustered from trained weights (npas.allocation.layer_maps.groups_from_similarity); the
# similarity comes with the study (--init-from, or one pretraining of the reference), not the space file
Tying = Literal["none", "all", "sequential", "cycle", "middle_loop", "explicit", "learned"]
BankRule = Literal["by_type", "by_type_and_shape", "all", "explicit", "learned"]
LoraTargets = Literal["attn", "mlp", "both"]
WidthFit = Literal["mlp", "all"]
ExpertScope = Literal["global", "window"]  # one pool for every layer, or one per window of adjacent layers

TAPERS: tuple[str, ...] = get_args(Taper)
TYING: tuple[str, ...] = get_args(Tying)
BANK_RULES: tuple[str, ...] = get_args(BankRule)
GENERATORS: tuple[str, ...] = get_args(Generator)
LORA_TARGETS: tuple[str, ...] = get_args(LoraTargets)
TYING_WITH_U = ("sequential", "cycle", "middle_loop", "learned")  # the modes that take a unique-block count U
# which attention projections atoms generate: "none" or letters of q, k, v, o in that order ("qk", "qkvo")
ATOM_SLOTS: tuple[str, ...] = ("none", *("".join(c) for n in range(1, 5) for c in combinations("qkvo", n)))

REQUIRED = object()  # default of a chassis dimension: the space must give it


def _always(values: dict[str, Any]) -> bool:
    return True


def _tied(values: dict[str, Any]) -> bool:
    return values.get("tying", "none") != "none"


def _relaxed(values: dict[str, Any]) -> bool:
    """Some tied position has a LoRA rank (per-position ranks are named lora_rank_{i})."""
    return any(values[k] for k in values if k.startswith("lora_rank"))


def _shards(values: dict[str, Any]) -> bool:
    return _relaxed(values) and values.get("lora_sharing") == "shards"


def _atoms_on(values: dict[str, Any]) -> bool:
    return values.get("atom_slots", "none") != "none"


def _default_atoms(values: dict[str, Any]) -> int:
    """K = atoms.fraction x depth (a third of the layers by default), at least 1."""
    return max(1, round(float(values.get("atoms_fraction", 1 / 3)) * int(values["n_layers"])))


def _hashed(values: dict[str, Any]) -> bool:
    return bool(values.get("pools")) and values.get("generator") == "hash"


def _experts_on(values: dict[str, Any]) -> bool:
    return int(values.get("experts_per_layer", 0) or 0) > 0


def _recursion_on(values: dict[str, Any]) -> bool:
    return int(values.get("recursion_steps", 0) or 0) > 0


def _default_unique(values: dict[str, Any]) -> int:
    """U = half the depth, at least 2 (3 for middle_loop: unique first and last plus a loop)."""
    return max(3 if values.get("tying") == "middle_loop" else 2, int(values["n_layers"]) // 2)


@dataclass(frozen=True)
class KnobSpec:
    """One knob: where it is written, what it may hold, its default, and when it applies."""

    name: str  # Optuna parameter name and key in Candidate.values
    section: str  # chassis | settings | taper | tying | pools | relaxation | "" (directly under knobs:)
    key: str  # the YAML key inside its section
    kind: type  # int | float | str | bool
    default: Any  # used when the space leaves the knob out; a callable reads the values chosen so far
    allowed: tuple | None = None  # closed choices (from a Literal) for str knobs
    low: float | None = None  # numeric bounds; `high` may name a chassis knob whose largest value bounds it
    high: float | str | None = None
    applies: Callable[[dict[str, Any]], bool] = _always
    when: str = "always"  # the condition of `applies`, in words, for messages and the dashboard
    searchable: bool = True  # False: a fixed value only (it changes what the module computes, not its size)
    per_layer: bool = False  # with relaxation.per_position, suggested once per layer as {name}_{i}
    help: str = ""

    @property
    def path(self) -> str:
        """Where the knob is written in a space file, e.g. knobs.taper.ratio or chassis.d_model."""
        if self.section in ("chassis", "fit"):
            return f"{self.section}.{self.key}"
        if self.section == "space":
            return f"space.{self.key}"
        return f"knobs.{self.section}.{self.key}" if self.section else f"knobs.{self.key}"

    def default_for(self, values: dict[str, Any]) -> Any:
        return self.default(values) if callable(self.default) else self.default


def _chassis(key: str, help: str) -> KnobSpec:
    return KnobSpec(key, "chassis", key, int, REQUIRED, low=1, high=CHASSIS_MAX[key], help=help)


KNOBS: tuple[KnobSpec, ...] = (
    _chassis("vocab_size", "characters of the corpus; rebound to --data's vocabulary at launch"),
    _chassis("context", "maximum sequence length (learned positions)"),
    _chassis("d_model", "residual width"),
    _chassis("n_layers", "depth L"),
    _chassis("n_heads", "attention heads; must divide d_model"),
    _chassis("d_ff", "uniform MLP width of the reference; tapers keep the mean"),
    KnobSpec("activation", "chassis", "activation", str, "gelu", allowed=get_args(Activation),
             help="MLP activation; swiglu adds a gate matrix"),
    # the family and its llama-only dimensions: spaces that leave them out fix them at their defaults,
    # which suggests nothing, so the seeded order of every knob below is unchanged for them
    KnobSpec("family", "chassis", "family", str, "classic", allowed=get_args(Family),
             help="classic: LayerNorm, learned positions, full attention; llama: RMSNorm, rotary positions, "
                  "grouped-query attention (Hugging Face Llama)"),
    KnobSpec("n_kv_heads", "chassis", "n_kv_heads", int, 0, low=0, high=LLAMA_MAX["n_kv_heads"],
             help="llama: key/value heads (grouped-query attention), dividing n_heads; 0 = n_heads"),
    KnobSpec("head_dim", "chassis", "head_dim", int, 0, low=0, high=LLAMA_MAX["head_dim"],
             help="llama: width of one head (even); 0 = d_model / n_heads"),
    KnobSpec("rope_theta", "chassis", "rope_theta", float, LLAMA_DEFAULTS["rope_theta"], low=1e-6, high=1e12,
             searchable=False, help="llama: rotary base theta"),
    KnobSpec("rms_norm_eps", "chassis", "rms_norm_eps", float, LLAMA_DEFAULTS["rms_norm_eps"], low=1e-12, high=1.0,
             searchable=False, help="llama: RMSNorm epsilon"),
    KnobSpec("tie_embeddings", "chassis", "tie_embeddings", bool, True,
             help="llama: the output head reads the token embedding; false adds an lm_head of vocab x d_model"),
    KnobSpec("taper", "taper", "schedule", str, "uniform", allowed=TAPERS, help="MLP width over depth"),
    KnobSpec("taper_ratio", "taper", "ratio", float, 2.0, low=1.0, high=16.0,
             applies=lambda v: v.get("taper", "uniform") != "uniform", when="taper.schedule is not uniform",
             help="first/last MLP width; cosine 3.0 runs 1.5x -> 0.5x of d_ff"),
    KnobSpec("tying", "tying", "mode", str, "none", allowed=TYING, help="which layers share one block"),
    KnobSpec("unique_blocks", "tying", "unique_blocks", int, _default_unique, low=1, high="n_layers",
             applies=lambda v: v.get("tying") in TYING_WITH_U, when="tying.mode is sequential, cycle, middle_loop or learned",
             help="U unique blocks (learned: U clusters of similar layers)"),
    KnobSpec("lora_rank", "relaxation", "rank", int, 0, low=0, high=1024, applies=_tied,
             when="tying.mode is not none", per_layer=True,
             help="LoRA rank at tied positions; 0 = pure tying"),
    KnobSpec("lora_targets", "relaxation", "targets", str, "both", allowed=LORA_TARGETS, applies=_relaxed,
             when="some LoRA rank is > 0", help="which slots the LoRA deltas relax"),
    KnobSpec("untied_norms", "", "untied_norms", bool, True, applies=_tied, when="tying.mode is not none",
             help="tied layers keep their own LayerNorms"),
    KnobSpec("pools", "pools", "enabled", bool, False, help="Shapeshifter banks generate the blocks' weights"),
    KnobSpec("bank_rule", "pools", "rule", str, "by_type", allowed=BANK_RULES, applies=lambda v: bool(v.get("pools")),
             when="pools.enabled", help="which slots share a bank"),
    KnobSpec("n_banks", "pools", "banks", int, 1, low=1, high=1024, applies=lambda v: bool(v.get("pools")),
             when="pools.enabled", help="banks per group (contiguous blocks; learned: clusters of similar blocks)"),
    KnobSpec("generator", "pools", "generator", str, "template_mix", allowed=GENERATORS,
             applies=lambda v: bool(v.get("pools")), when="pools.enabled", help="how a bank makes its members"),
    KnobSpec("templates", "pools", "templates", int, 2, low=1, high=4096,
             applies=lambda v: bool(v.get("pools")) and v.get("generator") == "template_mix",
             when="pools.enabled and pools.generator is template_mix",
             help="least T for template_mix; more templates fill a larger budget (up to fit.max_templates)"),
    KnobSpec("kv_group", "kv_sharing", "group", int, 1, low=1, high="n_layers",
             help="g adjacent layers reuse the K/V of the group's first layer; KV cache / g; 1 = no sharing"),
    KnobSpec("kv_mode", "kv_sharing", "mode", str, "kv", allowed=get_args(KvMode),
             applies=lambda v: int(v.get("kv_group", 1)) > 1, when="kv_sharing.group > 1",
             help="kv: consumers reuse keys and values; v: values only (they keep their own keys)"),
    KnobSpec("atom_slots", "atoms", "slots", str, "none", allowed=ATOM_SLOTS,
             help="attention projections made from shared matrix atoms (MASA), e.g. qkvo, qk; none = off"),
    KnobSpec("atoms_fraction", "atoms", "fraction", float, 1 / 3, low=0.01, high=4.0, applies=_atoms_on,
             when="atoms.slots is not none", help="atom count K as a fraction of the layers (when atoms.count is not given)"),
    KnobSpec("n_atoms", "atoms", "count", int, _default_atoms, low=1, high=4096, applies=_atoms_on,
             when="atoms.slots is not none", help="K atoms of d x d per projection type"),
    KnobSpec("atom_scope", "atoms", "scope", str, "layer", allowed=get_args(AtomScope), applies=_atoms_on,
             when="atoms.slots is not none", help="coefficients per layer, or per unique block (shared like the blocks)"),
    # fixed-only, and sampled last so they never shift the seeded order of the searched knobs above
    KnobSpec("lora_alpha", "relaxation", "alpha", float, DEFAULT_LORA_ALPHA, low=1e-6, high=1e6,
             applies=_relaxed, when="some LoRA rank is > 0", searchable=False,
             help="LoRA scale numerator: delta = (alpha / r) B A, or alpha / sqrt(r) with rslora"),
    KnobSpec("lora_scaling", "relaxation", "scaling", str, "standard", allowed=get_args(LoraScaling),
             applies=_relaxed, when="some LoRA rank is > 0", searchable=False,
             help="standard: alpha / r (PEFT); rslora: alpha / sqrt(r)"),
    # expert pools, appended last so spaces written before them keep their seeded suggestion order
    KnobSpec("experts_per_layer", "experts", "per_layer", int, 0, low=0, high=1024,
             applies=lambda v: not v.get("pools"), when="pools is not enabled",
             help="E: the MLP becomes a mixture of experts; a pool holds pool_fraction x its layers x E "
                  "experts; 0 = dense MLP (Shapeshifter pools own the MLP weights, so a sample with pools "
                  "is dense)"),
    KnobSpec("expert_pool_fraction", "experts", "pool_fraction", float, 1.0, low=0.01, high=8.0,
             applies=_experts_on, when="experts.per_layer > 0",
             help="pool size as a fraction of (layers reading it x E); 1 = as many as per-layer MoE, at least top_k"),
    KnobSpec("experts_topk", "experts", "topk", int, 1, low=1, high=64, applies=_experts_on,
             when="experts.per_layer > 0", help="k experts each token runs per layer"),
    KnobSpec("expert_router", "experts", "router", str, "per_layer", allowed=get_args(ExpertRouter),
             applies=_experts_on, when="experts.per_layer > 0",
             help="per_layer: every layer routes with its own router; shared: one router per pool"),
    KnobSpec("expert_scope", "experts", "scope", str, "global", allowed=get_args(ExpertScope),
             applies=_experts_on, when="experts.per_layer > 0",
             help="global: one pool read by every layer; window: one pool per window of adjacent layers"),
    KnobSpec("expert_window", "experts", "window", int, 2, low=1, high="n_layers",
             applies=lambda v: _experts_on(v) and v.get("expert_scope") == "window",
             when="experts.scope is window", help="layers per window; 1 with pool_fraction 1 is per-layer MoE"),
    KnobSpec("expert_balance", "experts", "balance_weight", float, 0.01, low=0.0, high=100.0,
             applies=_experts_on, when="experts.per_layer > 0",
             help="weight of the pool-level load-balancing loss in the training loss"),
    # hashed sharing, appended last so spaces written before it keep their seeded suggestion order
    KnobSpec("hash_tile", "pools", "tile", int, DEFAULT_HASH_TILE, low=1, high=65536, applies=_hashed,
             when="pools.enabled and pools.generator is hash",
             help="elements per tile a hash bank reads contiguously from its array; the smallest array is one tile"),
    KnobSpec("hash_seed", "pools", "seed", int, 0, low=0, high=HASH_SEED_LIMIT - 1, applies=_hashed,
             when="pools.enabled and pools.generator is hash", searchable=False,
             help="seed of the hash mapping, stored in the allocation so an export rebuilds it"),
    # low-rank relaxations shared across layers (npas.allocation.lora_sharing), appended last so spaces
    # written before them keep their seeded suggestion order
    KnobSpec("lora_sharing", "relaxation", "sharing", str, "private", allowed=LORA_SHARING, applies=_relaxed,
             when="some LoRA rank is > 0",
             help="private: a LoRA per layer; shared_a: one A per slot type (ASLoRA); vera: a frozen seeded pair, "
                  "per-layer d and b (VeRA); shards: factors from shared shard pools (Mixture of Shards)"),
    KnobSpec("lora_shard_fraction", "relaxation", "shard_fraction", float, 0.25, low=0.01, high=64.0,
             applies=_shards, when="relaxation.sharing is shards",
             help="shards per factor pool as a fraction of the shared rank vectors private LoRA would own"),
    KnobSpec("lora_private_fraction", "relaxation", "private_fraction", float, 0.0, low=0.0, high=1.0,
             applies=_shards, when="relaxation.sharing is shards",
             help="share of each position's rank held in private shards (differentiation)"),
    KnobSpec("lora_seed", "relaxation", "seed", int, 0, low=0, high=2**31 - 1, searchable=False,
             applies=lambda v: _relaxed(v) and v.get("lora_sharing") in ("vera", "shards"),
             when="relaxation.sharing is vera or shards",
             help="seed of VeRA's frozen projections and of the shards' per-layer indices"),
    # per-token recursion depth (Mixture-of-Recursions), appended last for the same reason
    KnobSpec("recursion_steps", "recursion", "steps", int, 0, low=0, high=64,
             applies=lambda v: not v.get("pools") and not _experts_on(v), when="pools and experts are off",
             help="N_r: passes through one shared stack, each token's own number chosen by a router; the depth "
                  "becomes first + stack x steps + last; 0 = off"),
    KnobSpec("recursion_stack", "recursion", "stack", int, 2, low=1, high="n_layers", applies=_recursion_on,
             when="recursion.steps > 0", help="U: layers in the shared stack"),
    KnobSpec("recursion_layout", "recursion", "layout", str, "middle_cycle", allowed=get_args(RecursionLayout),
             applies=_recursion_on, when="recursion.steps > 0",
             help="cycle: the stack alone; middle_cycle: a unique first and last layer around it"),
    KnobSpec("recursion_router", "recursion", "router", str, "expert_choice", allowed=get_args(RecursionRouter),
             applies=_recursion_on, when="recursion.steps > 0",
             help="expert_choice: each step keeps its capacity's top tokens (evaluated causally by a threshold); "
                  "token_choice: one softmax over depths per token"),
    KnobSpec("recursion_capacities", "recursion", "capacities", str, "linear", allowed=get_args(CapacitySchedule),
             applies=lambda v: _recursion_on(v) and v.get("recursion_router") == "expert_choice",
             when="recursion.router is expert_choice",
             help="share of tokens running each step: linear (N-r)/N, halving 2^-r, full = fixed-depth recursion"),
    KnobSpec("recursion_kv", "recursion", "kv", str, "per_step", allowed=get_args(RecursionKv),
             applies=_recursion_on, when="recursion.steps > 0",
             help="per_step: a step attends over its active tokens' keys/values; shared_first: step 0's, every token's"),
    KnobSpec("recursion_gate", "recursion", "gate", str, "sigmoid", allowed=get_args(RecursionGate),
             applies=_recursion_on, when="recursion.steps > 0",
             help="sigmoid: a step's update is scaled by the router's score; none: unscaled"),
    KnobSpec("recursion_aux_weight", "recursion", "aux_weight", float, 0.001, low=0.0, high=100.0,
             applies=lambda v: _recursion_on(v) and v.get("recursion_router") == "expert_choice",
             when="recursion.router is expert_choice",
             help="BCE of the routers' scores against the top-k choice: what the causal threshold separates"),
    KnobSpec("recursion_balance_weight", "recursion", "balance_weight", float, 0.1, low=0.0, high=100.0,
             applies=lambda v: _recursion_on(v) and v.get("recursion_router") == "token_choice",
             when="recursion.router is token_choice", help="balance loss over depths"),
    KnobSpec("recursion_z_weight", "recursion", "z_weight", float, 1e-5, low=0.0, high=100.0,
             applies=lambda v: _recursion_on(v) and v.get("recursion_router") == "token_choice",
             when="recursion.router is token_choice", help="router z-loss"),
)

# Settings of a space that shape every candidate but are never searched: fixed values only.
SETTINGS: tuple[KnobSpec, ...] = (
    KnobSpec("dtype", "space", "dtype", str, "float32", allowed=get_args(DType), searchable=False,
             help="dtype of stored and exported weights"),
    KnobSpec("budget_scope", "space", "budget_scope", str, "all", allowed=BUDGET_SCOPES,
             searchable=False, help="all: the budget caps every stored parameter; non_embedding: all but the token "
                                    "and position embeddings (the head is tied), the count that ranks LMs"),
    KnobSpec("width_fit", "fit", "width", str, "all", allowed=get_args(WidthFit), searchable=False,
             help="mlp: only MLP widths scale to fill the budget; all: d_model narrows too"),
    KnobSpec("max_width_scale", "fit", "max_width_scale", float, 4.0, low=1.0, high=64.0, searchable=False,
             help="widest MLP a fit may give, as a multiple of the tapered width"),
    KnobSpec("max_templates", "fit", "max_templates", int, 64, low=1, high=4096, searchable=False,
             help="upper bound on T for template_mix pools"),
)

BY_NAME: dict[str, KnobSpec] = {s.name: s for s in KNOBS + SETTINGS}
CHASSIS_KEYS: tuple[str, ...] = tuple(s.key for s in KNOBS if s.section == "chassis")
# chassis keys a space may leave out without them being recorded: a space that does not name its family
# samples the classic chassis with exactly the values (and trial attributes) it always did
FAMILY_KEYS: tuple[str, ...] = ("family", "n_kv_heads", "head_dim", "rope_theta", "rms_norm_eps", "tie_embeddings")
SECTION_KEYS: dict[str, tuple[str, ...]] = {}
for _s in KNOBS:
    if _s.section not in ("chassis", ""):
        SECTION_KEYS.setdefault(_s.section, ())
        SECTION_KEYS[_s.section] += (_s.key,)
SECTION_KEYS["tying"] += ("groups",)  # explicit layer groups: structure, not a sampled value
SECTION_KEYS["pools"] += ("groups",)
SECTION_KEYS["relaxation"] += ("per_position",)
KNOB_SECTIONS: tuple[str, ...] = (*SECTION_KEYS, *(s.key for s in KNOBS if s.section == ""))
FIT_KEYS: tuple[str, ...] = tuple(s.key for s in SETTINGS if s.section == "fit")


def value(values: dict[str, Any], name: str) -> Any:
    """The knob's value in `values`, else its table default (defaults may read earlier values)."""
    if name in values and values[name] is not None:
        return values[name]
    return BY_NAME[name].default_for(values)


def knob_label(param: str) -> str:
    """The space-file path of an Optuna parameter name (lora_rank_3 -> knobs.relaxation.rank[3])."""
    spec = BY_NAME.get(param)
    if spec is not None:
        return spec.path
    base, _, idx = param.rpartition("_")
    spec = BY_NAME.get(base)
    if spec is not None and spec.per_layer and idx.isdigit():
        return f"{spec.path}[{idx}]"
    return param


__all__ = [
    "ATOM_SLOTS",
    "BANK_RULES",
    "BY_NAME",
    "CHASSIS_KEYS",
    "GENERATORS",
    "KNOBS",
    "KnobSpec",
    "LORA_TARGETS",
    "SETTINGS",
    "TAPERS",
    "TYING",
    "knob_label",
    "value",
]
