"""Changing one layer's MLP width while keeping what it computes as far as possible.

Narrower (tapers, fitted widths): keep the hidden units with the largest importance, the product of
the norms of the unit's input row(s) and its output column, since a unit's contribution to the
residual stream scales with both; the kept units are ordered most important first, so the layers of
a tied block that read a nested prefix of it read the most important units. Wider: every trained unit
is kept in place and the new units get random input weights (std INIT_STD) and **zero** output
(down-projection) columns: they start silent, so the converted model computes exactly what the narrower
one did, and gradients still reach them through their non-zero inputs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from npas.allocation.sharing import INIT_STD


def unit_importance(ws: dict[str, Tensor]) -> Tensor:
    """(units,): ||input rows|| * ||output column|| per hidden unit (gated MLPs: up and gate rows)."""
    rows = ws["mlp_up"].pow(2).sum(1)
    if "mlp_gate" in ws:
        rows = rows + ws["mlp_gate"].pow(2).sum(1)
    return rows.sqrt() * ws["mlp_down"].norm(dim=0)


def resize_mlp(ws: dict[str, Tensor], width: int, gen: torch.Generator) -> tuple[dict[str, Tensor], str | None]:
    """The MLP slots of `ws` at `width` units, and a note on fresh elements (None when none)."""
    n = ws["mlp_down"].shape[1]
    out = dict(ws)
    if width == n:
        return out, None
    if width < n:
        idx = unit_importance(ws).topk(width).indices  # descending importance
        for slot in ("mlp_up", "mlp_gate"):
            if slot in ws:
                out[slot] = ws[slot][idx]
        out["mlp_down"] = ws["mlp_down"][:, idx]
        return out, None
    extra = width - n
    d = ws["mlp_down"].shape[0]
    for slot in ("mlp_up", "mlp_gate"):
        if slot in ws:
            fresh = torch.randn(extra, ws[slot].shape[1], generator=gen) * INIT_STD
            out[slot] = torch.cat([ws[slot], fresh])
    out["mlp_down"] = torch.cat([ws["mlp_down"], torch.zeros(d, extra)], dim=1)
    return out, f"{extra} new MLP units (random inputs, zero outputs: silent at start)"
