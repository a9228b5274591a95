"""A cache's code version: the hash of the files that decide a run's numbers and of the settings
every run shares. Every bench keys its runs with it (through ``bench/numerics.py``, which keeps a
recorded version while the numerics it probes are unchanged), so this is the one definition."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def files_version(files: Sequence[str], settings: Any = None) -> str:
    """The hash of ``files`` (paths relative to the checkout, and content) and of ``settings``, so an
    edit to either starts a fresh cache. Unchanged from ``bench/device.py``'s: today's keys hold."""
    h = hashlib.sha256()
    for rel in files:
        h.update(rel.encode() + b"\0" + (ROOT / rel).read_bytes())
    if settings is not None:
        h.update(json.dumps(settings, sort_keys=True).encode())
    return h.hexdigest()[:10]
