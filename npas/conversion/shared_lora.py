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
  shards    the shared_a fit generalised to pools: the A pool is the stacked residuals' top right singular
            vectors (one per shard, cycled when the pool has more shards than d_in has directions);
            given it, the B pool is linear in the residuals, so one least-squares solve over every layer
            that reads it (each output row from the layers that have it); then each layer's private
            shards are the rank-p SVD of what the shared ones left (as private LoRA's, `lora_factors`).
Every fit reads only the residuals and the allocation, never the conversion's seed, so each tensor it
derives is the same whatever the seed.
"""

from __future__ import annotations

import torch
from torch import Tensor

from npas.allocation.config import ArchConfig
from npas.allocation.lora_sharing import relaxed_uses
from npas.conversion.lora import lora_factors

VERA_ALS_ITERS = 25


def _top_directions(residuals: list[Tensor], k: int) -> Tensor:
    """(k, d_in_max): the stacked residuals' top right singular vectors (rows padded with zero columns),
    cycled when k exceeds d_in_max; every row is a unit vector, so no shard starts dead."""
    n = max(r.shape[1] for r in residuals)
    X = torch.cat([torch.nn.functional.pad(r.double(), (0, n - r.shape[1])) for r in residuals])
    _, _, Vh = torch.linalg.svd(X, full_matrices=True)  # (n, n): rows beyond X's rank still orthonormal
    return Vh[torch.arange(k) % n]


def _balance(A: Tensor, Bs: list[Tensor]) -> tuple[Tensor, list[Tensor]]:
    """One gain g on A and 1/g on every B so that both sides have the same RMS (neither starts tiny)."""
    rms_a = float(A.pow(2).mean().sqrt())
    rms_b = float(torch.cat([b.flatten() for b in Bs]).pow(2).mean().sqrt()) if Bs else 0.0
    g = (rms_b / rms_a) ** 0.5 if rms_a > 0 and rms_b > 0 else 1.0
    return A * g, [b / g for b in Bs]


def fit_shared_a(residuals: list[Tensor], ranks: list[int], scales: list[float], rank: int
                 ) -> tuple[Tensor, list[Tensor]]:
    """(A (rank, d_in_max), [B_i (d_out_i, r_i)]) with scale_i B_i A[:r_i, :d_in_i] ~ R_i."""
    A = _top_directions(residuals, rank)
    Bs = []
    for R, r, s in zip(residuals, ranks, scales, strict=True):
        a = A[:r, : R.shape[1]]  # (r, d_in)
        Bs.append(torch.linalg.lstsq(a.T, R.double().T).solution.T / s)  # (d_out, r)
    A, Bs = _balance(A, Bs)
    return A.float(), [b.float() for b in Bs]


def fit_shard_pools(residuals: list[Tensor], scales: list[float], index_a: list[tuple[int, ...]],
                    index_b: list[tuple[int, ...]], pool: int) -> tuple[Tensor, Tensor]:
    """(A pool (pool, d_in_max), B pool (d_out_max, pool)) with scale_i B[:d_out, ib_i] A[ia_i, :d_in] ~ R_i.

    Given A, output row j of every reading layer is linear in row j of B: R_i[j] ~ B[j] Q_i with
    Q_i = scale_i E_i A[ia_i, :d_in] (E_i puts shard ib_i[k] against A's row ia_i[k]), so B[j] solves
    (sum Q_i Q_i^T) x = sum Q_i R_i[j]^T over the layers with a row j: one solve per band of rows that
    the same layers have (tapered MLPs have fewer output rows)."""
    A = _top_directions(residuals, pool)
    o_max = max(r.shape[0] for r in residuals)
    Qs = []
    for R, s, ia, ib in zip(residuals, scales, index_a, index_b, strict=True):
        Q = torch.zeros(pool, R.shape[1], dtype=torch.float64)
        if ia:
            Q[list(ib)] = s * A[list(ia), : R.shape[1]]
        Qs.append(Q)
    B = torch.zeros(o_max, pool, dtype=torch.float64)
    cuts = sorted({0, *(r.shape[0] for r in residuals)})
    for lo, hi in zip(cuts, cuts[1:], strict=False):
        readers = [k for k, R in enumerate(residuals) if R.shape[0] >= hi]
        # only the shards these layers read are determined (the others stay 0); over those, G is positive
        # definite up to rounding (each read shard's A row is a unit vector), and a relative ridge of 1e-12
        # keeps the solve unique, so no rank decision (a rounding-sensitive threshold) enters the result
        read = sorted({j for k in readers for j in index_b[k]})
        if not read:
            continue
        G = sum(Qs[k][read] @ Qs[k][read].T for k in readers)
        G = G + 1e-12 * float(G.diagonal().max()) * torch.eye(len(read), dtype=G.dtype)
        rhs = sum(Qs[k][read] @ residuals[k][lo:hi].double().T for k in readers)  # (read, rows)
        B[lo:hi, read] = torch.linalg.solve(G, rhs).T
    A, (B,) = _balance(A, [B])
    return A.float(), B.float()


def _nothing(residual: Tensor, n: int) -> str | None:
    """The provenance note of a per-layer factor fitted to a zero residual (a layer its block does not
    share with another: nothing for the relaxation to fit), which then keeps a fresh factor's zeros."""
    if float(residual.abs().max()) > 1e-12:
        return None
    return f"{n} of {n} components with nothing left to fit (the layer's residual is zero)"


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
        top = float(G.diagonal().max())
        if top <= 0:  # b is zero (a zero residual): nothing to fit
            d = torch.zeros_like(d)
            break
        # a relative ridge instead of a rank decision: G is singular when r exceeds d_in, and a rank
        # threshold would make d depend on rounding
        d = torch.linalg.solve(G + 1e-12 * top * torch.eye(r, dtype=G.dtype), rhs)
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
                         f"shared A (scale {cfg.lora_scale(B.shape[1]):g})", _nothing(residual[i, slot], B.shape[1]))
        return
    if cfg.lora_sharing == "shards":
        _fit_shards(model, cfg, residual, sources, prov)
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
                         f"residual on the frozen pair", _nothing(residual[i, slot], (d if part == "d" else b).numel()))


def _fit_shards(model: torch.nn.Module, cfg: ArchConfig, residual: dict[tuple[int, str], Tensor],
                sources: dict[tuple[int, str], list[str]], prov: object) -> None:
    """The shard pools by `fit_shard_pools`, then each layer's private shards from what they left."""
    for slot, us in relaxed_uses(cfg).items():
        layers = [i for i, *_ in us]
        loras = [model.h[i].lora[slot] for i in layers]
        every = [s for i in layers for s in sources[i, slot]]
        if slot in model.lora_shared.pairs:
            pair = model.lora_shared.pairs[slot]
            A, B = fit_shard_pools([residual[i, slot] for i in layers], [lo.scale for lo in loras],
                                   [lo.index_a for lo in loras], [lo.index_b for lo in loras], cfg.lora_shards)
            pair.A.copy_(A)
            pair.B.copy_(B)
            how = f"shard pool of {cfg.lora_shards} fitted to layers {layers}' residuals"
            prov.add(f"lora_shared.pairs.{slot}.A", every, how + ": their top right singular vectors")
            zero = all(_nothing(residual[i, slot], 1) for i in layers)
            prov.add(f"lora_shared.pairs.{slot}.B", every, how + ": least squares given the A pool",
                     f"{cfg.lora_shards} of {cfg.lora_shards} shards with nothing to fit (every reader's residual is "
                     f"zero: B zero, as a fresh LoRA's)" if zero else None)
        for i, lo in zip(layers, loras, strict=True):
            if not lo.private:
                continue
            B_all, A_all = lo.factors()  # the shared shards first, then the (still fresh) private ones
            k = len(lo.index_a)
            shared = (B_all[:, :k] * lo.scale) @ A_all[:k]
            B, A, k = lora_factors(residual[i, slot] - shared, lo.private, lo.scale, lo.A.detach())
            lo.A.copy_(A)
            lo.B.copy_(B)
            fresh = f"{lo.private - k} of {lo.private} components with nothing left to fit (A fresh, B zero)" \
                if k < lo.private else None
            for part in ("A", "B"):
                prov.add(f"h.{i}.lora.{slot}.{part}", sources[i, slot], f"rank-{lo.private} SVD of what layer {i}'s "
                         f"shared shards left of its residual (scale {lo.scale:g})", fresh)


__all__ = ["fit_relaxation", "fit_shard_pools", "fit_shared_a", "fit_vera"]
