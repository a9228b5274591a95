"""LoRA deltas from what tying lost: a truncated SVD of (the layer's own weight - the shared one).

The relaxed layer computes W_shared + scale * B @ A with scale = alpha / r (rsLoRA: alpha / sqrt(r),
see ArchConfig.lora_scale), so B and A are set to U_r sqrt(S_r) / sqrt(scale) and sqrt(S_r) V_r^T /
sqrt(scale): scale * B @ A is then the best rank-r approximation of the residual (Eckart-Young), split
evenly between the factors so neither starts tiny. Components with nothing to fit (rank above the
matrix's, or singular values ~0, e.g. an untied layer) keep A's fresh Kaiming draw and B = 0, as a
fresh LoRA starts: the delta is still exact, and those components can still learn (A and B both 0
would never receive a gradient).
"""

from __future__ import annotations

import torch
from torch import Tensor

NEGLIGIBLE = 1e-6  # singular values below this fraction of the largest (or of 1e-12 absolute) are nothing


def lora_factors(residual: Tensor, rank: int, scale: float, fresh_a: Tensor) -> tuple[Tensor, Tensor, int]:
    """(B (out, r), A (r, in), components fitted) with scale * B @ A the rank-r SVD of `residual`."""
    U, S, Vh = torch.linalg.svd(residual.double(), full_matrices=False)
    top = float(S[0]) if S.numel() else 0.0
    useful = int((S > max(NEGLIGIBLE * top, 1e-12)).sum())
    k = min(rank, useful)
    B = torch.zeros(residual.shape[0], rank, dtype=torch.float64)
    A = fresh_a.double().clone()
    root = S[:k].sqrt() / scale ** 0.5
    B[:, :k] = U[:, :k] * root
    A[:k] = root[:, None] * Vh[:k]
    return B.float(), A.float(), k


def relative_error(residual: Tensor, approx: Tensor) -> float:
    """||residual - approx||_F / ||residual||_F (0 for a zero residual approximated by zero)."""
    den = float(residual.norm())
    return float((residual - approx).norm()) / den if den > 0 else float(approx.norm())
