"""The hand-crafted baselines every study enqueues first, so each front shows what hand-made sharing gives.

Its own module because which models a careful person would build by hand, and at which ranks and widths
they stay fair comparisons (private LoRA of equal relaxation parameters, a per-layer MoE whose experts
are not needlessly narrow, fixed-depth recursion), is a judgement about sharing, not about sampling:
`npas.allocation.space.Space.baselines` completes them for a space and fits each through the space's
own `candidate`, which it hands in, so this module never imports the space.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from npas.allocation.config import ArchConfig
from npas.allocation.knob_table import value
from npas.allocation.knobs import Knob
from npas.allocation.lora_sharing import equal_private_rank

_PLAIN = {"kv_group": 1, "atom_slots": "none"}  # baselines share no K/V and use no atoms
BASELINES: dict[str, dict[str, Any]] = {
    # hand-crafted sharing every study enqueues first, so each front shows what hand-made sharing gives;
    # narrow_untied is also the unshared model KV sharing is measured against, cycle_tying the one atoms are
    "narrow_untied": {"taper": "uniform", "tying": "none", "pools": False, "width_fit": "all", **_PLAIN},
    "full_tying": {"taper": "uniform", "tying": "all", "pools": False, "lora_rank": 0, "untied_norms": True, **_PLAIN},
    "cycle_tying": {"taper": "uniform", "tying": "cycle", "pools": False, "lora_rank": 0, "untied_norms": True,
                    **_PLAIN},
}

# a baseline's knob values (beside the reference chassis) -> its fitted allocation, or None where none fits
Fitted = Callable[[dict[str, Any]], ArchConfig | None]


def baselines(knobs: Mapping[str, Knob], n_layers: int, per_position: bool, width_fit: str,
              fitted: Fitted) -> dict[str, dict[str, Any]]:
    """Knob values of the hand-crafted baselines, completed for a space of these `knobs` whose
    reference chassis has `n_layers` (`per_position`: per-layer knobs are sampled one per layer)."""
    L = n_layers
    out = {}
    for name, vals in BASELINES.items():
        vals = dict(vals)
        if vals["tying"] == "cycle":
            if L < 4:
                continue
            vals["unique_blocks"] = L // 2
        if "experts_per_layer" in knobs:
            vals["experts_per_layer"] = 0  # the dense, hand-crafted models
        out[name] = vals
    experts = [e for e in knobs["experts_per_layer"].options() if e > 0] if "experts_per_layer" in knobs else []
    if experts and (moe := _per_layer_moe(knobs, width_fit, fitted, max(experts))) is not None:
        out["per_layer_moe"] = moe
    if (private := _private_lora(knobs, L, per_position, fitted)) is not None:
        out["private_lora"] = private
    if "recursion_steps" in knobs:
        _recursion_baselines(knobs, out)
    return out


def _recursion_baselines(knobs: Mapping[str, Knob], out: dict[str, dict[str, Any]]) -> None:
    """What per-token depth is measured against, both at the same stored parameters: the vanilla
    model (narrow_untied, recursion off) and fixed-depth recursion -- the space's first stack, steps
    and layout with every token running every step and no gate, which computes what cycle tying of
    that stack computes (its router is stored but never read)."""
    for vals in out.values():
        vals["recursion_steps"] = 0
    first = {n: knobs[n].default for n in ("recursion_steps", "recursion_stack", "recursion_layout") if n in knobs}
    if int(first.get("recursion_steps", 0)) <= 0:
        return
    out["fixed_depth_recursion"] = {**BASELINES["narrow_untied"], **first, "recursion_router": "expert_choice",
                                    "recursion_capacities": "full", "recursion_kv": "per_step",
                                    "recursion_gate": "none"}


def _private_lora(knobs: Mapping[str, Knob], L: int, per_position: bool, fitted: Fitted) -> dict[str, Any] | None:
    """Where the space shares LoRA factors across layers: the private LoRA that stores as many
    relaxation parameters as its first sharing mode does at its largest rank (cycle tying, U = L/2,
    every slot relaxed), so a shared relaxation is always seen beside private LoRA of equal
    relaxation parameters. None when the space offers no sharing mode, rank or cycle."""
    sharing, rank = knobs.get("lora_sharing"), knobs.get("lora_rank")
    modes = [m for m in sharing.options() if m != "private"] if sharing else []
    ranks = [r for r in rank.options() if r > 0] if rank else []
    if not modes or not ranks or L < 4:
        return None
    vals = {**BASELINES["cycle_tying"], "unique_blocks": L // 2, "lora_rank": max(ranks), "lora_targets": "both",
            "lora_sharing": modes[0], **({"experts_per_layer": 0} if "experts_per_layer" in knobs else {})}
    if per_position:
        vals.update({f"lora_rank_{i}": max(ranks) for i in range(L)})
    cfg = fitted(vals)
    if cfg is None:
        return None
    r = equal_private_rank(cfg)
    return {**vals, "lora_sharing": "private", "lora_rank": r,
            **({f"lora_rank_{i}": r for i in range(L)} if per_position else {})}


def _per_layer_moe(knobs: Mapping[str, Knob], width_fit: str, fitted: Fitted, most: int) -> dict[str, Any] | None:
    """The natural baseline of an expert pool, as a careful person would hand-build it at this budget:
    each layer its own experts, nothing shared, top-1 routing (the space's sparsest top-k), and the
    most experts per layer (at most the space's largest E) whose fitted width is still at least
    d_model / 2. Splitting a budget into ever narrower experts (width 4 at d_model 104 was what the
    fixed E gave at full.yaml's 0.25x) makes a strawman, not a baseline; where not even
    top_k + 1 experts per layer keep that width, there is no per-layer MoE to compare with (None).
    The width is judged on the reference chassis, the one every baseline is counted on."""
    topk = knobs.get("experts_topk")
    k = min(topk.options()) if topk is not None else int(value({}, "experts_topk"))
    for e in range(most, k, -1):
        vals = {**BASELINES["narrow_untied"], "width_fit": width_fit, "experts_per_layer": e,
                "expert_scope": "window", "expert_window": 1, "expert_pool_fraction": 1.0, "experts_topk": k}
        cfg = fitted(vals)
        if cfg is not None and 2 * cfg.experts.d_expert >= cfg.chassis.d_model:
            return vals
    return None
