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
MLP widths into the rest (the fill order is stated there).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from npas.allocation.budget import stored_params
from npas.allocation.budget_scope import embedding_params
from npas.allocation.config import ArchConfig, Bank, Chassis, block_slots, canonical_blocks
from npas.allocation.knob_table import BANK_RULES, TAPERS, TYING


# ---- taper and tying: pure maps from knobs to per-layer structure -----------------------------
def taper_profile(schedule: str, n_layers: int, ratio: float) -> list[float]:
    """Relative MLP width per layer with mean exactly 1 (so sum of widths = L * d_ff at scale 1).

    `ratio` is first/last width (>= 1). cosine from 1.5x to 0.5x is ratio 3: front-heavy, mean 1x.
    """
    L = n_layers
    if schedule == "uniform" or L == 1:
        return [1.0] * L
    a, b = 2 * ratio / (1 + ratio), 2 / (1 + ratio)  # first, last; (a + b) / 2 == 1
    xs = [i / (L - 1) for i in range(L)]
    if schedule == "linear":
        prof = [a + (b - a) * x for x in xs]
    elif schedule in ("cosine", "reverse"):
        prof = [b + (a - b) * (1 + math.cos(math.pi * x)) / 2 for x in xs]
        if schedule == "reverse":
            prof.reverse()
    elif schedule == "step":
        prof = [a if i < L // 2 else b for i in range(L)]
        if L % 2:
            prof[L // 2] = 1.0
    elif schedule == "hourglass":
        prof = [b + (a - b) * (1 + math.cos(2 * math.pi * x)) / 2 for x in xs]
    else:
        raise ValueError(f"unknown taper {schedule!r}; known: {TAPERS}")
    mean = sum(prof) / L
    return [p / mean for p in prof]


Similarity = tuple[tuple[float, ...], ...]  # (L, L) cosine similarity of trained layers (npas.conversion.groups)

NO_SIMILARITY = ("needs a layer similarity from trained weights, which `npas search` supplies (from --init-from DIR, "
                 "or from one short pretraining of the reference it runs itself); run the space through npas search")


def groups_from_similarity(sim: Similarity | list[list[float]], n_groups: int) -> tuple[int, ...]:
    """Item -> group (numbered in order of first use) with `n_groups` groups of mutually similar items.

    Average-linkage clustering of 1 - similarity: every pair across two merged groups counts, so one
    outlying item does not chain unrelated groups together (single linkage would). Groups need not be
    contiguous. Deterministic for a given matrix, so every driver reading the same stored similarity
    builds the same allocation."""
    import numpy as np
    from scipy.cluster.hierarchy import linkage
    from scipy.spatial.distance import squareform

    m = np.asarray(sim, dtype=np.float64)
    n = m.shape[0] if m.ndim == 2 else 0
    if m.ndim != 2 or m.shape != (n, n) or n == 0:
        raise ValueError(f"a similarity must be a square, non-empty matrix, got shape {m.shape}")
    if not 1 <= n_groups <= n:
        raise ValueError(f"learned groups need 1 <= groups <= {n} (the items clustered), got {n_groups}")
    if n_groups == n:
        return tuple(range(n))
    if n_groups == 1:
        return (0,) * n
    dist = np.clip(1.0 - (m + m.T) / 2, 0.0, None)
    np.fill_diagonal(dist, 0.0)
    # exactly n_groups: replay the first n - n_groups merges of the tree (fcluster's maxclust cut can
    # return fewer groups when merge heights tie, and the group count is the searched knob)
    merges = linkage(squareform(dist, checks=False), method="average")
    members: dict[int, list[int]] = {i: [i] for i in range(n)}
    for k, (a, b) in enumerate(merges[: n - n_groups, :2].astype(int)):
        members[n + k] = members.pop(a) + members.pop(b)
    label = [0] * n
    for g, items in enumerate(members.values()):
        for i in items:
            label[i] = g
    return canonical_blocks(label)


def tying_map(mode: str, n_layers: int, unique: int, groups: list[list[int]] | None = None,
              similarity: Similarity | None = None) -> tuple[int, ...]:
    """Layer -> block for a tying mode with `unique` blocks (U). Raises ValueError with the reason.

    `learned` clusters the layers into U groups by `similarity` (one row per layer)."""
    L, U = n_layers, unique
    if mode == "none":
        return tuple(range(L))
    if mode == "all":
        return (0,) * L
    if mode == "learned":
        if similarity is None:
            raise ValueError(f"tying mode 'learned' {NO_SIMILARITY}")
        if len(similarity) != L:
            raise ValueError(f"tying mode 'learned' has a similarity of {len(similarity)} layers, but this candidate "
                             f"has n_layers={L}; learned groups need the depth of the model they were learned from")
        return groups_from_similarity(similarity, U)
    if mode == "explicit":
        if not groups:
            raise ValueError("tying mode 'explicit' needs knobs.tying.groups")
        assign = [-1] * L
        for g, layers in enumerate(groups):
            for i in layers:
                assign[i] = g
        return canonical_blocks(assign)
    if not 1 <= U <= L:
        raise ValueError(f"tying {mode} needs 1 <= unique_blocks <= n_layers={L}, got {U}")
    if mode == "sequential":  # AABB
        return canonical_blocks([i * U // L for i in range(L)])
    if mode == "cycle":  # ABAB
        return tuple(i % U for i in range(L))
    if mode == "middle_loop":  # unique first and last, the middle loops over U - 2 blocks
        if U < 3 or L < 3:
            raise ValueError(f"tying middle_loop needs unique_blocks >= 3 and n_layers >= 3, got U={U}, L={L}")
        return canonical_blocks([0] + [1 + (i - 1) % (U - 2) for i in range(1, L - 1)] + [U - 1])
    raise ValueError(f"unknown tying mode {mode!r}; known: {TYING}")


def block_similarity(sim: Similarity, block_of_layer: tuple[int, ...], blocks: list[int]) -> list[list[float]]:
    """Similarity of blocks: the mean similarity over pairs of their layers (a block of tied layers
    is as alike to another as its layers are on average)."""
    layers = {b: [i for i, x in enumerate(block_of_layer) if x == b] for b in blocks}
    return [[sum(sim[i][j] for i in layers[a] for j in layers[b]) / (len(layers[a]) * len(layers[b]))
             for b in blocks] for a in blocks]


def bank_members(cfg: ArchConfig, rule: str, n_banks: int, explicit: list[list[int]] | None = None,
                 similarity: Similarity | None = None) -> list[tuple[tuple[int, str], ...]]:
    """Group the block slots into banks by a layer -> bank rule, `n_banks` per group, in block order.

    `learned` groups by slot type like `by_type`, then clusters each type's blocks into `n_banks`
    banks of similar blocks (`block_similarity`), which need not be neighbours."""
    slots = block_slots(cfg.chassis.activation)
    # only what blocks store: slots made from atoms, and K/V no layer of the block reads, have no weight to pool
    items = [(b, s) for s in slots for b in range(cfg.n_blocks) if cfg.block_stores(b, s)]
    if rule == "explicit":
        if not explicit:
            raise ValueError("bank rule 'explicit' needs knobs.pools.groups (lists of block indices)")
        out = [m for s in slots for grp in explicit
               if (m := tuple((b, s) for b in grp if b < cfg.n_blocks and cfg.block_stores(b, s)))]
        if not out:
            raise ValueError(f"pool groups {explicit} name no block of this candidate (its blocks are "
                             f"0..{cfg.n_blocks - 1} after tying)")
        return out
    if rule == "all":
        keys = {m: () for m in items}
    elif rule in ("by_type", "learned"):
        keys = {m: (m[1],) for m in items}
    elif rule == "by_type_and_shape":
        keys = {m: (m[1], cfg.slot_shape(*m)) for m in items}
    else:
        raise ValueError(f"unknown bank rule {rule!r}; known: {BANK_RULES}")
    groups: dict[tuple, list] = {}
    for m in items:
        groups.setdefault(keys[m], []).append(m)
    if rule == "learned":
        if similarity is None:
            raise ValueError(f"bank rule 'learned' {NO_SIMILARITY}")
        if len(similarity) != cfg.chassis.n_layers:
            raise ValueError(f"bank rule 'learned' has a similarity of {len(similarity)} layers, but this candidate "
                             f"has n_layers={cfg.chassis.n_layers}; learned banks need the depth they were learned from")
    out = []
    for members in groups.values():
        k = min(n_banks, len(members))
        if rule == "learned":
            sim = block_similarity(similarity, cfg.block_of_layer, [b for b, _ in members])
            label = groups_from_similarity(sim, k)
            out.extend(tuple(m for m, g in zip(members, label, strict=True) if g == j) for j in range(k))
            continue
        for j in range(k):  # contiguous chunks, so neighbouring blocks share
            out.append(tuple(members[j * len(members) // k:(j + 1) * len(members) // k]))
    return out


# ---- the fit itself -----------------------------------------------------------------------------
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
