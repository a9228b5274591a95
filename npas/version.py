"""npas's version, in a module of its own so that any module can stamp it on what it writes (metrics,
conversion records, study records, reports) without importing the package root, which imports the
public API above every layer. pyproject.toml's `version` is the same string."""

from __future__ import annotations

__version__ = "0.1.0"
