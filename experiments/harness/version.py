"""A cache's code version: the training numerics' declared version and the settings every run of the
experiment shares, never the bytes of the code that trained them.

``npas.NUMERICS_VERSION`` (``npas/conversion/numerics.py``) names what a training computes; its golden
runs define it and a fast test (tests/training/test_numerics_golden.py) fails when a change moves them.
So a refactor keeps every cache, and a change of the numerics bumps the constant and starts fresh
caches everywhere.

Numerics version 1 is the numerics the caches were made with while they were keyed on source bytes:
``PINNED[1]`` keeps, per experiment and settings, the version its cache was found under then (10 hex
digits, what a run's key ends in), so every cache found before is found after. Any other version, or a
setting no cache was made with, derives its version from (experiment, numerics version, settings).

Every cached record is stamped (``stamp``) with the commit that trained it, the numerics version and its
full recipe and allocation, so a result says what made it (PEFT's ``method_comparison`` results carry
version and commit the same way); records from before the stamp still read.
"""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from npas.conversion.numerics import NUMERICS_VERSION

ROOT = Path(__file__).resolve().parents[2]

# {numerics version: {experiment: {settings digest: version}}}: the versions the caches made before the
# numerics were declared are found under (each is what that experiment's code computed for its settings
# at 2072c52, from the hash of the files deciding a loss and a 2-step numerics probe; tests/experiments/
# test_code_version.py checks each experiment's settings still reach theirs).
PINNED: dict[int, dict[str, dict[str, str]]] = {1: {
    "proxy_fidelity": {"b158c9e78054": "5e8cca1e3a"},  # the frozen proxy recipe
    "proxy_fidelity/wsd": {"a5ac5ce5942d": "365e7629d2"},  # its WSD recipe to T = 1,600 (a WSD run's second version)
    "lr_transfer": {"1ec0d92b56c5": "2dfa8bcf28"},  # the 400-step recipe and the d_model 64 reference
    "recipe_lr": {"d9fde33c8ce1": "fd383b6bfd",  # --recipe smoke (its rate left out)
                  "0bf8ab525e36": "fb138ddc96"},  # --recipe smoke-wsd
    "convert_hf": {"0b0c9f3eac83": "50d4cdc11e"},  # the full mode (llama d_model 64 x 8, cycle + LoRA 8 at 0.5x)
    # the evidence pool: its scripts whose 2-step probe still matched (settings: none)
    **{f"evidence/{name}": {"74234e98afe7": "c8bd6d7bad"}
       for name in ("taper", "high_budget", "low_budget", "relaxed", "atoms", "conversion")},
}}

# Recipe fields written as they are; a field added later is written only where it differs from its
# default, so adding an option (at a default that changes nothing) keeps every experiment's settings.
RECIPE_FIELDS = ("name", "seq_len", "batch_size", "steps", "lr", "min_lr", "weight_decay", "warmup_steps", "betas",
                 "grad_clip", "eval_every", "eval_batches", "seed", "dtype", "threads", "val_fraction",
                 "test_fraction", "parameterization", "data", "version")


def recipe_settings(recipe: Any, leave_out: tuple[str, ...] = ()) -> dict[str, Any]:
    """A recipe as settings: ``RECIPE_FIELDS`` as they are, later fields where not at their default,
    tuples as lists, ``leave_out`` dropped. Independent of ``Recipe.to_dict``'s form, so a change there
    keeps every key."""
    out: dict[str, Any] = {}
    for f in fields(recipe):
        v = getattr(recipe, f.name)
        if f.name in leave_out or (f.name not in RECIPE_FIELDS and v == f.default):
            continue
        out[f.name] = list(v) if isinstance(v, tuple) else v
    return out


def settings_digest(settings: Any) -> str:
    """12 hex digits of the settings' JSON (sorted keys): what ``PINNED`` is looked up by."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]


def code_version(experiment: str, settings: Any = None, numerics: int | None = None, cache: str | None = None) -> str:
    """The version an experiment's runs are keyed by (10 hex digits): the pinned one for these numerics
    (default ``NUMERICS_VERSION``) and settings, else the hash of (``cache`` or ``experiment``,
    ``numerics``, ``settings``). Experiments that share a cache and key each run by what it trains (the
    evidence pool) pass one ``cache`` name, so a run two of them train is trained once."""
    numerics = NUMERICS_VERSION if numerics is None else numerics
    pinned = PINNED.get(numerics, {}).get(experiment, {}).get(settings_digest(settings))
    if pinned is not None:
        return pinned
    doc = {"cache": cache or experiment, "numerics": numerics, "settings": settings}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:10]


@functools.cache
def commit() -> str:
    """This checkout's commit (``git rev-parse HEAD``), or "unknown" outside a git checkout (a lent GPU
    machine gets a copy of the tree without its history)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def stamp(recipe: Any, allocation: Any, made_at: str | None = None) -> dict[str, Any]:
    """What a cached record says about what made it: the commit (``made_at``: the one a lent GPU machine's
    spec was exported at, its copy of the tree having no history; else this checkout's), the numerics
    version, and the full recipe (every field, defaults included) and allocation."""
    alloc = allocation.to_dict() if hasattr(allocation, "to_dict") else allocation
    full = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(recipe).items()}
    return {"commit": made_at or commit(), "numerics_version": NUMERICS_VERSION, "recipe": full, "allocation": alloc}
