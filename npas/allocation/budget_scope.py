"""What a budget means: the text a user writes (`1.5M`, `0.25x`), and which parameters it caps.

Its own module because a budget is read and checked before any allocation exists (a space file, the
CLI's `--budget` and `--budget-scope`, the knob table's allowed scopes), from the chassis alone, while
`npas.allocation.budget` counts allocations: reading a budget needs no count, and the counts need
only `embedding_params` from here, what the `non_embedding` scope leaves out.
"""

from __future__ import annotations

import math
import re

from npas.allocation.chassis import Chassis
from npas.errors import BudgetError

_BUDGET_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmgb]?|x)\s*$", re.IGNORECASE)
MAX_BUDGET = 10**15  # a cap no allocation npas builds comes near; above it a budget is a typo (1e400 is inf)
_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "b": 10**9}

BUDGET_SCOPES = ("all", "non_embedding")


def parse_budget(spec: str | int | float, reference_params: int) -> int:
    """`1.5M`, `250k`, `120000` (absolute) or `0.25x`, `2x` (relative to the reference) -> params."""
    if isinstance(spec, bool):
        raise BudgetError(f"budget {spec!r} is not a number; write e.g. 1.5M, 250k or 0.25x")
    if isinstance(spec, int | float):
        text = str(spec)
    else:
        text = str(spec)
    m = _BUDGET_RE.match(text)
    if not m:
        raise BudgetError(f"budget {spec!r} does not parse; write an absolute count (1.5M, 250k) or a ratio (0.25x)")
    value, unit = float(m.group(1)), m.group(2).lower()
    params = value * reference_params if unit == "x" else value * _SUFFIX[unit]
    if not math.isfinite(params) or params > MAX_BUDGET:
        raise BudgetError(f"budget {spec!r} is more than {MAX_BUDGET:.0e} parameters; write a realistic budget "
                          f"such as 1.5M or 2x")
    if params < 1:
        raise BudgetError(f"budget {spec!r} is {params:.3g} parameters; it must be at least 1")
    return int(params)


def embedding_params(chassis) -> int:
    """What ``non_embedding`` leaves out: token and position embeddings, ``(vocab + context) * d_model``,
    on a classic chassis; on a llama chassis (rotary positions, no table) the token embedding and, when
    the head is untied, the output head (``vocab * d_model`` each)."""
    if getattr(chassis, "family", "classic") == "llama":
        return chassis.vocab_size * chassis.d_model * (1 if chassis.tie_embeddings else 2)
    return (chassis.vocab_size + chassis.context) * chassis.d_model


def below_embeddings(ch: Chassis, spec: str, cap: int) -> str | None:
    """Why a budget cannot fit anything, or None: embeddings are never shared or narrowed below
    d_model, so a cap at or under them leaves every candidate infeasible."""
    floor = embedding_params(ch) + ch.d_model
    if cap > floor:
        return None
    return (f"budget {spec} is {cap:,} params, not more than the {floor:,} the embeddings alone need at "
            f"d_model={ch.d_model} and vocab_size={ch.vocab_size}; raise the budget, lower d_model, or cap only "
            f"the non-embedding parameters with `budget_scope: non_embedding` (--budget-scope non_embedding)")
