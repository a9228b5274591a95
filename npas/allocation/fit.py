"""Fit a candidate to the budget by construction: solve its one free size analytically.

A sampled candidate fixes everything but one size, and that size is solved so stored params <= budget
as closely as the shapes allow:
  * `slice` / `tile` pools  -> bank sizes (integers, distributed in proportion to each bank's cap),
  * `template_mix` pools    -> the template count T,
  * expert pools            -> the expert width d_expert (every pool's experts share it),
  * everything else         -> a width scale on the MLP (and, in `all` mode, on d_model too).
Stored parameters are monotone in each of these, so the largest size with `stored <= budget` is
found exactly; `step` records what the next increment would have cost, which is how close to the
budget the shapes allow (`budget - stored < step` unless the size hit its cap).
When a pooled candidate's banks cannot take the whole budget, `npas.allocation.fill` then grows its
MLP widths into the rest (the fill order is stated there). The shapes a candidate's knobs fix before
this (taper, tying map, bank members) are `npas.allocation.layer_maps`'.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from npas.allocation.budget import stored_params
from npas.allocation.budget_scope import embedding_params
from npas.allocation.config import ArchConfig, Bank, Chassis


@dataclass(frozen=True)
class Fit:
    """A fitted allocation, or the reason none fits."""

    config: ArchConfig | None
    reason: str | None = None
    free: str = ""  # which size was solved: width_scale | bank_size | templates | d_expert (+width_scale: grown)
    stored: int = 0
    step: int = 0  # params the next increment of the free size would add
    capped: bool = False  # the free size hit its upper bound below the budget
    short: str | None = None  # why a feasible fit stores under npas.allocation.fill.FILL_TARGET of the budget


def scaled_widths(base: list[float], scale: float) -> tuple[int, ...]:
    """Each layer's MLP width at a scale of its unrounded width: round(scale x width), at least 1."""
    return tuple(max(1, math.floor(scale * x + 0.5)) for x in base)


def largest_within(f: Callable[[float], int], lo: float, hi: float, budget: int) -> float:
    """Largest x in [lo, hi] with f(x) <= budget, f monotone non-decreasing and f(lo) <= budget."""
    for _ in range(64):
        mid = (lo + hi) / 2
        if f(mid) <= budget:
            lo = mid
        else:
            hi = mid
    return lo


def next_breakpoint(base: list[float], scale: float) -> float:
    """Smallest scale above `scale` at which some width changes."""
    return min((math.floor(scale * x + 0.5) + 0.5) / x for x in base) + 1e-12


def fit_width(make: Callable[[Chassis, tuple[int, ...]], ArchConfig], chassis: Chassis, profile: list[float],
              budget: int, mode: str = "all", max_scale: float = 4.0, scope: str = "all") -> Fit:
    """Scale MLP widths (and in `all` mode step d_model down by n_heads) to fill the budget.

    `scope="non_embedding"` fits the parameters outside the token and position embeddings; those
    shrink with d_model, so they are left out of every probe rather than once from the budget."""
    d, H = chassis.d_model, chassis.width_step  # n_heads (2 x n_heads on llama: even head_dim)

    def at(ch: Chassis, scale: float) -> ArchConfig:
        return make(ch, scaled_widths([ch.d_ff * p for p in profile], scale))

    def params(ch: Chassis, scale: float) -> int:
        return stored_params(at(ch, scale)) - (embedding_params(ch) if scope == "non_embedding" else 0)

    ch, lo = chassis, 1e-9
    if mode == "all":
        for dm in range(d, 0, -H):
            ch = replace(chassis, d_model=dm, d_ff=max(1, round(chassis.d_ff * dm / d)))
            if params(ch, 1.0) <= budget:
                lo = 1.0
                break
    floor_params = params(ch, lo)
    if floor_params > budget:
        return Fit(None, f"even the narrowest shape (d_model={ch.d_model}, MLP width 1) needs {floor_params:,} "
                         f"params > budget {budget:,}; raise the budget, or enable tying or pools")
    base = [ch.d_ff * p for p in profile]
    if params(ch, max_scale) <= budget:
        return Fit(at(ch, max_scale), free="width_scale", stored=params(ch, max_scale), capped=True)
    s = largest_within(lambda x: params(ch, x), lo, max_scale, budget)
    cfg = at(ch, s)
    stored = params(ch, s)
    step = params(ch, next_breakpoint(base, s)) - stored
    return Fit(cfg, free="width_scale", stored=stored, step=step)


def fit_banks(cfg: ArchConfig, members: list[tuple[tuple[int, str], ...]], generator: str,
              budget: int, min_templates: int = 2, max_templates: int = 64, floor: int = 0,
              tile: int = 0, seed: int = 0) -> Fit:
    """Give `cfg` pooled banks and solve their free size (bank sizes, or template count T).

    `floor`: the least stored params full-length template_mix templates must reach before one
    more, shortened, template takes the budget instead (0: T full-length templates whenever they fit).
    `tile`, `seed`: a `hash` bank's (see `npas.allocation.hashing`); its size is free from one tile up
    to its members' elements (collision-free there), one element at a time."""
    if generator == "hash":
        return _fit_hashed(cfg, members, budget, tile, seed)
    probe = replace(cfg, banks=tuple(
        Bank(m, generator, size=max(cfg.member_numels(Bank(m, "tie", 1))), templates=1) for m in members))
    numels = [probe.member_numels(b) for b in probe.banks]
    if generator == "tie":
        stored = stored_params(probe)
        if stored > budget:
            return Fit(None, f"tied banks need {stored:,} params > budget {budget:,}")
        return Fit(probe, free="none", stored=stored, capped=True)
    if generator == "template_mix":
        return _fit_templates(probe, numels, budget, min_templates, max_templates, floor)
    caps = [sum(n) if generator == "slice" else max(n) for n in numels]
    fixed = stored_params(replace(probe, banks=tuple(replace(b, size=1) for b in probe.banks))) - len(caps)
    avail = budget - fixed
    if avail < len(caps):
        return Fit(None, f"{generator} banks leave {avail:,} params for {len(caps)} banks after the fixed "
                         f"{fixed:,} (embeddings, norms, LoRA); raise the budget")
    sizes = _proportional(avail, caps)
    out = replace(probe, banks=tuple(replace(b, size=s) for b, s in zip(probe.banks, sizes, strict=True)))
    stored = fixed + sum(sizes)
    return Fit(out, free="bank_size", stored=stored, step=1, capped=sizes == caps)


def _fit_hashed(cfg: ArchConfig, members: list[tuple[tuple[int, str], ...]], budget: int, tile: int,
                seed: int) -> Fit:
    """`hash` banks: the array sizes, split in proportion to the members' elements, each between one
    tile and its members' elements; stored params are exact to the element, so any budget from the
    smallest arrays (one tile each) up to the collision-free ones (the untied count) is met exactly."""
    caps = [sum(cfg.member_numels(Bank(m, "tie", 1))) for m in members]
    if tile < 1:
        return Fit(None, f"hash banks need a tile of >= 1 elements, got {tile}; set knobs.pools.tile")
    small = [c for c in caps if c < tile]
    if small:
        return Fit(None, f"a hash bank's members hold {min(small):,} elements, fewer than one tile of {tile}; "
                         f"lower knobs.pools.tile")
    probe = replace(cfg, banks=tuple(Bank(m, "hash", size=tile, tile=tile, seed=seed) for m in members))
    fixed = stored_params(probe) - tile * len(caps)
    avail = budget - fixed
    if avail < tile * len(caps):
        return Fit(None, f"hash banks of one tile ({tile} elements) each need {fixed + tile * len(caps):,} params "
                         f"> budget {budget:,} (embeddings, norms, LoRA are {fixed:,}); raise the budget or lower "
                         f"knobs.pools.tile")
    sizes = [max(tile, s) for s in _proportional(avail, caps)]
    while sum(sizes) > avail:  # raising a share to one tile may overshoot: take it back from the largest
        i = max(range(len(sizes)), key=lambda j: sizes[j] - tile)
        sizes[i] -= 1
    out = replace(probe, banks=tuple(replace(b, size=s) for b, s in zip(probe.banks, sizes, strict=True)))
    stored = fixed + sum(sizes)
    return Fit(out, free="bank_size", stored=stored, step=1, capped=sizes == caps)


def _fit_templates(probe: ArchConfig, numels: list[list[int]], budget: int, t_min: int, t_max: int,
                   floor: int = 0) -> Fit:
    """template_mix: T >= t_min templates of full length if they fit (then T is the free size),
    else t_min templates shortened in proportion and tiled to each member (then length is free).

    Full-length templates store a whole block's slots each, so the largest T that fits can leave up
    to one template unused; when T full ones store under `floor`, T + 1 templates, shortened the
    same way, take the budget instead (the architecture and its FLOPs stay those sampled)."""
    caps = [max(n) for n in numels]
    coefs = sum(len(n) for n in numels)
    fixed = stored_params(replace(probe, banks=())) - sum(
        n for b in probe.banks for n in probe.member_numels(b))  # the probe's banked slots are not direct
    per_t = sum(caps) + coefs
    if fixed + t_min * per_t <= budget:
        T = min(t_max, (budget - fixed) // per_t)
        if fixed + T * per_t >= floor or T == t_max:
            out = replace(probe, banks=tuple(replace(b, templates=T) for b in probe.banks))
            return Fit(out, free="templates", stored=fixed + T * per_t, step=per_t, capped=T == t_max)
        t_min = T + 1  # (T + 1 full-length templates do not fit: shortened, they fill the budget)
    avail = (budget - fixed - t_min * coefs) // t_min
    if avail < len(caps):
        return Fit(None, f"template_mix with {t_min} templates leaves no room after the fixed {fixed:,} params "
                         f"(embeddings, norms, LoRA, coefficients); lower templates or raise the budget {budget:,}")
    sizes = _proportional(avail, caps)
    out = replace(probe, banks=tuple(replace(b, size=s_, templates=t_min)
                                     for b, s_ in zip(probe.banks, sizes, strict=True)))
    return Fit(out, free="bank_size", stored=fixed + t_min * (sum(sizes) + coefs), step=t_min)


def expert_pools(n_layers: int, window: int, per_layer: int, fraction: float,
                 top_k: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(experts per pool, pool of each layer): one pool per window of adjacent layers (the last
    window may be shorter), holding fraction x its layers x E experts, and never fewer than top_k."""
    pool_of_layer = tuple(i // window for i in range(n_layers))
    sizes = tuple(max(top_k, round(fraction * pool_of_layer.count(p) * per_layer))
                  for p in range(pool_of_layer[-1] + 1))
    return sizes, pool_of_layer


def fit_experts(make: Callable[[Chassis, int], ArchConfig], chassis: Chassis, budget: int, mode: str = "all",
                max_scale: float = 4.0, scope: str = "all") -> Fit:
    """Solve the expert width d_expert. Stored params are affine in it (every pool's experts widen
    together, routers do not), so the widest width within budget is one division, capped at
    max_scale x d_ff. In `all` mode d_model narrows by n_heads only when not even width 1 fits.
    `scope="non_embedding"` fits the parameters outside the token and position embeddings."""
    d, H = chassis.d_model, chassis.width_step  # n_heads (2 x n_heads on llama: even head_dim)

    def counted(cfg: ArchConfig) -> int:
        return stored_params(cfg) - (embedding_params(cfg.chassis) if scope == "non_embedding" else 0)

    shapes = [chassis]
    if mode == "all":
        shapes += [replace(chassis, d_model=dm, d_ff=max(1, round(chassis.d_ff * dm / d))) for dm in range(d - H, 0, -H)]
    for ch in shapes:
        one = counted(make(ch, 1))
        if one <= budget:
            break
    else:
        return Fit(None, f"experts of width 1 need {one:,} params > budget {budget:,} even at d_model={ch.d_model}; "
                         f"raise the budget, lower experts.per_layer or experts.pool_fraction")
    step = counted(make(ch, 2)) - one  # params of one more unit of width in every expert
    cap = max(1, int(max_scale * ch.d_ff))
    width = min(cap, 1 + (budget - one) // step)
    cfg = make(ch, width)
    return Fit(cfg, free="d_expert", stored=counted(cfg), step=step, capped=width == cap)


def _proportional(total: int, caps: list[int]) -> list[int]:
    """Split `total` into integers >= 1 in proportion to `caps`, none above its cap (largest remainder)."""
    if total >= sum(caps):
        return list(caps)
    cap_sum = sum(caps)
    raw = [max(1.0, total * c / cap_sum) for c in caps]
    sizes = [min(c, math.floor(r)) for r, c in zip(raw, caps, strict=True)]
    order = sorted(range(len(caps)), key=lambda i: raw[i] - math.floor(raw[i]), reverse=True)
    left = total - sum(sizes)
    while left > 0:
        progressed = False
        for i in order:
            if left and sizes[i] < caps[i]:
                sizes[i] += 1
                left -= 1
                progressed = True
        if not progressed:
            break
    while sum(sizes) > total:  # max(1, .) may overshoot when total is tiny
        i = max(range(len(sizes)), key=lambda j: sizes[j])
        sizes[i] -= 1
    return sizes
