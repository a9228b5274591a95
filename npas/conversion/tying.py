"""One shared weight from the layers that use it (Relaxed Recursive Transformers' initialisations).

`average` sets each shared element to the mean of the layers' weights that read it; `stepwise` takes
it from the first layer that reads it (RRT's "stepwise": layer 0 for the first block of a cycle, the
first of each run for sequential tying), which keeps one trained layer intact. `auto` (the default)
picks per shared weight: `average` where LoRA relaxes the layers reading it (the mean leaves each
layer the smallest residual for its delta to fit), `stepwise` where nothing does (a mean of k
unrelated trained matrices is a blurred, ~1/sqrt(k)-scaled one; measured on a 4-layer model tied
without LoRA: 2.77 nats right after conversion with stepwise vs 3.58 with average). Layers of different
MLP widths read nested leading slices of the widest, so an element is averaged over the layers whose
slice covers it; every element is covered by the widest member.

Elements a member holds *fresh* (the random input rows of a widened layer's new units) are
seed-dependent, not trained: an element any member holds from the trained model is taken from those
members only, so whatever is derived from the shared weight is independent of the conversion seed;
an element every covering member holds fresh is shared as before (and stays fresh, see `fresh_only`).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

TieInit = Literal["auto", "average", "stepwise"]
TIE_INITS: tuple[str, ...] = ("auto", "average", "stepwise")


def shared_weight(shape: tuple[int, int], members: list[Tensor], mode: str = "average",
                  fresh: list[Tensor | None] | None = None) -> Tensor:
    """The (out, in) shared tensor from the members' weights, each a leading (o, i) sub-block of it.
    ``fresh[j]``: member j's elements that are fresh (bool, its shape), or None when all are trained."""
    fresh = fresh or [None] * len(members)
    # tier 0: trained elements; tier 1: fresh ones, used only where no member has a trained element
    total = [torch.zeros(shape), torch.zeros(shape)]
    count = [torch.zeros(shape), torch.zeros(shape)]
    for w, f in zip(members, fresh, strict=True):
        o, i = w.shape
        trained = torch.ones(o, i, dtype=torch.bool) if f is None else ~f
        for tier, take in enumerate((trained, ~trained)):
            if mode == "stepwise":
                free = (count[tier][:o, :i] == 0) & take
                total[tier][:o, :i] = torch.where(free, w, total[tier][:o, :i])
            else:
                total[tier][:o, :i] += torch.where(take, w, 0.0)
            count[tier][:o, :i] += take
    if bool(((count[0] + count[1]) == 0).any()):
        raise ValueError(f"shared weight {tuple(shape)} has elements no member covers; the widest member "
                         "must span the block")
    out = [t if mode == "stepwise" else t / c.clamp_min(1) for t, c in zip(total, count, strict=True)]
    return torch.where(count[0] > 0, out[0], out[1])


def fresh_only(shape: tuple[int, int], members: list[Tensor], fresh: list[Tensor | None]) -> Tensor | None:
    """(out, in) bool: the shared elements every covering member holds fresh (None when there are none)."""
    trained = torch.zeros(shape, dtype=torch.bool)
    any_fresh = torch.zeros(shape, dtype=torch.bool)
    for w, f in zip(members, fresh, strict=True):
        o, i = w.shape
        if f is None:
            trained[:o, :i] = True
        else:
            trained[:o, :i] |= ~f
            any_fresh[:o, :i] |= f
    out = any_fresh & ~trained
    return out if bool(out.any()) else None
