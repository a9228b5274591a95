"""Per-token recursion depth (Mixture-of-Recursions): one shared stack of U layers that each token
passes through a number of times its router decides.

The layout is plain tying, so everything that already reads an allocation (stored parameters, norms,
LoRA per depth position, banks, the dashboard's tying map) keeps working unchanged: `first` unique
layers, then the stack's U blocks cycled `steps` times, then `last` unique layers ("middle-cycle";
first = last = 0 is the plain cycle). Depth position `first + r * U + j` is step r's layer j and reads
block `first + j`. What recursion adds is *who* runs a step: at step r only the tokens still active
pass through the stack's layers (gathered, run, scattered back: a token routed out costs nothing
later), and a router of N_r rows x d_model decides:

  expert_choice  at step r a linear score per token; training keeps the top `capacities[r]` share of
                 each sequence (of the tokens active at r - 1), as the paper does. That is not causal
                 (a token's depth depends on later tokens), so evaluation and sampling use the causal
                 rule: a token stays while its own score clears a threshold, tracked on the training
                 windows as the boundary score of the top-k selection (an average over steps). An
                 auxiliary BCE loss (`aux_weight`) pushes selected scores up and the others down, so
                 the threshold separates what the top-k would have kept.
  token_choice   the router's softmax over N_r depths, read once where the stack starts; a token's
                 depth is its argmax. Causal by construction, so both rules are the same. Balanced by
                 a Switch-style loss over depths (`balance_weight`) and a z-loss (`z_weight`).

KV policies: `per_step` -- a step's attention sees the keys/values of the tokens active at that step
only; `shared_first` -- steps after the first reuse the first step's keys/values for every token (the
layers of later steps are KV consumers of step 0's layer, via `kv_source`), which needs capacity 1 at
step 0. `gate`: `sigmoid` scales a step's update of a token by its router score (sigmoid of the
expert-choice score; the chosen depth's probability for token-choice), keeping the router on the
gradient path; `none` applies the stack's update unscaled.

This module is the spec and its checks (no torch); the routing forward is `npas.allocation.recursing`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, get_args

RecursionRouter = Literal["expert_choice", "token_choice"]
RecursionKv = Literal["per_step", "shared_first"]
RecursionGate = Literal["sigmoid", "none"]
RecursionLayout = Literal["cycle", "middle_cycle"]  # the stack alone, or between a unique first and last layer
# how the share of tokens running a step falls with depth (expert_choice): linear (N - r) / N, halving
# 2^-r, full (every token every step: fixed-depth recursion, the router unused)
CapacitySchedule = Literal["linear", "halving", "full"]


def capacity_schedule(schedule: str, steps: int) -> tuple[float, ...]:
    """The capacities of a named schedule at `steps` steps (() for full: every token runs every step)."""
    if schedule == "full":
        return ()
    if schedule == "halving":
        return tuple(0.5**r for r in range(steps))
    return tuple((steps - r) / steps for r in range(steps))


@dataclass(frozen=True)
class RecursionSpec:
    """A stack of `stack` (U) shared layers run up to `steps` (N_r) times per token; see the module."""

    steps: int
    stack: int
    first: int = 0  # unique layers before the stack ("middle-cycle" with last > 0 too)
    last: int = 0  # unique layers after it
    capacities: tuple[float, ...] = ()  # expert_choice: share of the sequence active at each step; () = all 1
    router: RecursionRouter = "expert_choice"
    kv: RecursionKv = "per_step"
    gate: RecursionGate = "sigmoid"
    aux_weight: float = 0.001  # expert_choice: BCE of the scores against the top-k selection
    balance_weight: float = 0.1  # token_choice: Switch-style balance over depths
    z_weight: float = 1e-5  # token_choice: mean squared log-sum-exp of the router logits

    @property
    def n_layers(self) -> int:
        return self.first + self.stack * self.steps + self.last

    def capacity(self, step: int) -> float:
        """Share of each sequence's tokens that runs `step` (token_choice: 1, it balances instead)."""
        return self.capacities[step] if self.capacities else 1.0

    def active_share(self) -> tuple[float, ...]:
        """Expected share of tokens running each step: the capacities (token_choice with a balanced
        router: a 1 / N_r share stops after each step)."""
        if self.router == "token_choice":
            return tuple((self.steps - r) / self.steps for r in range(self.steps))
        return tuple(self.capacity(r) for r in range(self.steps))

    def layer_share(self) -> tuple[float, ...]:
        """Expected share of tokens running each depth position (unique layers: 1)."""
        share = self.active_share()
        return ((1.0,) * self.first + tuple(share[r] for r in range(self.steps) for _ in range(self.stack))
                + (1.0,) * self.last)

    def step_of(self, layer: int) -> int | None:
        """The recursion step a depth position belongs to (None for the unique layers)."""
        r = (layer - self.first) // self.stack if self.stack else -1
        return r if layer >= self.first and r < self.steps else None

    def block_of_layer(self) -> tuple[int, ...]:
        """The tying map of the layout: unique first blocks, the stack's blocks cycled, unique last blocks."""
        U, f = self.stack, self.first
        return (tuple(range(f)) + tuple(f + j for _ in range(self.steps) for j in range(U))
                + tuple(range(f + U, f + U + self.last)))

    def kv_source(self) -> tuple[int, ...]:
        """Who computes each layer's keys/values: itself (per_step), or step 0's layer j (shared_first)."""
        L = self.n_layers
        if self.kv != "shared_first":
            return tuple(range(L))
        return tuple(self.first + (i - self.first) % self.stack if self.step_of(i) else i for i in range(L))

    def router_params(self, d_model: int) -> int:
        return self.steps * d_model

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "stack": self.stack, "first": self.first, "last": self.last,
                "capacities": list(self.capacities), "router": self.router, "kv": self.kv, "gate": self.gate,
                "aux_weight": self.aux_weight, "balance_weight": self.balance_weight, "z_weight": self.z_weight}


KEYS = ("steps", "stack", "first", "last", "capacities", "router", "kv", "gate", "aux_weight", "balance_weight",
        "z_weight")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def read_recursion(raw: Any, problems: list[str]) -> RecursionSpec | None:
    """A `recursion:` mapping of an allocation file, strictly typed (a problem per wrong field)."""
    if not isinstance(raw, dict) or set(raw) - set(KEYS) or not {"steps", "stack"} <= set(raw):
        problems.append(f"recursion: must be a mapping of {', '.join(KEYS)} (steps and stack required), got {raw!r}")
        return None
    before = len(problems)
    for key in ("steps", "stack", "first", "last"):
        if key in raw and not _is_int(raw[key]):
            problems.append(f"recursion.{key}: must be an integer, got {raw[key]!r}")
    caps = raw.get("capacities", [])
    if not isinstance(caps, list | tuple) or not all(_is_num(c) for c in caps):
        problems.append(f"recursion.capacities: must be a list of numbers in (0, 1], got {caps!r}")
    for key in ("router", "kv", "gate"):
        if key in raw and not isinstance(raw[key], str):
            problems.append(f"recursion.{key}: must be text, got {raw[key]!r}")
    for key in ("aux_weight", "balance_weight", "z_weight"):
        if key in raw and not _is_num(raw[key]):
            problems.append(f"recursion.{key}: must be a number, got {raw[key]!r}")
    if len(problems) > before:
        return None
    defaults = RecursionSpec(1, 1)
    return RecursionSpec(raw["steps"], raw["stack"], raw.get("first", 0), raw.get("last", 0),
                         tuple(float(c) for c in caps), raw.get("router", defaults.router), raw.get("kv", defaults.kv),
                         raw.get("gate", defaults.gate),
                         *(float(raw.get(k, getattr(defaults, k))) for k in ("aux_weight", "balance_weight",
                                                                             "z_weight")))


def recursion_problems(spec: RecursionSpec | None, n_layers: int, block_of_layer: tuple[int, ...],
                       kv_source: tuple[int, ...], kv_mode: str, has_experts: bool) -> list[str]:
    """Every reason a recursion spec does not fit its allocation, each a line naming the fix."""
    if spec is None:
        return []
    for key in ("steps", "stack"):
        v = getattr(spec, key)
        if not _is_int(v) or v < 1:
            return [f"recursion.{key}: must be an integer >= 1, got {v!r}"]
    for key in ("first", "last"):
        v = getattr(spec, key)
        if not _is_int(v) or v < 0:
            return [f"recursion.{key}: must be an integer >= 0, got {v!r}"]
    out = []
    for key, allowed in (("router", RecursionRouter), ("kv", RecursionKv), ("gate", RecursionGate)):
        if getattr(spec, key) not in get_args(allowed):
            out.append(f"recursion.{key}: {getattr(spec, key)!r} is not one of {list(get_args(allowed))}")
    for key in ("aux_weight", "balance_weight", "z_weight"):
        v = getattr(spec, key)
        if not _is_num(v) or not math.isfinite(v) or v < 0:
            out.append(f"recursion.{key}: must be a finite number >= 0, got {v!r}")
    caps = spec.capacities
    if caps:
        if spec.router == "token_choice":
            out.append("recursion.capacities: token_choice routes by a softmax over depths, not capacities; "
                       "leave capacities empty or use router: expert_choice")
        elif len(caps) != spec.steps:
            out.append(f"recursion.capacities: needs one capacity per step ({spec.steps}), got {len(caps)}")
        elif not all(0 < c <= 1 for c in caps) or any(b > a for a, b in zip(caps, caps[1:], strict=False)):
            out.append(f"recursion.capacities: must be in (0, 1] and never rise from one step to the next, "
                       f"got {list(caps)}")
    if spec.kv == "shared_first" and spec.capacity(0) < 1:
        out.append("recursion.kv: shared_first reuses step 0's keys/values for every token, so step 0 needs "
                   "capacity 1; set capacities[0] to 1 or use kv: per_step")
    if out:
        return out
    if spec.n_layers != n_layers:
        return [f"recursion: first + stack x steps + last = {spec.n_layers} layers, but the chassis has {n_layers}; "
                f"set chassis.n_layers to {spec.n_layers}"]
    if block_of_layer != spec.block_of_layer():
        out.append(f"recursion: block_of_layer must be the recursion layout {list(spec.block_of_layer())} "
                   f"(unique first layers, the stack cycled, unique last layers), got {list(block_of_layer)}")
    if kv_source != spec.kv_source() or (spec.kv == "shared_first" and kv_mode != "kv"):
        out.append(f"recursion: kv {spec.kv} needs kv_source {list(spec.kv_source())} with kv_mode kv "
                   f"(other cross-layer KV sharing does not combine with recursion), got {list(kv_source)}")
    if has_experts:
        out.append("recursion: expert pools do not combine with recursion yet; drop experts or recursion")
    return out


def recursion_layout(spec: RecursionSpec) -> dict[str, Any]:
    """The allocation fields a recursion spec fixes: chassis depth, tying map, KV sources."""
    return {"n_layers": spec.n_layers, "block_of_layer": spec.block_of_layer(), "kv_source": spec.kv_source()}
