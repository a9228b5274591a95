"""Learned sharing groups (Shapeshifter): which layers should share, read from trained weights.

Layers whose trained weights compute similar maps lose least when tied or pooled together. Raw
weights cannot be compared directly: a layer's MLP units and its heads' inner coordinates can be
permuted (or rotated) without changing what it computes. So each layer is described by products
that do not depend on those choices -- W_q^T W_k (which positions attend to which), W_o W_v (what an
attention read writes back) and W_down W_up (the MLP's linear part), each (d, d) -- and layers are
clustered by the cosine similarity of those descriptions (average linkage). The number of groups is
the caller's knob; groups need not be contiguous.

This is the building block for `tying.mode: learned` / `pools.rule: learned`; the space and the
driver that would feed it a model are not wired yet.
"""

from __future__ import annotations

import torch
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import squareform
from torch import Tensor

from npas.allocation.config import canonical_blocks
from npas.conversion.source import read_source


def _describe(ws: dict[str, Tensor]) -> Tensor:
    mlp_in = ws["mlp_up"] if "mlp_gate" not in ws else ws["mlp_up"] * torch.sigmoid(ws["mlp_gate"])
    parts = [ws["attn_q"].T @ ws["attn_k"], ws["attn_o"] @ ws["attn_v"], ws["mlp_down"] @ mlp_in]
    return torch.cat([(p / p.norm().clamp_min(1e-12)).reshape(-1) for p in parts])


@torch.no_grad()
def layer_similarity(model: torch.nn.Module) -> Tensor:
    """(L, L) cosine similarity of the layers' permutation-invariant descriptions."""
    src = read_source(model)
    f = torch.stack([_describe({s: w.value for s, w in ws.items()}) for ws in src.layers]).double()
    f = f / f.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return f @ f.T


def learned_groups(model: torch.nn.Module, n_groups: int) -> tuple[int, ...]:
    """Layer -> group (numbered in order of first use) with `n_groups` groups of similar layers."""
    sim = layer_similarity(model)
    L = sim.shape[0]
    if not 1 <= n_groups <= L:
        raise ValueError(f"n_groups must be 1..{L}, got {n_groups}")
    if n_groups == L:
        return tuple(range(L))
    dist = (1.0 - sim).clamp_min(0.0).numpy()
    dist = (dist + dist.T) / 2
    dist[range(L), range(L)] = 0.0
    labels = fcluster(linkage(squareform(dist, checks=False), method="average"), n_groups, criterion="maxclust")
    return canonical_blocks([int(x) for x in labels])
