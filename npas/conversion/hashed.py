"""A hash bank's array from the trained weights it replaces (randomized parameter sharing).

The bank generates weight i as sign_i x array[index_i] (npas.allocation.hashing), which is linear in
the array, so the least-squares array is closed-form: minimising sum_i (w_i - sign_i a_j)^2 over the
weights hashed to element j gives a_j = the mean of sign_i x w_i over them (sign_i^2 = 1). At the
collision-free size every element has one reader and the members come back exactly (a signed
permutation is inverted); smaller arrays average their readers.

Fresh elements (the random rows of a widened MLP's new units) are left out as in `banks.fit_copy_bank`:
an array element with a trained reader is fitted to trained readers only, else to its fresh ones, and
an element nobody reads (none: the fold reads every element) would keep its init.
"""

from __future__ import annotations

import torch
from torch import Tensor

from npas.allocation.hashing import HashedBank


def fit_hashed_bank(bank: HashedBank, members: list[Tensor], fresh: list[Tensor | None] | None = None
                    ) -> tuple[Tensor, int]:
    """(array (size,), elements no member reads): each element the sign-corrected mean of its readers."""
    size = bank.weight.shape[0]
    index, sign = bank.element_index()
    w = torch.cat([m.reshape(-1) for m in members]).double() * sign.double()
    trained = torch.cat([torch.ones(m.numel(), dtype=torch.bool) if f is None else ~f.reshape(-1)
                         for m, f in zip(members, fresh or [None] * len(members), strict=True)])
    total = torch.zeros(2, size, dtype=torch.float64)  # tier 0: trained readers, tier 1: fresh readers
    count = torch.zeros(2, size, dtype=torch.float64)
    for tier, take in enumerate((trained, ~trained)):
        total[tier].index_add_(0, index[take], w[take])
        count[tier].index_add_(0, index[take], torch.ones(int(take.sum()), dtype=torch.float64))
    tier = torch.where(count[0] > 0, 0, 1)
    total, count = total.gather(0, tier[None])[0], count.gather(0, tier[None])[0]
    read = count > 0
    out = bank.weight.detach().double().clone()
    out[read] = total[read] / count[read]
    return out.float(), int((~read).sum())
