"""The command line every cached training bench shares (``--quick``, ``--plan``, ``--report``,
``--workers``, ``--code-version``, ``--out``); each bench adds its own options."""

from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def bench_parser(description: str, quick_help: str, results: Path) -> argparse.ArgumentParser:
    """The options every cached training bench (lr_transfer, proxy_fidelity) shares; the bench adds its
    own. ``--code-version`` reports the cache of an earlier code version (device runs outlive the code
    they ran: any later edit of a versioned file moves the current version)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help=quick_help)
    p.add_argument("--plan", action="store_true", help="print runs x tokens -> CPU-hours and exit")
    p.add_argument("--report", action="store_true", help="print the table from cached runs only")
    p.add_argument("--workers", type=int, default=2, help="training processes (1 thread each)")
    p.add_argument("--code-version", default=None,
                   help="with --report: the cached runs of this code version (a run's version is in its file name)")
    p.add_argument("--out", type=Path, default=None, help=f"cache folder (default {results.relative_to(ROOT)})")
    return p


def version_to_read(p: argparse.ArgumentParser, a: argparse.Namespace, current: str) -> str:
    """The version whose cache this invocation reads: ``--code-version`` when given (report only),
    else the current code's."""
    if not a.code_version or a.code_version == current:
        return current
    if not a.report:
        p.error("--code-version only reads a cache: add --report (runs always train at the current code)")
    print(f"reporting runs of code version {a.code_version} (the code now is {current})", flush=True)
    return a.code_version
