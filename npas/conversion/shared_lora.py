"""LoRA factors shared across layers, fitted to what tying lost (see `npas.allocation.lora_sharing`).

Each relaxed (layer, slot) has a residual R_i (d_out, d_in): its own trained weight minus the shared one.
  shared_a  one SVD of the layers' residuals stacked row-wise (zero-padded to the widest d_in): A is
            their common top-r right singular vectors, the subspace that serves them all best in the
            least-squares sense; then each layer's B by least squares against its own residual,
            B_i = argmin ||R_i - scale B_i A[:r_i, :d_in]||. A and the Bs are balanced (one gain g on A,
            1/g on every B) so that neither side starts tiny, as private LoRA's split of sqrt(S) does.
  vera      the frozen pair is the allocation's (drawn from lora_seed); delta = diag(b) B diag(d) A is
            bilinear in (d, b), so alternating least squares fits them: b row by row given d (a ratio of
            inner products), d from its r x r normal equations given b. d starts at VeRA's init.
  shards    refused (`conversion_problems`): which shards a layer reads is fixed by its index, so the
            shared rows cannot be chosen by a fit; convert into shared_a (or private LoRA) instead.
Every fit reads only the residuals and the allocation, never the conversion's seed, so each tensor it
derives is the same whatever the seed.
"""

from __future__ import annotations

import torch
from torch import Tensor

from npas.allocation.config import ArchConfig
from npas.allocation.lora_sharing import relaxed_uses

VERA_ALS_ITERS = 25


def conversion_problems(cfg: ArchConfig) -> list[str]:
    """Why conversion cannot fit this allocation's relaxation (empty when it can)."""
    if cfg.lora_sharing == "shards":
        return ["lora_sharing: shards reads shards chosen by a fixed per-layer index, which a fit from a trained "
                "model cannot choose; convert into lora_sharing: shared_a (or private) and train from there"]
    return []


def fit_shared_a(residuals: list[Tensor], ranks: list[int], scales: list[float], rank: int
                 ) -> tuple[Tensor, list[Tensor]]:
    """(A (rank, d_in_max), [B_i (d_out_i, r_i)]) with scale_i B_i A[:r_i, :d_in_i] ~ R_i."""
    n = max(r.shape[1] for r in residuals)
    X = torch.cat([torch.nn.functional.pad(r.double(), (0, n - r.shape[1])) for r in residuals])
    _, _, Vh = torch.linalg.svd(X, full_matrices=True)  # (n, n): rows beyond X's rank still orthonormal
    A = Vh[:rank]
    Bs = []
    for R, r, s in zip(residuals, ranks, scales, strict=True):
        a = A[:r, : R.shape[1]]  # (r, d_in)
        Bs.append(torch.linalg.lstsq(a.T, R.double().T).solution.T / s)  # (d_out, r)
    rms_a = float(A.pow(2).mean().sqrt())
    rms_b = float(torch.cat([b.flatten() for b in Bs]).pow(2).mean().sqrt()) if Bs else 0.0
    g = (rms_b / rms_a) ** 0.5 if rms_a > 0 and rms_b > 0 else 1.0
    return (A * g).float(), [(b / g).float() for b in Bs]


def fit_vera(R: Tensor, A: Tensor, B: Tensor, d0: float) -> tuple[Tensor, Tensor]:
    """(d (r,), b (d_out,)) minimising ||R - diag(b) B diag(d) A||_F for the frozen slices A (r, d_in),
    B (d_out, r), by alternating least squares from d = d0."""
    R, A, B = R.double(), A.double(), B.double()
    r = A.shape[0]
    d = torch.full((r,), float(d0), dtype=torch.float64)
    b = torch.zeros(B.shape[0], dtype=torch.float64)
    AAt = A @ A.T  # (r, r)
    RAt = R @ A.T  # (d_out, r)
    for _ in range(VERA_ALS_ITERS):
        M = (B * d) @ A  # (d_out, d_in)
        den = M.pow(2).sum(1)
        b = torch.where(den > 0, (R * M).sum(1) / den.clamp_min(1e-300), torch.zeros_like(den))
        Bb = B * b[:, None]  # (d_out, r)
        G = (Bb.T @ Bb) * AAt  # (r, r): <Bb_k A_k, Bb_l A_l>
        rhs = (Bb * RAt).sum(0)  # (r,): Bb_k^T R A_k^T
        d = torch.linalg.lstsq(G, rhs[:, None]).solution[:, 0]
    return d.float(), b.float()


@torch.no_grad()
def fit_relaxation(model: torch.nn.Module, cfg: ArchConfig, residual: dict[tuple[int, str], Tensor],
                   sources: dict[tuple[int, str], list[str]], prov: object) -> None:
    """Write every shared-mode relaxation tensor of `model` from the residuals (keyed (layer, slot)) and
    record its provenance (`prov.add(name, sources, how, fresh)`)."""
    uses = relaxed_uses(cfg)
    shared = model.lora_shared.pairs
    if cfg.lora_sharing == "shared_a":
        for slot, us in uses.items():
            layers = [i for i, *_ in us]
            A, Bs = fit_shared_a([residual[i, slot] for i in layers], [r for _, r, _, _ in us],
                                 [cfg.lora_scale(r) for _, r, _, _ in us], shared[slot].A.shape[0])
            shared[slot].A.copy_(A)
            every = [s for i in layers for s in sources[i, slot]]
            prov.add(f"lora_shared.pairs.{slot}.A", every, f"common top-{A.shape[0]} right singular vectors of "
                     f"layers {layers}' stacked residuals (own weight minus shared)")
            for i, B in zip(layers, Bs, strict=True):
                model.h[i].lora[slot].B.copy_(B)
                prov.add(f"h.{i}.lora.{slot}.B", sources[i, slot], f"least squares of layer {i}'s residual on the "
                         f"shared A (scale {cfg.lora_scale(B.shape[1]):g})")
        return
    frozen = shared["frozen"]
    for name in ("A", "B"):
        prov.add(f"lora_shared.pairs.frozen.{name}", [], f"VeRA's frozen projection from the allocation's lora_seed "
                 f"{cfg.lora_seed} (never trained; not the conversion seed)")
    for slot, us in uses.items():
        for i, r, o, n in us:
            lora = model.h[i].lora[slot]
            d, b = fit_vera(residual[i, slot], frozen.A[:r, :n], frozen.B[:o, :r], float(lora.d[0]))
            lora.d.copy_(d)
            lora.b.copy_(b)
            for part in ("d", "b"):
                prov.add(f"h.{i}.lora.{slot}.{part}", sources[i, slot], f"alternating least squares of layer {i}'s "
                         f"residual on the frozen pair")


__all__ = ["conversion_problems", "fit_relaxation", "fit_shared_a", "fit_vera"]
