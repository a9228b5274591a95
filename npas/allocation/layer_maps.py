"""The pure maps from knobs to per-layer structure: a taper's width profile, a tying mode's layer ->
block map, a bank rule's grouping of block slots into banks, and the groups a layer similarity clusters.

Its own module because these maps decide the shape of an allocation before any size is known, and
they are read on their own (the experiments tie layers by `tying_map`, a conversion clusters trained
layers by `groups_from_similarity`); `npas.allocation.fit` then solves the one free size of what they
shaped. Nothing here counts parameters or needs torch.
"""

from __future__ import annotations

import math

from npas.allocation.config import ArchConfig, block_slots
from npas.allocation.knob_table import BANK_RULES, TAPERS, TYING


def canonical_blocks(assignment: list[int] | tuple[int, ...]) -> tuple[int, ...]:
    """Renumber a layer -> group assignment so blocks are 0..U-1 in order of first use."""
    ids: dict[int, int] = {}
    return tuple(ids.setdefault(a, len(ids)) for a in assignment)


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
