"""Located learning rates (issue #35): does the rung-1 choice hold at T, and what does it buy the ladder?

A search under the ladder picks each candidate's rate at the first rung (``npas.training.located_rate``:
factors x0.5, x1, x2, x4 of its fair rate, each trained to rung 1 and scored by its cooldown fork; an
edge optimum extends the grid one x2 step, at most twice). This bench asks two things of that rule on
the frozen fidelity candidates of ``bench/proxy_fidelity.py`` (equal stored params, its WSD recipe
to T = 1,600 steps, rungs T/16, T/4, T):

1. **hold** (item 3): on the first ``N_HOLD`` candidates (its 3 baselines first), train the located
   factor f and one x2 step each side (f/2, 2f) to T on a fresh seed (``HOLD_SEED``), test split.
   Target: f is the best of the three at T for >= 6 of 8, and within one step for all 8 (a best at
   f/2 or 2f is within one step of f, but it leaves the optimum at T unbounded on that side: said so).
2. **ladder with located rates** (item 4): every candidate's grid (seed 0, the proxy's seed, as a
   search trains it), then its WSD run to T at the located factor (seed 0; at factor 1 it is the
   proxy-fidelity bench's own cached WSD run, read from that cache, not retrained), replayed through
   the ladder's rule (``bench/proxy_fidelity_ladder.py``) with rung 1 = the grid's best, and its
   grid steps added to the ladder's compute. Against truth at the fair rate (the long cosine runs'
   mean test loss, ``proxy_fidelity``); Delta tau (located - fair-rate ladder), paired bootstrap.

A grid run is a WSD run of length T/16 (``Recipe.with_steps``): bit for bit the fork at T/16 of the
run to T (tests/training/test_forks.py), at ``Recipe.with_lr_factor(f)``, which scales the whole
schedule (peak and floor) and so every group's fair rate by f, as ``climb.scale_rates`` does (equal
up to float rounding). The jobs of stage 2 and 3 depend on stage 1's results, so the bench runs in
rounds until nothing new is due; ``--plan`` prints what is known now and the most the rule can add.

    python bench/located_rate.py --plan
    nice -n 15 python bench/located_rate.py --max-minutes 60
    python bench/located_rate.py --report
"""

from __future__ import annotations

import math
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import proxy_fidelity as pf  # noqa: E402
from bench.harness import jobs as jobs_lib  # noqa: E402
from bench.harness import store  # noqa: E402
from bench.harness.cli import bench_parser  # noqa: E402
from bench.harness.version import files_version  # noqa: E402
from npas import (  # noqa: E402
    LR_GRID,
    LR_MAX_EXTENSIONS,
    Recipe,  # noqa: E402
    lr_best_factor,
    lr_next_factor,
)

RESULTS = ROOT / "bench" / "results" / "located_rate"
N_HOLD = 8  # candidates of the hold-at-T check (the first ones: the 3 baselines, then samples)
HOLD_SEED = 2000  # a fresh seed: never a proxy seed (0, 2) nor a long seed (1000, 1001)


@dataclass(frozen=True)
class Job:
    cand: pf.Candidate
    kind: str  # "grid" (to rung 1, seed 0) | "hold" (to T, HOLD_SEED) | "wsd" (to T at the located factor, seed 0)
    factor: float

    def recipe(self, wsd: Recipe) -> Recipe:
        base = wsd.with_steps(wsd.fork_rungs()[0]) if self.kind == "grid" else wsd
        seed = HOLD_SEED if self.kind == "hold" else wsd.seed
        return Recipe.from_dict({**base.with_lr_factor(self.factor).to_dict(), "seed": seed})

    def key(self, wsd: Recipe, version: str) -> str:
        r = self.recipe(wsd)
        return f"{self.cand.config.hash}-{self.kind}-{r.steps}-s{r.seed}-x{self.factor:g}-{version}"




def located(cand: pf.Candidate, grid: dict[float, float]) -> tuple[float | None, float | None]:
    """(the next factor the rule wants, the located factor once it wants none)."""
    nxt = lr_next_factor(grid)
    return nxt, (lr_best_factor(grid) if nxt is None and grid else None)


class Bench:
    """The three stages over the cache: what is known, what is due next."""

    def __init__(self, setup: pf.Setup, cands: list[pf.Candidate], out: Path) -> None:
        assert setup.wsd is not None
        self.setup, self.cands, self.out, self.wsd = setup, cands, out, setup.wsd
        self.fair_version = pf.code_version(setup)
        # the proxy-fidelity bench's WSD code version: these are WSD runs of the same numerics (its probe
        # keeps the version while they are unchanged) and fork/schedule code; the rule that picks factors
        # is not in it: it decides which runs are due, not what a run computes
        self.version = f"{self.fair_version}-{files_version(pf.WSD_VERSIONED)}"

    def path(self, j: Job) -> Path:
        return self.out / f"{j.key(self.wsd, self.version)}.json"

    def record(self, j: Job) -> dict | None:
        if j.kind == "wsd" and j.factor == 1.0:  # the proxy-fidelity bench's own run at the fair rate
            pj = pf.Job(j.cand, "wsd", self.setup.proxy.seed, pf.DEFAULT_PAR)
            p = self.setup.out / f"{pj.key(self.setup, self.fair_version)}.json"
            if store.exists(p):
                return store.load(p)
        p = self.path(j)
        return store.load(p) if store.exists(p) else None

    def grid(self, c: pf.Candidate) -> dict[float, float]:
        """Rung-1 losses of the factors tried so far, in the rule's order (a failed run: +inf)."""
        out: dict[float, float] = {}
        while (f := lr_next_factor(out)) is not None:
            rec = self.record(Job(c, "grid", f))
            if rec is None:
                break
            v = rec.get("val_loss")
            out[f] = float(v) if rec.get("status") == "ok" and v is not None and math.isfinite(v) else math.inf
        return out

    def due(self) -> list[Job]:
        """Jobs the rule asks for now and the cache lacks: grid steps first, then hold, then wsd."""
        grid, hold, wsd = [], [], []
        for i, c in enumerate(self.cands):
            g = self.grid(c)
            nxt, f = located(c, g)
            if nxt is not None:
                grid.append(Job(c, "grid", nxt))
                continue
            assert f is not None
            if i < N_HOLD:
                hold += [Job(c, "hold", x) for x in (f / 2, f, 2 * f) if self.record(Job(c, "hold", x)) is None]
            if self.record(Job(c, "wsd", f)) is None:
                wsd.append(Job(c, "wsd", f))
        return grid + hold + wsd

    def runs(self, jobs: list[Job]) -> jobs_lib.Runs:
        return jobs_lib.Runs(jobs, self.path, lambda j: (j.cand.config, j.recipe(self.wsd), pf.REFERENCE[0]),
                             lambda j: {"candidate": j.cand.name, "kind": j.kind, "factor": j.factor,
                                        "seed": j.recipe(self.wsd).seed, "code_version": self.version})


def run(b: Bench, workers: int, max_minutes: float | None) -> None:
    import time

    t0 = time.perf_counter()
    for rnd in range(1, 8):  # the grid (1 round), its extensions (<= 2), then hold and wsd
        due = b.due()
        if not due:
            print("nothing due: every stage is cached")
            return
        left = None if max_minutes is None else max_minutes - (time.perf_counter() - t0) / 60
        if left is not None and left <= 0:
            print(f"time box of {max_minutes:g} min spent; {len(due)} runs due")
            return
        print(f"round {rnd}: {len(due)} runs due ({', '.join(f'{k} {sum(j.kind == k for j in due)}' for k in ('grid', 'hold', 'wsd'))})", flush=True)

        def fits(j: Job, elapsed: float, box: float | None = left) -> bool:
            return box is None or elapsed < box * 60

        def progress(_i: int, _n: int, j: Job, rec: dict, _e: float) -> None:
            print(f"  {j.kind:<4} {j.cand.name:<14} x{j.factor:<6g} {rec['status']:<7} val {rec.get('val_loss')} "
                  f"test {rec.get('test_loss')} {rec['wall_s']:.0f} s", flush=True)

        jobs_lib.run_missing(b.runs(due), workers, f" (code version {b.version}) in {b.out}", progress, fits)


def plan(b: Bench) -> None:
    due = b.due()
    T, r1 = b.wsd.steps, b.wsd.fork_rungs()[0]
    steps = {"grid": r1, "hold": T, "wsd": T}
    known = sum(steps[j.kind] for j in due)
    n = len(b.cands)
    g_max = n * (len(LR_GRID) + LR_MAX_EXTENSIONS) * r1
    most = g_max + N_HOLD * 3 * T + n * T
    print(f"due now: {len(due)} runs, {known:,} steps ({', '.join(f'{k} {sum(j.kind == k for j in due)}' for k in steps)}); "
          f"the whole bench at most {most:,} optimizer steps (grids {g_max:,}, hold {N_HOLD * 3 * T:,}, "
          f"wsd <= {n * T:,}, fewer where a factor is 1: proxy_fidelity's WSD run is reused)")


def report(b: Bench) -> dict[str, Any]:
    from bench.proxy_fidelity_ladder import replay, rung_losses_of
    from bench.proxy_fidelity_report import _delta_target, _horizon_row

    T = b.wsd.steps
    print(f"located rates over {len(b.cands)} candidates (grid {list(LR_GRID)} at rung "
          f"{b.wsd.fork_rungs()[0]}, seed {b.wsd.seed}; hold at T = {T} on seed {HOLD_SEED}, test loss)")
    print(f"{'candidate':<14}{'grid (factor: rung-1 val loss)':<58}{'f':>6}{'hold f/2':>10}{'f':>9}{'2f':>9}  best")
    holds = {"best": 0, "near": 0, "n": 0, "edge": 0}
    fac: dict[str, float] = {}
    grids = {c.name: b.grid(c) for c in b.cands}  # read from the cache once
    for i, c in enumerate(b.cands):
        g = grids[c.name]
        nxt, f = located(c, g)
        cells = " ".join(f"{k:g}:{v:.3f}" for k, v in sorted(g.items()))
        if f is None:
            print(f"{c.name:<14}{cells:<58}{'-':>6}  (grid incomplete: next x{nxt:g})")
            continue
        fac[c.name] = f
        edge = f in (min(g), max(g)) and len(g) > 1
        line = f"{c.name:<14}{cells:<58}{f:>6g}{'*' if edge else ' '}"
        if i < N_HOLD:
            h = {x: b.record(Job(c, "hold", x)) for x in (f / 2, f, 2 * f)}
            t = {x: (r or {}).get("test_loss") for x, r in h.items()}
            line += "".join(f"{v:>9.4f}" if v is not None else f"{'-':>9}" for v in t.values())
            if all(v is not None for v in t.values()):
                best = min(t, key=lambda x: t[x])
                holds["n"] += 1
                holds["best"] += best == f
                holds["near"] += True  # of three rates one x2 step apart, the best is within a step of f
                holds["edge"] += best != f
                line += f"  x{best:g}{'' if best == f else ' (optimum at T on that side not bounded)'}"
        print(line)
    print("* the located factor sits at an edge of the grid after its extensions: bounded, not located")
    full = holds["n"] == min(N_HOLD, len(b.cands))
    verdict = (("PASS" if holds["best"] >= 6 and holds["near"] == holds["n"] else "MISS") if full
               else f"INCOMPLETE ({holds['n']} of {min(N_HOLD, len(b.cands))})")
    print(f"target: located factor best of three at T for {holds['best']} of {holds['n']} (>= 6 of 8), within one "
          f"step for {holds['near']} of {holds['n']}: {verdict}")
    # the ladder with located rates
    res = pf.load(b.setup, b.cands, b.fair_version)
    longs = {c.name: [r["test_loss"] for s in b.setup.long_seeds
                      if (r := res.get((c.config.hash, "long", s, pf.DEFAULT_PAR))) and r.get("test_loss") is not None]
             for c in b.cands}
    target = {n: statistics.fmean(v) for n, v in longs.items() if len(v) == len(b.setup.long_seeds)}
    losses, grid_steps = {}, 0
    for c in b.cands:
        if c.name not in fac:
            continue
        rec = b.record(Job(c, "wsd", fac[c.name]))
        if rec is None or rec.get("status") != "ok":
            continue
        got = rung_losses_of(rec, T)
        got[b.wsd.fork_rungs()[0]] = min(grids[c.name].values())  # rung 1 is the grid's best
        losses[c.name] = got
        grid_steps += (len(grids[c.name]) - 1) * b.wsd.fork_rungs()[0]
    if len(losses) < 3:
        print("ladder with located rates: fewer than 3 candidates complete; nothing to replay")
        return {"hold": holds}
    order = [c.name for c in b.cands if c.name in losses]
    rep = replay(order, losses, b.wsd, {c.name: c.flops for c in b.cands})
    score = rep.score()
    n = len(order)
    row = _horizon_row("ladder, located rates", {c.name: score.get(c.name) for c in b.cands}, target, None,
                       len(b.cands))
    frac = (rep.total_steps + grid_steps) / (n * T)
    print(f"ladder compute with the grids: {rep.total_steps:,} + {grid_steps:,} grid steps = {frac:.3f} x N x T")
    fair = {}
    for c in b.cands:
        if c.name in losses:
            r0 = b.record(Job(c, "wsd", 1.0))
            if r0 is not None and r0.get("status") == "ok":
                fair[c.name] = rung_losses_of(r0, T)
    delta = None
    if len(fair) == len(losses):
        frep = replay(order, fair, b.wsd, {c.name: c.flops for c in b.cands})
        fs = frep.score()
        delta = _delta_target({k: score.get(k) for k in target}, {k: fs.get(k) for k in target}, target,
                              len(b.cands), "ladder located", "ladder fair")
    return {"hold": holds, "ladder": row, "compute_fraction": frac, "target": delta}


def main(argv: list[str] | None = None) -> int:
    p = bench_parser(__doc__.split("\n\n")[0], "4 candidates, smoke recipe, tiny steps, temp dir", RESULTS)
    p.add_argument("--max-minutes", type=float, default=None, help="start no new run after this many minutes")
    a = p.parse_args(argv)
    setup = pf.make_setup(a.quick, None, None, None, a.workers)
    _, cands = pf.load_candidates(setup)
    out = a.out or (Path(tempfile.mkdtemp(prefix="npas-located-")) if a.quick else RESULTS)
    b = Bench(setup, cands, out)
    print(f"[located_rate] {len(cands)} candidates of {pf.SPACE.relative_to(ROOT)}; WSD to T = {b.wsd.steps}, "
          f"rungs {list(b.wsd.fork_rungs())}; code version {b.version}; cache {out}")
    if a.plan:
        plan(b)
        return 0
    if not a.report:
        run(b, a.workers, a.max_minutes)
    report(b)
    return 0


if __name__ == "__main__":
    sys.exit(main())
