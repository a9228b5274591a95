"""Match the hidden units of layers that will share one MLP before averaging them.

An MLP's hidden units can be permuted (rows of up/gate with the same columns of down) without
changing what the layer computes, so unit 7 of layer 0 and unit 7 of layer 2 have nothing in common
after training: averaging them unmatched (as plain RRT initialisation does) blurs two unrelated
units into one. Each member's units are instead permuted to best match the first member's (a linear
assignment on the cosine similarity of each unit's concatenated input rows and output column, as in
weight-matching model merging), so the average combines units that compute similar features and the
LoRA deltas have less left to repair. Members of different widths read nested prefixes of the block
(ordered by importance), so those blocks are left as they are.

New units of a widened layer (random inputs, see `widths`) carry no trained feature: matching on
them would make the permutation, and everything averaged or fitted after it, depend on the seed
that drew them. So a new unit's similarity is a constant: 0 to another new unit and -2 (below any
cosine) to a trained one, which matches trained units among themselves exactly as without new units
and keeps the new ones together, at the tail.
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


NEW_TO_TRAINED = -2.0  # similarity of a new (random) unit to a trained one: below any cosine


def match_units(reference: dict[str, Tensor], other: dict[str, Tensor], reference_new: Tensor | None = None,
                other_new: Tensor | None = None) -> Tensor:
    """perm such that other's unit perm[k] is matched to reference's unit k (maximum total similarity).
    ``*_new``: (units,) True for a layer's new units, whose similarities are constants (module doc)."""
    sim = unit_features(reference) @ unit_features(other).T  # (units, units)
    if reference_new is not None and other_new is not None and bool(reference_new.any() or other_new.any()):
        a, b = reference_new[:, None], other_new[None, :]
        sim = torch.where(a & b, 0.0, torch.where(a | b, NEW_TO_TRAINED, sim))
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
