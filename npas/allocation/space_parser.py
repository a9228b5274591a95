"""Reading a search-space YAML file into a validated `Space`: the public entry points.

The checks live in `npas.allocation.space_file` (below `Space`, which re-reads its file against a
starting checkpoint's chassis); this module puts their result into a `Space`.
"""

from __future__ import annotations

from pathlib import Path

from npas.allocation.space import Space
from npas.allocation.space_file import TOP_KEYS as TOP_KEYS  # re-exported: the docs page lists them
from npas.allocation.space_file import read_space
from npas.errors import SpaceError


def load_space(path: str | Path) -> Space:
    """Read and validate a search-space file; every problem is reported at once in a SpaceError."""
    p = Path(path)
    if not p.is_file():
        raise SpaceError(str(p), ["no such file; the shipped spaces are in search_spaces/ (e.g. search_spaces/full.yaml)"])
    return parse_space(p.read_text(encoding="utf-8"), str(p))


def parse_space(text: str, source: str = "<space>") -> Space:
    """A search-space file's text as a `Space`, once every problem in it is ruled out (one SpaceError
    listing them all)."""
    return Space(**read_space(text, source))
