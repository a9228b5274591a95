"""The run cache every training bench shares: one record per finished run, found by its file name.

A bench names each run by a key that ends in its code version (``<...>-<version>.json``, the name the
legacy layout gave its one-JSON-per-run file). Records live in one of two places, and readers accept
both, so a bench, a lent GPU machine (``experiments/device.py collect``) or an older checkout can keep
writing the legacy files while the committed cache is compacted:

- compacted: ``<folder>/runs-<version>.jsonl``, one line ``{"key": ..., "record": ...}`` per run, one
  file per experiment folder and code version; ``save`` appends to it (the benches' CPU runs);
- legacy: ``<folder>/<key>.json``, one file per run: what a lent GPU machine's records unpack to
  (``experiments/device.py collect``, which then compacts) and what a checkout from before the harness writes.

``compact(folder)`` folds the legacy files into the compacted files and deletes them; it is
idempotent (a key already compacted is overwritten by its legacy file, the newer write). Records
come back exactly as ``json.loads`` of the legacy file gave them, so reports print the same.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
# A run key's last dash-separated field: the code version (10 hex digits; a WSD run adds a second one).
_VERSION = re.compile(r"-([0-9a-f]{10})\.json$")
_COMPACT = re.compile(r"^runs-([0-9a-f]{10})\.jsonl$")
_loaded: dict[Path, tuple[tuple[float, int], dict[str, Any]]] = {}

# The experiments' cache folders (relative to the checkout), for `python -m experiments.harness compact`.
EXPERIMENTS: dict[str, tuple[str, ...]] = {
    "proxy_fidelity": ("experiments/results/proxy_fidelity", "experiments/results/proxy_fidelity_h200"),
    "lr_transfer": ("experiments/results/lr_transfer", "experiments/results/lr_transfer_h200"),
    "recipe_lr": ("experiments/results/recipe_lr",),
    "evidence": ("experiments/evidence/results/runs",),
    "taper_scale": ("experiments/evidence/results/taper_scale_runs",),
}


def version_of(name: str) -> str | None:
    """The code version a run's key ends in (None: not a run record, e.g. a report's JSON)."""
    m = _VERSION.search(name)
    return m.group(1) if m else None


def _compacted(folder: Path) -> dict[str, Any]:
    """Every compacted record of ``folder`` by key (file name), re-read only when a file changed."""
    files = sorted(p for p in folder.glob("runs-*.jsonl") if _COMPACT.match(p.name)) if folder.is_dir() else []
    stamp = (sum(p.stat().st_mtime for p in files), sum(p.stat().st_size for p in files) + len(files))
    hit = _loaded.get(folder)
    if hit and hit[0] == stamp:
        return hit[1]
    records: dict[str, Any] = {}
    for p in files:
        lines = p.read_text().splitlines()
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                if i == len(lines) - 1 or not line.endswith("}"):  # a write cut short by a kill: it trains again
                    continue
                raise
            records[row["key"]] = row["record"]  # appended later, so a rerun's record wins
    _loaded[folder] = (stamp, records)
    return records


def exists(path: Path) -> bool:
    """Whether the run whose legacy file is ``path`` is cached, in either layout."""
    return path.exists() or path.name in _compacted(path.parent)


def load(path: Path) -> Any:
    """The record of the run whose legacy file is ``path`` (the legacy file wins: it is the newer write)."""
    if path.exists():
        return json.loads(path.read_text())
    try:
        return _compacted(path.parent)[path.name]
    except KeyError:
        raise FileNotFoundError(path) from None


def save(path: Path, doc: Any) -> None:
    """Cache one finished run whose legacy file would be ``path``: one line appended to its folder's
    ``runs-<version>.jsonl`` (a single write, so a kill loses at most that line; ``compact`` re-sorts).
    A name without a code version is not a run and is written as its own JSON file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    version = version_of(path.name)
    if version is None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
        tmp.replace(path)
        return
    line = json.dumps({"key": path.name, "record": doc}, default=str) + "\n"
    dest = path.parent / f"runs-{version}.jsonl"
    with open(dest, "ab+") as f:
        torn = f.tell() > 0 and (f.seek(-1, os.SEEK_END), f.read(1))[1] != b"\n"  # a write cut short by a kill
        f.write((b"\n" if torn else b"") + line.encode())
    path.unlink(missing_ok=True)  # an older legacy record would shadow this one


def names(folder: Path) -> list[str]:
    """The keys (legacy file names) of every cached run in ``folder``, in either layout (every legacy
    ``*.json`` counts, as the one-file-per-run layout counted it)."""
    legacy = {p.name for p in folder.glob("*.json")} if folder.is_dir() else set()
    return sorted(legacy | set(_compacted(folder)))


def compact(folder: Path) -> tuple[int, int]:
    """Fold ``folder``'s legacy run files into its ``runs-<version>.jsonl`` files and delete them.

    Idempotent, and safe beside a writer: a legacy file is deleted only after the compacted file
    holding it was atomically replaced. Returns (records folded now, records compacted in all)."""
    legacy = sorted(p for p in folder.glob("*.json") if version_of(p.name)) if folder.is_dir() else []
    by_version: dict[str, dict[str, Any]] = {}
    for name, rec in _compacted(folder).items():
        by_version.setdefault(version_of(name) or "", {})[name] = rec
    for p in legacy:
        by_version.setdefault(version_of(p.name) or "", {})[p.name] = json.loads(p.read_text())
    touched = {version_of(p.name) for p in legacy}
    for version in sorted(v for v in touched if v):
        dest = folder / f"runs-{version}.jsonl"
        tmp = dest.with_suffix(".jsonl.tmp")
        rows = by_version[version]
        tmp.write_text("".join(json.dumps({"key": k, "record": rows[k]}, default=str) + "\n" for k in sorted(rows)))
        os.replace(tmp, dest)
    for p in legacy:
        p.unlink()
    _loaded.pop(folder, None)
    return len(legacy), sum(len(r) for r in by_version.values())


def folders(experiment: str | None = None) -> list[Path]:
    """The cache folders of one experiment (or of all), absolute."""
    if experiment is not None and experiment not in EXPERIMENTS:
        raise KeyError(experiment)
    chosen = [experiment] if experiment else list(EXPERIMENTS)
    return [ROOT / rel for e in chosen for rel in EXPERIMENTS[e]]


def forget(path: Path) -> None:
    """Drop the run whose legacy file is ``path`` from the cache, in both layouts (it will train again)."""
    path.unlink(missing_ok=True)
    version = version_of(path.name)
    dest = path.parent / f"runs-{version}.jsonl"
    rows = _compacted(path.parent)
    if version and dest.exists() and path.name in rows:
        kept = [line for line in dest.read_text().splitlines() if line.strip() and json.loads(line)["key"] != path.name]
        tmp = dest.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, dest)
        _loaded.pop(path.parent, None)
