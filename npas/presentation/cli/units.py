"""Sizes for people: `97.7 MB`, `1.23M` params. Tables use these; csv and json keep raw numbers."""

from __future__ import annotations

import math

import pandas as pd

_SCALES = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def _scaled(n: float, unit: str, small: str) -> str:
    """`n` with the largest decimal prefix it reaches, to three significant digits; below 1000 `small`
    formats it. One loop for counts and bytes, so both always use the same prefixes and rounding."""
    if not math.isfinite(n):
        return str(n)
    sep = " " if unit else ""  # `97.7 MB` but `1.23M`
    for scale, prefix in _SCALES:
        if abs(n) >= scale:
            return f"{n / scale:.3g}{sep}{prefix}{unit}"
    return f"{n:{small}}{sep}{unit}"


def human_count(n: float) -> str:
    """`1,234,567` -> `1.23M`: three significant digits, decimal prefixes (as parameter counts are quoted)."""
    return _scaled(n, "", ".4g")


def human_bytes(n: float) -> str:
    """`97,656,250` -> `97.7 MB` (decimal units, like `human_count`)."""
    return _scaled(n, "B", ".0f")


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
