"""Where every tensor of a converted model came from: derived from named source tensors, or fresh.

A converted model is only as trustworthy as its weakest tensor: one left at its random init by an
oversight silently turns "start from the trained model" into "start from noise" for that part. So the
converter records, for every state-dict entry it writes, the source tensors it was computed from and
how, plus an explicit note whenever some of its elements are fresh on purpose (new MLP units of a
wider layer, LoRA components with nothing left to fit). `missing` lists entries with no record.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Provenance:
    """One tensor's origin: `sources` (source state-dict names), `method`, and what is fresh (if any)."""

    sources: tuple[str, ...]
    method: str
    fresh: str | None = None  # which elements are initialised fresh, and why; None: all derived

    @property
    def kind(self) -> str:
        if not self.sources:
            return "fresh"
        return "derived" if self.fresh is None else "partly fresh"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "sources": list(self.sources), "method": self.method, "fresh": self.fresh}

    def line(self, name: str) -> str:
        srcs = _compact(self.sources)
        tail = f"; fresh: {self.fresh}" if self.fresh else ""
        return f"{name:<28} {self.kind:<12} {self.method} <- {srcs}{tail}"


def _compact(sources: tuple[str, ...], limit: int = 4) -> str:
    if not sources:
        return "(nothing)"
    if len(sources) <= limit:
        return ", ".join(sources)
    return ", ".join(sources[:limit]) + f", ... ({len(sources)} tensors)"


class ProvenanceRecord:
    """Name -> Provenance for one conversion, in the order tensors were written."""

    def __init__(self) -> None:
        self.entries: dict[str, Provenance] = {}

    def add(self, name: str, sources: Iterable[str], method: str, fresh: str | None = None) -> None:
        self.entries[name] = Provenance(tuple(dict.fromkeys(sources)), method, fresh)

    def missing(self, names: Iterable[str]) -> list[str]:
        """State-dict entries the converter wrote no record for (must be empty)."""
        return [n for n in names if n not in self.entries]

    def to_dict(self) -> dict[str, dict]:
        return {name: p.to_dict() for name, p in self.entries.items()}

    def lines(self) -> list[str]:
        return [p.line(name) for name, p in self.entries.items()]

    def counts(self) -> dict[str, int]:
        out = {"derived": 0, "partly fresh": 0, "fresh": 0}
        for p in self.entries.values():
            out[p.kind] += 1
        return out
