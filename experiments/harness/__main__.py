"""``python -m experiments.harness compact [EXPERIMENT]``: fold legacy one-JSON-per-run files into the
compacted ``runs-<version>.jsonl`` cache (idempotent); ``list``: each experiment's cached runs."""

from __future__ import annotations

import argparse
import sys

from experiments.harness import store


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.harness", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for cmd in ("compact", "list"):
        s = sub.add_parser(cmd)
        s.add_argument("experiment", nargs="?", default=None, help=f"one of {', '.join(store.EXPERIMENTS)} (default all)")
    a = p.parse_args(argv)
    if a.experiment is not None and a.experiment not in store.EXPERIMENTS:
        print(f"error: unknown experiment {a.experiment!r}; choose one of {', '.join(store.EXPERIMENTS)}",
              file=sys.stderr)
        return 2
    for folder in store.folders(a.experiment):
        rel = folder.relative_to(store.ROOT)
        if a.cmd == "compact":
            folded, total = store.compact(folder)
            print(f"{rel}: folded {folded} legacy files; {total} runs compacted")
        else:
            print(f"{rel}: {len(store.names(folder))} runs cached")
    return 0


if __name__ == "__main__":
    sys.exit(main())
