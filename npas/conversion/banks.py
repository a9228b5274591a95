"""A parameter bank's weights from the trained slots it generates (Shapeshifter pools).

`tie`, `slice` and `tile` banks copy: member j's element t is bank element (offset_j + t) mod size,
so the least-squares bank is, element by element, the mean of the trained values that read it (an
exactly untied slice bank gets each member's own weights back). `template_mix` members are rows of
coef @ templates, tiled when the templates are shorter than the member: the members' weights (folded
onto the template length by averaging) are fitted by least squares at rank T (`lowrank`), exactly
when T >= members and the templates are full length; `stepwise` takes T members as the templates and
fits the others' coefficients (see `lowrank.pick_low_rank` for why that converts better untrained).

Members' *fresh* elements (the random input rows of a widened layer's new units) are left out of
every fit: a bank element any member reads from the trained model is fitted to those members' values
only, and template_mix coefficients see trained elements only (fresh ones are unobserved), so what is
derived does not depend on the conversion seed. Template elements only fresh members read keep the
bank's init: the new units they generate start random, as new units do (and can learn).
"""

from __future__ import annotations

import torch
from torch import Tensor

from npas.allocation.sharing import BankModule
from npas.conversion.lowrank import masked_low_rank, pick_low_rank


def _index(bank: BankModule, j: int) -> Tensor:
    size = bank.weight.shape[-1]
    return (bank.offsets[j] + torch.arange(bank.numels[j])) % size


def _trained(w: Tensor, fresh: Tensor | None) -> Tensor:
    """Flat bool: member elements taken from the trained model (not fresh)."""
    return torch.ones(w.numel(), dtype=torch.bool) if fresh is None else ~fresh.reshape(-1)


def fit_copy_bank(bank: BankModule, members: list[Tensor], fresh: list[Tensor | None] | None = None
                  ) -> tuple[Tensor, int]:
    """(weight (size,), elements no member reads) for a tie / slice / tile bank. ``fresh[j]``: member
    j's fresh elements (bool, its shape) or None; an element is the mean of its trained reads where it
    has any, else of its fresh ones."""
    size = bank.weight.shape[-1]
    fresh = fresh or [None] * len(members)
    total = torch.zeros(2, size, dtype=torch.float64)  # tier 0: trained reads, tier 1: fresh reads
    count = torch.zeros(2, size, dtype=torch.float64)
    for j, (w, f) in enumerate(zip(members, fresh, strict=True)):
        idx = _index(bank, j)
        trained = _trained(w, f)
        for tier, take in enumerate((trained, ~trained)):
            total[tier].index_add_(0, idx[take], w.reshape(-1)[take].double())
            count[tier].index_add_(0, idx[take], torch.ones(int(take.sum()), dtype=torch.float64))
    tier = torch.where(count[0] > 0, 0, 1)
    total, count = total.gather(0, tier[None])[0], count.gather(0, tier[None])[0]
    unread = count == 0
    out = bank.weight.detach().double().clone()  # elements nobody reads keep their init
    out[~unread] = total[~unread] / count[~unread]
    return out.float(), int(unread.sum())


def fold(bank: BankModule, members: list[Tensor], fresh: list[Tensor | None] | None = None
         ) -> tuple[Tensor, Tensor, Tensor]:
    """Members' weights folded onto the template length: (m, S) means of their trained elements,
    (m, S) observed mask (a trained element lands there) and (S,) mask of template elements some
    member reads only fresh elements at."""
    size = bank.weight.shape[-1]
    m = len(members)
    fresh = fresh or [None] * m
    total = torch.zeros(m, size, dtype=torch.float64)
    count = torch.zeros(m, size, dtype=torch.float64)
    covered = torch.zeros(size, dtype=torch.bool)
    for j, (w, f) in enumerate(zip(members, fresh, strict=True)):
        idx = torch.arange(bank.numels[j]) % size  # template_mix tiles from offset 0
        trained = _trained(w, f)
        total[j].index_add_(0, idx[trained], w.reshape(-1)[trained].double())
        count[j].index_add_(0, idx[trained], torch.ones(int(trained.sum()), dtype=torch.float64))
        covered[idx] = True
    observed = count > 0
    X = torch.where(observed, total / count.clamp_min(1), torch.zeros((), dtype=torch.float64))
    return X, observed, covered & ~observed.any(0)


def fit_template_bank(bank: BankModule, members: list[Tensor], mode: str = "average",
                      fresh: list[Tensor | None] | None = None) -> tuple[Tensor, Tensor, int]:
    """(templates (T, S), coef (m, T), templates left fresh) for a template_mix bank; mode "average"
    is the least-squares (SVD) fit, "stepwise" picks members as templates. ``fresh``: as `fit_copy_bank`."""
    X, observed, fresh_only = fold(bank, members, fresh)
    T = bank.weight.shape[0]
    coef, basis = (pick_low_rank if mode == "stepwise" else masked_low_rank)(X, observed, T)
    r = basis.shape[0]
    weight = bank.weight.detach().float().clone()  # templates beyond the fit's rank keep their init
    weight[:r] = torch.where(fresh_only, weight[:r], basis)  # ... and so do elements only fresh units read
    c = torch.zeros(len(members), T)
    c[:, :r] = coef  # ... with zero coefficients: the members start exact, the spare templates still learn
    return weight, c, T - r
