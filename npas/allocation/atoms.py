"""Matrix atoms (MASA): one projection type of every layer generated from a shared dictionary.

Each reader (a layer, or a unique block with per-block coefficients) gets its d x d weight as a
learned combination sum_k coef[r, k] * atoms[k] of K shared atoms. All readers' weights are made in
one (rows, K) @ (K, d*d) matmul once per forward pass, so per-token FLOPs equal the dense model's
and the generation costs 2 * rows * K * d^2 FLOPs per step, not per token.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class AtomDictionary(nn.Module):
    """`atoms` (K, out, in) shared across depth and `coef` (rows, K), one row per reader.

    Atoms are (d, d) on the classic chassis; `shape` gives a llama chassis' slot shape (grouped-query
    K/V atoms project to n_kv_heads x head_dim)."""

    def __init__(self, n_atoms: int, rows: int, d_model: int, std: float,
                 shape: tuple[int, int] | None = None) -> None:
        super().__init__()
        self.atoms = nn.Parameter(torch.empty(n_atoms, *(shape or (d_model, d_model))))
        self.coef = nn.Parameter(torch.empty(rows, n_atoms))
        self.std = std
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # coef ~ N(0, 1/K) keeps a generated weight at the std of one atom, like a dense init
        nn.init.normal_(self.atoms, mean=0.0, std=self.std)
        nn.init.normal_(self.coef, mean=0.0, std=1.0 / math.sqrt(self.atoms.shape[0]))

    def generate(self) -> Tensor:
        """Every reader's weight, (rows, out, in): einsum('rk,kij->rij') as one flat matmul."""
        k, o, i = self.atoms.shape
        return (self.coef @ self.atoms.view(k, o * i)).view(-1, o, i)
