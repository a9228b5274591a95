"""`InitSource`: the trained model a study's trials start from (`npas search --init-from`), as one value.

Kept apart from `npas.conversion.init_from` (which reads and converts the model, importing torch) so
that a study's record, the plan and the light CLI paths can hold it without those imports.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

_KEYS = ("dir", "weights", "config_hash")  # as a study stores it under `init_from`


@dataclass(frozen=True)
class InitSource(Mapping[str, str]):
    """The trained model a study's trials start from, one value from `plan_search` to every worker:
    its directory, the fingerprint of its weights (a node holding other weights is refused) and its
    allocation's hash. A study stores it under `init_from` as the plain mapping it reads as (the keys
    `dir`, `weights`, `config_hash`), so a record written before this class reads back unchanged."""

    dir: str
    weights: str
    config_hash: str

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> InitSource:
        return cls(dir=str(d["dir"]), weights=str(d["weights"]), config_hash=str(d.get("config_hash", "")))

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    def moved_to(self, directory: str) -> InitSource:
        """The same weights read from another directory (a resume that names where they are now)."""
        return InitSource(str(directory), self.weights, self.config_hash)

    def __getitem__(self, key: str) -> str:
        if key not in _KEYS:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(_KEYS)

    def __len__(self) -> int:
        return len(_KEYS)


def as_init_source(value: Mapping[str, Any] | None) -> InitSource | None:
    """A stored or given `init_from` mapping as an `InitSource` (None stays None)."""
    return value if value is None or isinstance(value, InitSource) else InitSource.from_dict(value)
