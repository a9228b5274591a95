"""Sizes for people: `97.7 MB`, `1.23M` params. Tables use these; csv and json keep raw numbers."""

from __future__ import annotations

import math

import pandas as pd

_SCALES = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def human_count(n: float) -> str:
    """`1,234,567` -> `1.23M`: three significant digits, decimal prefixes (as parameter counts are quoted)."""
    if not math.isfinite(n):
        return str(n)
    for scale, prefix in _SCALES:
        if abs(n) >= scale:
            return f"{n / scale:.3g}{prefix}"
    return f"{n:.4g}"


def human_bytes(n: float) -> str:
    """`97,656,250` -> `97.7 MB` (decimal units, like `human_count`)."""
    if not math.isfinite(n):
        return str(n)
    for scale, prefix in _SCALES:
        if abs(n) >= scale:
            return f"{n / scale:.3g} {prefix}B"
    return f"{n:.0f} B"


def humanize(df: pd.DataFrame) -> pd.DataFrame:
    """A copy of a front table for printing: byte columns in B/kB/MB/GB, counts with k/M/G,
    losses to four decimals; column names say the unit."""
    out = df.copy()
    renames = {}
    for col in out.columns:
        if col.endswith("_bytes"):
            out[col] = out[col].map(human_bytes)
        elif col == "stored_params":
            out[col] = out[col].map(human_count)
            renames[col] = "params"
        elif col == "flops_per_token":
            out[col] = out[col].map(human_count)
            renames[col] = "FLOPs/token"
        elif pd.api.types.is_float_dtype(out[col]):
            out[col] = out[col].map(lambda v: f"{v:.4f}")
    return out.rename(columns=renames)
