"""How much of its budget does each sampled candidate store? (No training: sampling only counts.)

    python benchmarks/budget_fill.py            # 200 asks per space, the three spaces of the defect report
    python benchmarks/budget_fill.py --all      # every shipped space
    python benchmarks/budget_fill.py --quick    # 40 asks per space, a smoke run

A search compares candidates at one budget, so each must hold (nearly) all of it: a candidate storing
a third of the budget is judged with parameters it was never given. For every space, Optuna's
RandomSampler (seed 1 by default) asks `--n` times; for each feasible sample the fill is
stored params / budget. The table gives the feasible count, how many fill under 0.9 and under 0.98,
the 10th percentile and the smallest fill, and how many of those under 0.98 record why their shapes
cannot reach it (`Fit.short`).

Target: every feasible sample fills >= 0.98 of its budget or records why it cannot; exits 1 when a
sample falls short without a reason.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import optuna

from npas import load_space

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ("shapeshifter", "full", "llama")
TARGET = 0.98


def fills(path: Path, n: int, seed: int) -> tuple[list[float], list[tuple[float, str | None, dict]], float]:
    """(fill of every feasible sample, (fill, reason, values) of those under TARGET, seconds sampling)."""
    space = load_space(path)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    out, short, spent = [], [], 0.0
    for _ in range(n):
        trial = study.ask()
        t0 = time.perf_counter()
        cand = space.sample(trial)
        spent += time.perf_counter() - t0
        if not cand.feasible:
            continue
        out.append(cand.fill)
        if cand.fill < TARGET:
            short.append((cand.fill, getattr(cand.fit, "short", None), cand.values))
    return out, short, spent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200, help="asks per space (default 200)")
    ap.add_argument("--seed", type=int, default=1, help="RandomSampler seed (default 1)")
    ap.add_argument("--all", action="store_true", help="every search_spaces/*.yaml, not only the three")
    ap.add_argument("--quick", action="store_true", help="40 asks per space")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each sample under the target")
    args = ap.parse_args(argv)
    if args.quick:
        args.n = 40
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    paths = sorted((ROOT / "search_spaces").glob("*.yaml"))
    if not args.all:
        paths = [p for name in DEFAULT for p in paths if p.stem == name]
    print(f"npas bench: budget fill of random samples ({args.n} asks per space, RandomSampler seed {args.seed})")
    print(f"| space | feasible | fill < 0.9 | fill < {TARGET} | with a reason | p10 fill | smallest fill | ms/sample |")
    print("|---|---|---|---|---|---|---|---|")
    unexplained = 0
    for path in paths:
        got, short, spent = fills(path, args.n, args.seed)
        if not got:
            print(f"| `{path.name}` | 0 | | | | | | |")
            continue
        p10 = statistics.quantiles(got, n=10, method="inclusive")[0] if len(got) > 1 else got[0]
        reasoned = sum(1 for _, why, _ in short if why)
        unexplained += len(short) - reasoned
        print(f"| `{path.name}` | {len(got)} | {sum(f < 0.9 for f in got)} | {len(short)} | {reasoned} | "
              f"{p10:.2f} | {min(got):.2f} | {1e3 * spent / args.n:.2f} |")
        if args.verbose:
            for fill, why, values in sorted(short, key=lambda s: s[0]):
                print(f"    {fill:.3f} {why or '(no reason)'} {values}")
    verdict = "PASS" if unexplained == 0 else "FAIL"
    print(f"result: {unexplained} feasible samples under {TARGET} of the budget without a recorded reason {verdict}")
    return 0 if unexplained == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
