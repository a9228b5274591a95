"""Run every evidence experiment in order, cheapest first, and print each one's wall time.

    python experiments/evidence/run_all.py --quick     # every smoke run (~20 minutes on a busy 2-core box)
    python experiments/evidence/run_all.py             # the report (docs/RESULTS.md); run under `nice -n 10`
    python experiments/evidence/run_all.py --only taper relaxed

Each experiment runs as its own process (`python experiments/evidence/<name>.py [--quick]`), so one
failing does not stop the others; the exit status is 1 if any failed. (The second edition's
search_vs_hand searches with its own quarter-length proxy, so early_stop no longer reuses its study.)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ORDER = ("taper", "high_budget", "low_budget", "relaxed", "atoms", "conversion", "search_vs_hand", "early_stop",
         "expert_pool", "hashed", "lora_sharing", "recursion")


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


if __name__ == "__main__":
    sys.exit(main())
