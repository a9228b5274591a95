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


# The files whose content decides a proxy run's loss: the training loop and the allocation it builds.
# Every CPU bench keys its cache on them (the evidence pool adds atoms.py); their order is part of the key.
# config.py's chassis, llama checks and weight slots moved to modules of their own: they follow it.
NUMERICS_FILES = ("npas/training/parameterization.py", "npas/training/proxy.py", "npas/training/data.py",
                  "npas/allocation/transformer.py", "npas/allocation/sharing.py", "npas/allocation/config.py",
                  "npas/allocation/chassis.py", "npas/allocation/llama_chassis.py", "npas/allocation/slots.py")


def code_version(experiment: str, files: Sequence[str], settings: Any, probe: Any) -> str:
    """The one code version of a bench's cache: ``files_version(files, settings)``, kept at its recorded
    value while ``probe()`` (the experiment's numerics, ``bench/numerics.py``) is unchanged."""
    from bench import numerics

    return numerics.keyed(experiment, files_version(files, settings), probe)
