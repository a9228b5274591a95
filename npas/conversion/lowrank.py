"""Least-squares low-rank factorisations shared by template pools and attention atoms.

Both mechanisms generate m weights as coef (m, k) @ basis (k, n). Given the m target weights as rows
of X, the least-squares best `coef @ basis` of rank k is the truncated SVD (Eckart-Young); with
k >= m it reproduces X exactly. Template pools also have entries a row does not observe (members
shorter than the templates cover a prefix; a widened member's fresh new-unit elements are left out):
alternating least squares over the observed entries, started from the SVD, fits them. The factors are balanced so each
coefficient has the RMS of the model's init (1/sqrt(k)), putting the scale in the basis.

`pick_low_rank` is the "stepwise" counterpart: the basis is k of the rows themselves (the first k),
reproduced exactly, and the other rows get their least-squares coefficients on it. Its Frobenius
error is larger than the SVD's, but trained layers are nearly orthogonal to each other, so the SVD's
basis blurs every layer (like averaging them) while picking keeps k layers intact; measured on a
4-layer model with one template_mix pool per slot type (4 members, T = 2), validation loss right after
conversion was 2.58 nats with picked templates vs 3.61 with the SVD (dense model: 2.43).
"""

from __future__ import annotations

import torch
from torch import Tensor

ALS_ITERS = 12


def _balance(coef: Tensor, basis: Tensor) -> tuple[Tensor, Tensor]:
    k = coef.shape[1]
    rms = coef.pow(2).mean(0).sqrt().clamp_min(1e-12)  # (k,)
    g = (1.0 / k ** 0.5) / rms
    return coef * g, basis / g[:, None]


def low_rank(X: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """(coef (m, r), basis (r, n)) with r = min(k, m, n) and coef @ basis the rank-r SVD of X."""
    U, S, Vh = torch.linalg.svd(X.double(), full_matrices=False)
    r = min(k, S.numel())
    coef, basis = U[:, :r] * S[:r], Vh[:r]
    coef, basis = _balance(coef, basis)
    return coef.float(), basis.float()


def masked_low_rank(X: Tensor, observed: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """As `low_rank`, fitting only entries where `observed` (m, n) is True; unobserved entries of X
    are ignored. A row may observe any subset of the columns: a member shorter than the templates
    observes a prefix, one with fresh elements (new MLP units) misses those."""
    X = X.double()
    m = X.shape[0]
    if bool(observed.all()):
        return low_rank(X, k)
    coef, basis = low_rank(torch.where(observed, X, torch.zeros((), dtype=X.dtype)), k)
    coef, basis = coef.double(), basis.double()
    # columns grouped by which rows observe them (for prefixes: the runs between rows' lengths), so
    # each group's basis columns are one least-squares solve over the rows that observe them
    patterns, group = torch.unique(observed.T, dim=0, return_inverse=True)
    for _ in range(ALS_ITERS):
        for j in range(m):
            cols = observed[j]
            if bool(cols.any()):
                coef[j] = torch.linalg.lstsq(basis[:, cols].T, X[j, cols, None]).solution[:, 0]
        for g in range(len(patterns)):
            rows = patterns[g].nonzero()[:, 0]
            if rows.numel():
                cols = group == g
                basis[:, cols] = torch.linalg.lstsq(coef[rows], X[rows][:, cols]).solution
    coef, basis = _balance(coef, basis)
    return coef.float(), basis.float()


def pick_low_rank(X: Tensor, observed: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """(coef (m, r), basis (r, n)): basis = the first r = min(k, m) rows of X (unobserved entries 0),
    each row's coefficients by least squares over its observed entries."""
    X = X.double()
    m = X.shape[0]
    r = min(k, m)
    basis = torch.where(observed[:r], X[:r], torch.zeros((), dtype=X.dtype))
    coef = torch.zeros(m, r, dtype=X.dtype)
    for j in range(m):
        cols = observed[j]
        if j < r:
            coef[j, j] = 1.0  # exact: this row is a basis row
        elif bool(cols.any()):
            coef[j] = torch.linalg.lstsq(basis[:, cols].T, X[j, cols, None]).solution[:, 0]
    coef, basis = _balance(coef, basis)
    return coef.float(), basis.float()
