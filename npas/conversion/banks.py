"""A parameter bank's weights from the trained slots it generates (Shapeshifter pools).

`tie`, `slice` and `tile` banks copy: member j's element t is bank element (offset_j + t) mod size,
so the least-squares bank is, element by element, the mean of the trained values that read it (an
exactly untied slice bank gets each member's own weights back). `template_mix` members are rows of
coef @ templates, tiled when the templates are shorter than the member: the members' weights (folded
onto the template length by averaging) are fitted by least squares at rank T (`lowrank`), exactly
when T >= members and the templates are full length; `stepwise` takes T members as the templates and
fits the others' coefficients (see `lowrank.pick_low_rank` for why that converts better untrained).
"""

from __future__ import annotations

import torch
from torch import Tensor

from npas.allocation.sharing import BankModule
from npas.conversion.lowrank import masked_low_rank, pick_low_rank


def _index(bank: BankModule, j: int) -> Tensor:
    size = bank.weight.shape[-1]
    return (bank.offsets[j] + torch.arange(bank.numels[j])) % size


def fit_copy_bank(bank: BankModule, members: list[Tensor]) -> tuple[Tensor, int]:
    """(weight (size,), elements no member reads) for a tie / slice / tile bank."""
    size = bank.weight.shape[-1]
    total = torch.zeros(size, dtype=torch.float64)
    count = torch.zeros(size, dtype=torch.float64)
    for j, w in enumerate(members):
        idx = _index(bank, j)
        total.index_add_(0, idx, w.reshape(-1).double())
        count.index_add_(0, idx, torch.ones(idx.numel(), dtype=torch.float64))
    unread = count == 0
    out = bank.weight.detach().double().clone()  # elements nobody reads keep their init
    out[~unread] = total[~unread] / count[~unread]
    return out.float(), int(unread.sum())


def fold(bank: BankModule, members: list[Tensor]) -> tuple[Tensor, Tensor]:
    """Members' weights folded onto the template length: (m, S) means and (m, S) observed mask."""
    size = bank.weight.shape[-1]
    m = len(members)
    total = torch.zeros(m, size, dtype=torch.float64)
    count = torch.zeros(m, size, dtype=torch.float64)
    for j, w in enumerate(members):
        idx = torch.arange(bank.numels[j]) % size  # template_mix tiles from offset 0
        total[j].index_add_(0, idx, w.reshape(-1).double())
        count[j].index_add_(0, idx, torch.ones(idx.numel(), dtype=torch.float64))
    observed = count > 0
    return torch.where(observed, total / count.clamp_min(1), torch.zeros((), dtype=torch.float64)), observed


def fit_template_bank(bank: BankModule, members: list[Tensor], mode: str = "average"
                      ) -> tuple[Tensor, Tensor, int]:
    """(templates (T, S), coef (m, T), templates left fresh) for a template_mix bank; mode "average"
    is the least-squares (SVD) fit, "stepwise" picks members as templates."""
    X, observed = fold(bank, members)
    T = bank.weight.shape[0]
    coef, basis = (pick_low_rank if mode == "stepwise" else masked_low_rank)(X, observed, T)
    r = basis.shape[0]
    weight = bank.weight.detach().float().clone()  # templates beyond the fit's rank keep their init
    weight[:r] = basis
    c = torch.zeros(len(members), T)
    c[:, :r] = coef  # ... with zero coefficients: the members start exact, the spare templates still learn
    return weight, c, T - r
