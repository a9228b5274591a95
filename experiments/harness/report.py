"""What the benches print the same way, so an experiment's script keeps only its own report:

- ``format_table``: a table of left-aligned cells under a dashed rule (the evidence scripts' tables);
- ``Columns``: fixed-width columns from format specs (a header and rows that line up with it);
- ``cost_table``: a plan's per-group cost table (runs x tokens -> CPU-hours, what is cached), over a
  bench's ``Runs``; the bench names the groups and what each row shows.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

_ALIGN_WIDTH = re.compile(r"^[<>^]?\d*")


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Cells left-aligned to each column's widest, a dashed rule under the header, trailing blanks cut."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


@dataclass(frozen=True)
class Columns:
    """Fixed-width columns, each ``(header, format spec)`` such as ``("runs", ">6")`` or
    ``("est CPU-h", ">11.2f")``: a header takes its spec's alignment and width (not its number format),
    so one declaration keeps a plan's header and rows in line."""

    specs: tuple[tuple[str, str], ...]

    def header(self) -> str:
        return "".join(format(h, _ALIGN_WIDTH.match(s).group(0)) for h, s in self.specs)

    def row(self, *cells: Any) -> str:
        return "".join(format(c, s) for c, (_, s) in zip(cells, self.specs, strict=True))


def cost_table(runs: Any, groups: Sequence[tuple[Any, Sequence[Any]]], columns: Columns,
               cells: Callable[[Any, Any], Sequence[Any]], tokens: Callable[[Any], int],
               flops: Callable[[Any], int], rate: float) -> tuple[float, float]:
    """Print a plan's cost table: ``columns``' header, then one row per ``(label, jobs)`` group,
    ``cells(label, cost)`` of its ``runs.cost`` (``experiments/harness/jobs.py``: runs, cached, tokens,
    CPU-seconds at ``rate`` training FLOP/s). Returns (CPU-seconds of every job, of the missing ones)."""
    print(columns.header())
    total = left = 0.0
    for label, jobs in groups:
        cost = runs.cost(jobs, tokens, flops, rate)
        total, left = total + cost.secs, left + cost.left
        print(columns.row(*cells(label, cost)))
    return total, left
