"""Run every evidence experiment in order, cheapest first, and print each one's wall time.

    python bench/evidence/run_all.py --quick     # all six smoke runs (~10 minutes on a busy 2-core box)
    python bench/evidence/run_all.py             # the report (docs/RESULTS.md); run under `nice -n 10`
    python bench/evidence/run_all.py --only taper relaxed

Each experiment runs as its own process (`python bench/evidence/<name>.py [--quick]`), so one
failing does not stop the others; the exit status is 1 if any failed. Experiment 6 reuses the ASHA
study of experiment 5 (`--reuse-asha`) when experiment 5 ran in the same call and succeeded.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ORDER = ("taper", "high_budget", "low_budget", "relaxed", "search_vs_hand", "early_stop", "expert_pool")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", nargs="+", choices=ORDER, default=None)
    p.add_argument("--seeds", type=int, default=None)
    args = p.parse_args()
    root = HERE.parents[1]
    walls, failed = {}, []
    for name in args.only or ORDER:
        cmd = [sys.executable, str(HERE / f"{name}.py")]
        if args.quick:
            cmd.append("--quick")
        if args.seeds:
            cmd += ["--seeds", str(args.seeds)]
        if name == "early_stop" and "search_vs_hand" in walls and "search_vs_hand" not in failed:
            js = _json_of("search_vs_hand", args.quick)
            if js.exists():
                cmd += ["--reuse-asha", str(js)]
        print(f"\n### {name}: {' '.join(cmd)}", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call(cmd, cwd=root)
        walls[name] = time.perf_counter() - t0
        if rc:
            failed.append(name)
    print("\nwall times:")
    for name, w in walls.items():
        print(f"  {name:15s} {w:7.1f} s{'  FAILED' if name in failed else ''}")
    print(f"  {'total':15s} {sum(walls.values()):7.1f} s")
    return 1 if failed else 0


def _json_of(name: str, quick: bool) -> Path:
    """Where an experiment writes its JSON by default (see common.setup_from / common.save_json)."""
    if quick:
        return Path(tempfile.gettempdir()) / "npas-evidence-quick" / f"{name}_quick.json"
    return HERE / "results" / f"{name}.json"


if __name__ == "__main__":
    sys.exit(main())
