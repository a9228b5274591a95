"""Match the hidden units of layers that will share one MLP before averaging them.

An MLP's hidden units can be permuted (rows of up/gate with the same columns of down) without
changing what the layer computes, so unit 7 of layer 0 and unit 7 of layer 2 have nothing in common
after training: averaging them unmatched (as plain RRT initialisation does) blurs two unrelated
units into one. Each member's units are instead permuted to best match the first member's (a linear
assignment on the cosine similarity of each unit's concatenated input rows and output column, as in
weight-matching model merging), so the average combines units that compute similar features and the
LoRA deltas have less left to repair. Members of different widths read nested prefixes of the block
(ordered by importance), so those blocks are left as they are.
"""

from __future__ import annotations

import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor

MLP_IN = ("mlp_up", "mlp_gate")


def unit_features(ws: dict[str, Tensor]) -> Tensor:
    """(units, features): each unit's input rows and output column, unit-normalised."""
    parts = [ws[s] for s in MLP_IN if s in ws] + [ws["mlp_down"].T]
    f = torch.cat(parts, dim=1)
    return f / f.norm(dim=1, keepdim=True).clamp_min(1e-12)


def match_units(reference: dict[str, Tensor], other: dict[str, Tensor]) -> Tensor:
    """perm such that other's unit perm[k] is matched to reference's unit k (maximum total similarity)."""
    sim = unit_features(reference) @ unit_features(other).T  # (units, units)
    rows, cols = linear_sum_assignment(sim.double().numpy(), maximize=True)
    perm = torch.empty(len(rows), dtype=torch.long)
    perm[torch.as_tensor(rows)] = torch.as_tensor(cols)
    return perm


def permute_units(ws: dict[str, Tensor], perm: Tensor) -> dict[str, Tensor]:
    out = dict(ws)
    for s in MLP_IN:
        if s in ws:
            out[s] = ws[s][perm]
    out["mlp_down"] = ws["mlp_down"][:, perm]
    return out
