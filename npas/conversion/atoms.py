"""Attention atoms (MASA) from the trained layers: a dictionary fit of one projection type.

Each reader's (d, d) weight is a row of coef @ atoms. With the readers' trained weights stacked as
rows, the least-squares atoms of count K are the top-K right singular vectors (`lowrank.low_rank`),
exact when K >= readers; `stepwise` uses K readers' own weights as atoms instead. Atoms beyond the readers' rank keep their init with zero coefficients: they
change nothing at the start and still learn.
"""

from __future__ import annotations

import torch
from torch import Tensor

from npas.allocation.atoms import AtomDictionary
from npas.conversion.lowrank import low_rank, pick_low_rank


def fit_atoms(dictionary: AtomDictionary, rows: list[Tensor], mode: str = "average") -> tuple[Tensor, Tensor, int]:
    """(atoms (K, d, d), coef (rows, K), atoms left fresh); mode "stepwise" takes K readers' weights
    as the atoms and fits the others' coefficients (`lowrank.pick_low_rank`)."""
    K, o, i = dictionary.atoms.shape  # (d, d), or a llama slot's shape (GQA K/V atoms are narrower)
    X = torch.stack([w.reshape(-1) for w in rows])  # (rows, o*i)
    if mode == "stepwise":
        coef, basis = pick_low_rank(X, torch.ones_like(X, dtype=torch.bool), K)
    else:
        coef, basis = low_rank(X, K)
    r = basis.shape[0]
    atoms = dictionary.atoms.detach().float().clone()
    atoms[:r] = basis.view(r, o, i)
    c = torch.zeros(len(rows), K)
    c[:, :r] = coef
    return atoms, c, K - r
