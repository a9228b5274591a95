"""Fill the budget: after a candidate's free size is solved, grow what is still free to grow.

A search compares candidates at one budget, so each must store (nearly) all of it: a pooled
candidate holding a third of its budget would be judged with parameters it was never given. The
fit grows sizes in this order, each only as far as the budget allows, and never changes a sampled
knob:

  1. the candidate's free size at its sampled shapes (`npas.allocation.fit`): the MLP width scale
     (and d_model in `all` mode), the bank sizes of `slice` / `tile` / `hash` pools, the template count T of
     `template_mix` pools, or the expert width;
  2. `template_mix` only: when T full-length templates store under FILL_TARGET of the budget, one
     more template, all of them shortened (and tiled) to take the budget: the bank count grows,
     then the bank size is free, and the architecture and its FLOPs stay as sampled;
  3. the MLP widths of a pooled candidate whose banks can take no more: `tie` banks (no free size),
     `slice` / `tile` / `hash` banks at their members' full length, `template_mix` at fit.max_templates
     full-length templates. The widths scale together, in the proportions of the taper, by
     bisection on one width scale up to fit.max_width_scale; every bank keeps its members' full
     length at the new widths (`at_widths`), so the banks grow with the MLP slots they generate.

LoRA ranks, bank counts (`pools.banks`), the least template count and expert counts are knobs:
sampled, never grown. A candidate still under FILL_TARGET of its budget records why (`shortfall`),
so the front can mark it and say so.
"""

from __future__ import annotations

import math
from dataclasses import replace

from npas.allocation.budget import stored_params
from npas.allocation.config import ArchConfig, Bank
from npas.allocation.fit import Fit, next_breakpoint, scaled_widths

# Which fit sampled an allocation. Stored on every trial (`fit_version`; absent = 1) because a resumed
# study keeps the allocations it stored: trials sampled under an older fit stay as they were.
#   1: the free size alone; pooled candidates could leave their banks' spare budget unused
#   2: then one more, shortened template_mix template, or the MLP widths of pooled candidates whose
#      banks can take no more, fill what the free size left
FIT_VERSION = 2
FILL_TARGET = 0.98  # the least fill (stored / budget) a candidate reaches unless its shapes cannot


def full_length(cfg: ArchConfig, bank: Bank) -> int:
    """A bank's size at its members' full length: `slice` holds every member whole (their sum),
    `tie`, `tile` and `template_mix` the largest member; `hash` every member whole, read once (collision-free)."""
    n = cfg.member_numels(bank)
    return sum(n) if bank.generator in ("slice", "hash") else max(n)


def at_widths(cfg: ArchConfig, widths: tuple[int, ...]) -> ArchConfig:
    """`cfg` with these MLP widths, every bank at its members' full length there (T unchanged).

    Built in one step (an allocation checks itself when made, and its banks must fit the new
    widths): a block's MLP slot is as wide as the widest of its layers."""
    block_width = [0] * cfg.n_blocks
    for w, b in zip(widths, cfg.block_of_layer, strict=True):
        block_width[b] = max(block_width[b], w)
    ch = cfg.chassis

    def numels(bank: Bank) -> list[int]:
        return [math.prod(ch.slot_shape(slot, block_width[b])) for b, slot in bank.members]

    banks = tuple(replace(b, size=sum(n) if b.generator in ("slice", "hash") else max(n))
                  for b in cfg.banks for n in [numels(b)])
    return replace(cfg, mlp_widths=widths, banks=banks)


def grow_pooled(fit: Fit, profile_widths: list[float], budget: int, max_scale: float) -> Fit:
    """Step 3: widen the MLP of a pooled candidate whose banks can take no more (`fit.capped`).

    `profile_widths` are the sampled MLP widths before rounding (d_ff x taper profile): scale s
    gives each layer round(s x width), never below the width the candidate already has. Stored
    parameters are monotone in s (direct MLP slots, full-length banks and MLP LoRA all widen), so
    the largest s within budget is found by bisection; `step` is what the next change of any
    width would add. A candidate whose banks took the budget is returned as is."""
    cfg = fit.config
    if cfg is None or not cfg.banks or not fit.capped:
        return fit
    base = cfg.mlp_widths

    def widths(s: float) -> tuple[int, ...]:
        return tuple(max(w, x) for w, x in zip(base, scaled_widths(profile_widths, s), strict=True))

    def stored(s: float) -> int:
        return stored_params(at_widths(cfg, widths(s)))

    if stored(1.0) > budget:  # (rounding ties at scale 1 can widen a layer by one: then nothing grows)
        return fit
    if stored(max_scale) <= budget:
        grown = at_widths(cfg, widths(max_scale))
        return replace(fit, config=grown, free=f"{fit.free}+width_scale", stored=stored_params(grown), step=0,
                       capped=True)
    lo, hi = 1.0, max_scale  # bisection until no width changes between lo and hi: lo's widths are the widest
    while next_breakpoint(profile_widths, lo) < hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if stored(mid) <= budget else (lo, mid)
    s = lo
    if widths(s) == base:
        return fit
    at = stored(s)
    nxt = next_breakpoint(profile_widths, s)
    while widths(nxt) == widths(s):  # a layer held at its sampled width hides that breakpoint
        nxt = next_breakpoint(profile_widths, nxt)
    return replace(fit, config=at_widths(cfg, widths(s)), free=f"{fit.free}+width_scale", stored=at,
                   step=stored(nxt) - at, capped=False)


def shortfall(fit: Fit, budget: int, max_scale: float) -> str | None:
    """Why a feasible candidate stores under FILL_TARGET of its budget (the cause, for a line that
    already gives the fill), or None when it does not."""
    if fit.config is None or fit.stored >= FILL_TARGET * budget:
        return None
    if fit.capped and fit.free.startswith("templates") and not fit.free.endswith("width_scale"):
        return ("T reached fit.max_templates and the MLP cannot widen further; raise fit.max_templates or "
                "lower the budget")
    if fit.capped:
        what = "the expert width" if fit.free == "d_expert" else "the MLP widths"
        return (f"{what} reached fit.max_width_scale ({max_scale:g}x d_ff); raise fit.max_width_scale or "
                f"lower the budget")
    return (f"the next step of its free size ({fit.free}) adds {fit.step:,} params, more than the "
            f"{budget - fit.stored:,} left")


def fill_note(fill: float | None, version: int, short: str = "") -> str | None:
    """Why a recorded trial stores under FILL_TARGET of its budget, for the front and the dashboard:
    the reason its fit gave, or the older fit that sampled it (None when it does not fall short)."""
    if fill is None or fill >= FILL_TARGET:
        return None
    if short:
        return short
    if version < FIT_VERSION:
        return f"sampled by fit version {version}, which left the spare budget of pooled banks unused"
    return "its shapes hold no more"
