"""Low-rank relaxations shared across layers: which LoRA factors the relaxed layers share, and what that stores.

Private LoRA (`lora_sharing: private`) gives every relaxed (layer, slot) its own A (r, d_in) and B
(d_out, r): r (d_in + d_out) stored per matrix per layer, which at a low budget crowds out the stack it
relaxes. The other modes share the factors themselves, as the seeds did:

  shared_a  one A per slot type, read by every relaxed layer (ASLoRA); each layer keeps its own B.
            Stored per slot: r_max x d_in_max + sum over layers of d_out x r.
  vera      one frozen random pair A (r_max, D_in), B (D_out, r_max) for the whole model, sized to the
            largest relaxed matrix and sliced for the others (VeRA; PEFT's VeraConfig), regenerated from
            `lora_seed`; each (layer, slot) trains d (r) and b (d_out):
            delta = diag(b) B[:d_out, :r] diag(d) A[:r, :d_in]. Stored: r_max (D_in + D_out) frozen +
            sum (r + d_out) trained.
  shards    a pool of `lora_shards` shared rank-1 shards per factor and slot type (Mixture of Shards):
            layer i's A is `shared` rows of the slot's A pool, chosen by a fixed per-layer index, plus
            `private` rows of its own (`lora_private_fraction` of its rank); B likewise from the B pool,
            by an index of its own (pair dissociation: the rows of A and the columns of B a layer draws
            are not paired). Stored per slot: lora_shards (d_in_max + d_out_max) + sum private (d_in + d_out).

Every mode keeps the relaxation a once-per-forward merge into the layer's weight, so FLOPs per token
stay the dense model's. The frozen VeRA projections are stored (they are parameters of the model and
the budget caps them) but not trained: `frozen_params` reports them, and the accounting's trainable
count is stored minus frozen.

Why a module of its own, without torch: the accounting, the budget fit and the allocation's checks read
these shapes and counts thousands of times per search; `npas.allocation.shared_lora` builds the modules.
The functions take the allocation duck-typed (`cfg`), because the allocation's module imports the
checks here.
"""

from __future__ import annotations

import math
import random
from typing import Any, Literal, get_args

from npas.allocation.slots import block_slots

LoraSharing = Literal["private", "shared_a", "vera", "shards"]
LORA_SHARING: tuple[str, ...] = get_args(LoraSharing)
VERA_D_INIT = 0.1  # VeRA's d starts at 0.1 and b at 0 (PEFT's d_initial): the relaxed model starts tied


def sharing_field_problems(mode: Any, seed: Any, shards: Any, private_fraction: Any) -> list[str]:
    """The sharing fields' own types and ranges, one line each naming the fix."""
    out = []
    if mode not in LORA_SHARING:
        out.append(f"lora_sharing: {mode!r} is not one of {list(LORA_SHARING)}")
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63:
        out.append(f"lora_seed: must be an integer in [0, 2**63), got {seed!r}")
    if not isinstance(shards, int) or isinstance(shards, bool) or shards < 0:
        out.append(f"lora_shards: must be an integer >= 0 (shared shards per factor and slot type), got {shards!r}")
    if (not isinstance(private_fraction, int | float) or isinstance(private_fraction, bool)
            or not 0.0 <= private_fraction <= 1.0):
        out.append(f"lora_private_fraction: must be a number in [0, 1], got {private_fraction!r}")
    return out


def read_sharing_fields(d: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """The sharing fields of an allocation mapping, strictly typed (a file's "0.5" is not 0.5); each
    wrongly typed one appends a problem naming it. Absent fields are left out (their defaults)."""
    out: dict[str, Any] = {}
    kinds = {"lora_sharing": (str, f"one of {list(LORA_SHARING)}"), "lora_seed": (int, "an integer"),
             "lora_shards": (int, "an integer"), "lora_private_fraction": (int | float, "a number")}
    for key, (kind, what) in kinds.items():
        if key in d:
            v = d[key]
            if isinstance(v, bool) or not isinstance(v, kind):
                problems.append(f"{key}: must be {what}, got {v!r}")
            else:
                out[key] = float(v) if key == "lora_private_fraction" else v
    return out


def split_rank(rank: int, private_fraction: float) -> tuple[int, int]:
    """(shared, private) shards of a rank-r factor under `shards`: round(fraction x r) private, half up
    (Python's round would send 0.5 to the even side and make the split depend on parity)."""
    private = min(rank, math.floor(private_fraction * rank + 0.5))
    return rank - private, private


def shard_index(seed: int, slot: str, factor: str, layer: int, pool: int, k: int) -> tuple[int, ...]:
    """The k distinct shards of a pool of `pool` that `layer`'s factor ("A" or "B") of `slot` reads,
    fixed by the allocation: a string-seeded `random.Random` is the same on every machine and Python
    (seed version 2 hashes the string with SHA-512), so the index never needs storing."""
    return tuple(random.Random(f"npas-shards:{seed}:{slot}:{factor}:{layer}").sample(range(pool), k))


def relaxed_uses(cfg: Any) -> dict[str, list[tuple[int, int, int, int]]]:
    """slot -> [(layer, rank, d_out, d_in)] of every relaxed matrix, in layer order: the attention slots a
    layer reads at its `lora_attn` rank, its MLP slots at `lora_mlp` (at the layer's own MLP width)."""
    c = cfg.chassis
    out: dict[str, list[tuple[int, int, int, int]]] = {}
    for slot in block_slots(c.activation):
        ranks = cfg.lora_attn if slot.startswith("attn") else cfg.lora_mlp
        for i, r in enumerate(ranks):
            if r and cfg.layer_reads(i, slot):
                o, n = c.slot_shape(slot, cfg.mlp_widths[i])
                out.setdefault(slot, []).append((i, r, o, n))
    return out


def pool_size(ranks: list[int] | tuple[int, ...], shard_fraction: float, private_fraction: float) -> int:
    """Shared shards per factor of a `shards` space: `shard_fraction` of the shared rank vectors the
    relaxed positions draw in all (1 = as many as private LoRA would own), at least the most one
    position draws (its shards are distinct)."""
    shared = [split_rank(r, private_fraction)[0] for r in ranks if r]
    if not shared:
        return 0
    return max(max(shared), math.floor(shard_fraction * sum(shared) + 0.5))


def knob_fields(mode: str, seed: int, shard_fraction: float, private_fraction: float,
                ranks: list[int] | tuple[int, ...]) -> dict[str, Any]:
    """The allocation's sharing fields from a space's knob values and the per-position ranks."""
    out: dict[str, Any] = {"lora_sharing": mode, "lora_seed": int(seed)}
    if mode == "shards":
        out["lora_shards"] = pool_size(ranks, shard_fraction, private_fraction)
        out["lora_private_fraction"] = float(private_fraction)
    return out


def equal_private_rank(cfg: Any) -> int:
    """The private LoRA rank whose relaxation stores about what `cfg`'s shared one does on the same
    relaxed matrices (at least 1): the rank of the private-LoRA baseline a sharing space enqueues."""
    sides = sum(o + n for uses in relaxed_uses(cfg).values() for _, _, o, n in uses)
    return max(1, math.floor(relaxation_params(cfg)[0] / sides + 0.5)) if sides else 1


def param_names(cfg: Any, layer: int, slot: str) -> list[str]:
    """The state-dict names a relaxed (layer, slot) reads its delta from (provenance of what it computes)."""
    mode, own = cfg.lora_sharing, f"h.{layer}.lora.{slot}"
    if mode == "private":
        return [f"{own}.A", f"{own}.B"]
    if mode == "shared_a":
        return [f"lora_shared.pairs.{slot}.A", f"{own}.B"]
    if mode == "vera":
        return ["lora_shared.pairs.frozen.A", "lora_shared.pairs.frozen.B", f"{own}.d", f"{own}.b"]
    rank = cfg.lora_attn[layer] if slot.startswith("attn") else cfg.lora_mlp[layer]
    shared, private = split_rank(rank, cfg.lora_private_fraction)
    return ([f"lora_shared.pairs.{slot}.A", f"lora_shared.pairs.{slot}.B"] if shared else []) + (
        [f"{own}.A", f"{own}.B"] if private else [])


def rank_problems(cfg: Any) -> list[str]:
    """What only the whole allocation knows: a shards pool must hold every layer's shared shards."""
    if cfg.lora_sharing != "shards":
        return []
    need = max((split_rank(r, cfg.lora_private_fraction)[0] for uses in relaxed_uses(cfg).values()
                for _, r, _, _ in uses), default=0)
    if need > cfg.lora_shards:
        return [f"lora_shards: {cfg.lora_shards} shared shards cannot give a layer its {need} distinct ones; "
                f"raise lora_shards to >= {need} or lora_private_fraction"]
    return []


def _frozen_shape(cfg: Any) -> tuple[int, int, int]:
    """(r_max, D_out, D_in) of VeRA's one frozen pair: the largest rank and matrix sides relaxed."""
    uses = [u for us in relaxed_uses(cfg).values() for u in us]
    if not uses:
        return 0, 0, 0
    return max(u[1] for u in uses), max(u[2] for u in uses), max(u[3] for u in uses)


def shared_shapes(cfg: Any) -> dict[str, tuple[tuple[int, int], tuple[int, int] | None]]:
    """Name -> (A's shape, B's shape or None) of the tensors the relaxed layers share.

    shared_a: `{slot}` -> ((r_max, d_in_max), None); shards: `{slot}` -> ((shards, d_in_max),
    (d_out_max, shards)); vera: `frozen` -> ((r_max, D_in), (D_out, r_max)); private: nothing."""
    mode = cfg.lora_sharing
    if mode == "vera":
        r, o, n = _frozen_shape(cfg)
        return {"frozen": ((r, n), (o, r))} if r else {}
    out: dict[str, tuple[tuple[int, int], tuple[int, int] | None]] = {}
    for slot, uses in relaxed_uses(cfg).items():
        d_out, d_in = max(u[2] for u in uses), max(u[3] for u in uses)
        if mode == "shared_a":
            out[slot] = ((max(u[1] for u in uses), d_in), None)
        elif mode == "shards" and cfg.lora_shards:
            out[slot] = ((cfg.lora_shards, d_in), (d_out, cfg.lora_shards))
    return out


def own_params(cfg: Any, rank: int, d_out: int, d_in: int) -> int:
    """Parameters one relaxed (layer, slot) owns under the allocation's mode."""
    mode = cfg.lora_sharing
    if mode == "private":
        return rank * (d_in + d_out)
    if mode == "shared_a":
        return rank * d_out
    if mode == "vera":
        return rank + d_out
    private = split_rank(rank, cfg.lora_private_fraction)[1]
    return private * (d_in + d_out)


def relaxation_params(cfg: Any) -> tuple[int, int, list[float]]:
    """(stored, frozen, each layer's share of stored) of the relaxation: shared tensors split over the
    (layer, slot) matrices reading them, in proportion to the elements each reads, so the shares sum to
    the stored count."""
    L = cfg.chassis.n_layers
    shares = [0.0] * L
    uses = relaxed_uses(cfg)
    stored = 0
    for slot_uses in uses.values():
        for i, r, o, n in slot_uses:
            own = own_params(cfg, r, o, n)
            stored += own
            shares[i] += own
    frozen = 0
    for name, (a, b) in shared_shapes(cfg).items():
        size = math.prod(a) + (math.prod(b) if b else 0)
        stored += size
        if name == "frozen":
            frozen = size
            readers = [(i, r * (o + n)) for us in uses.values() for i, r, o, n in us]
        elif b is None:  # shared_a: each layer reads its rank's rows at its own d_in
            readers = [(i, r * n) for i, r, o, n in uses[name]]
        else:  # shards: each layer reads its shared rows of A and columns of B
            readers = [(i, split_rank(r, cfg.lora_private_fraction)[0] * (o + n)) for i, r, o, n in uses[name]]
        total = sum(w for _, w in readers)
        for i, w in readers:
            shares[i] += size * w / total if total else size / len(readers)
    return stored, frozen, shares


__all__ = [
    "LORA_SHARING",
    "VERA_D_INIT",
    "LoraSharing",
    "equal_private_rank",
    "knob_fields",
    "own_params",
    "param_names",
    "pool_size",
    "read_sharing_fields",
    "rank_problems",
    "relaxation_params",
    "relaxed_uses",
    "shard_index",
    "shared_shapes",
    "sharing_field_problems",
    "split_rank",
]
