"""Per-token recursion as an allocation: the spec a sample's knobs describe, the `ArchConfig` a spec
lays out on a chassis, and what its routed depth costs per token.

Its own module because `npas.allocation.recursion` (the spec, its layout and checks) is what
`npas.allocation.config` imports to type an allocation's `recursion` field, so the spec cannot name
`ArchConfig` back; everything recursion asks of a whole allocation (building one, the share of tokens
running each depth position, its FLOPs and gathers, which `npas.allocation.budget.count` and the
dashboard read) lives here instead, without torch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from npas.allocation.config import ArchConfig, Chassis, DType
from npas.allocation.knob_table import value
from npas.allocation.recursion import RecursionSpec, capacity_schedule


def recursion_from_values(values: dict[str, Any]) -> RecursionSpec:
    """The recursion spec that a sample's recursion knobs describe."""
    steps, router = int(value(values, "recursion_steps")), value(values, "recursion_router")
    ends = 1 if value(values, "recursion_layout") == "middle_cycle" else 0
    caps = capacity_schedule(value(values, "recursion_capacities"), steps) if router == "expert_choice" else ()
    return RecursionSpec(steps, int(value(values, "recursion_stack")), ends, ends, caps, router,
                         value(values, "recursion_kv"), value(values, "recursion_gate"),
                         float(value(values, "recursion_aux_weight")), float(value(values, "recursion_balance_weight")),
                         float(value(values, "recursion_z_weight")))


def recursion_config(chassis: Chassis, spec: RecursionSpec, d_ff: int | None = None,
                     dtype: DType = "float32") -> ArchConfig:
    """The allocation of a recursion spec on a chassis: its depth, tying map and KV sources set by the
    spec, every layer at the chassis' MLP width (or `d_ff`)."""
    L = spec.n_layers
    return ArchConfig(chassis=dataclasses.replace(chassis, n_layers=L), mlp_widths=(d_ff or chassis.d_ff,) * L,
                      block_of_layer=spec.block_of_layer(), kv_source=spec.kv_source(), recursion=spec, dtype=dtype)


def layer_shares(cfg: ArchConfig, depth_shares: tuple[float, ...] | None = None) -> tuple[float, ...]:
    """Share of tokens running each depth position: 1 everywhere without recursion; with it the
    spec's capacities, or `depth_shares` (one per recursion step, e.g. realised in an evaluation)."""
    spec = cfg.recursion
    if spec is None:
        return (1.0,) * cfg.chassis.n_layers
    steps = tuple(depth_shares) if depth_shares is not None else spec.active_share()
    return (1.0,) * spec.first + tuple(steps[r] for r in range(spec.steps) for _ in range(spec.stack)) \
        + (1.0,) * spec.last


def recursion_flops(cfg: ArchConfig, share: tuple[float, ...], matmul: list[int], T: int) -> int:
    """Forward FLOPs per token (without the head) of a recursion allocation: a position's matmuls for
    its share s of tokens; attention over s x T / 2 kept keys on average (per_step: s^2 of the full
    cost), or over every token's step-0 keys (shared_first: s), plus the router's d per token for each
    step whose score is read."""
    c, spec = cfg.chassis, cfg.recursion
    flops = 0.0
    for i, s in enumerate(share):
        keys = s if (spec.kv == "shared_first" and spec.step_of(i)) else s * s
        flops += 2 * matmul[i] * s + 2 * T * c.q_dim * keys
    caps = [1.0, *(spec.capacity(r) for r in range(spec.steps))]
    scored = spec.steps if spec.router == "token_choice" or spec.gate == "sigmoid" else \
        sum(caps[r + 1] < caps[r] for r in range(spec.steps))  # a step's score is computed where it is read
    return round(flops + 2 * c.d_model * scored)  # a scored step scores every token


def recursion_gather_bytes(cfg: ArchConfig, depth_shares: tuple[float, ...] | None = None) -> float:
    """Activation bytes per token the per-step gathers add: a routed step saves the gathered slice
    (s x d), the gated slice and the scattered full-size result (d), fp32."""
    spec = cfg.recursion
    if spec is None:
        return 0.0
    steps = depth_shares if depth_shares is not None else spec.active_share()
    return sum(4 * cfg.chassis.d_model * (2 * s + 1) for s in steps if s < 1)
