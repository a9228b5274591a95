"""Learned sharing groups (Shapeshifter): which layers should share, read from trained weights.

Layers whose trained weights compute similar maps lose least when tied or pooled together. Raw
weights cannot be compared directly: a layer's MLP units and its heads' inner coordinates can be
permuted (or rotated) without changing what it computes. So each layer is described by products
that do not depend on those choices -- W_q^T W_k (which positions attend to which), W_o W_v (what an
attention read writes back) and W_down W_up (the MLP's linear part), each (d, d) -- and layers are
clustered by the cosine similarity of those descriptions (average linkage). The number of groups is
the caller's knob; groups need not be contiguous.

`tying.mode: learned` and `pools.rule: learned` cluster with this similarity: `npas search` computes
it once per study (`similarity_of` on the --init-from model, or on the reference it pretrains once,
see `npas.service.search.learned`), stores the matrix in the study record, and the space carries it
(`Space.with_similarity`) so a candidate stays a pure function of the space and its knob values. The
clustering itself (`npas.allocation.layer_maps.groups_from_similarity`) needs no torch.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from npas.allocation.layer_maps import Similarity, groups_from_similarity
from npas.conversion.source import read_source
from npas.training.train import load_trained


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
    return groups_from_similarity(layer_similarity(model).tolist(), n_groups)


def similarity_of(directory: str | Path) -> Similarity:
    """The layer similarity of a `npas train` directory, as the plain floats a study records."""
    return tuple(tuple(float(x) for x in row) for row in layer_similarity(load_trained(directory)[0]).tolist())
