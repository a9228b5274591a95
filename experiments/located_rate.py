"""Located learning rates (issue #35): does the located choice hold at T, and what does it buy the ladder?

A search under the ladder picks each promoted candidate's rate at the locating rung
(``npas.training.located_rate``: factors x0.5, x1, x2, x4 of its fair rate, each trained to the rung
at T/4 and scored by its cooldown fork; an edge optimum extends the grid one x2 step, at most twice).
This bench asks two things of that rule on the frozen fidelity candidates of ``experiments/proxy_fidelity.py``
(equal stored params, its WSD recipe to T = 1,600 steps, rungs T/16, T/4, T):

1. **hold** (item 3): on 8 candidates (``hold_set``: the 3 baselines, then the first 5 samples in
   the bench's order under ``HOLD_MAX_FLOPS`` -- a cost rule, fixed before their runs, that keeps the
   check inside the issue's 8 core-hours), train the located factor f and one x2 step each side
   (f/2, 2f) to T on a fresh seed (``HOLD_SEED``), test split. Target: f is the best of the three at
   T for >= 6 of 8, and within one step for all 8 (a best at f/2 or 2f is within one step of f, but it
   leaves the optimum at T unbounded on that side: said so).
2. **ladder with located rates** (item 4): every candidate's grid (seed 0, the proxy's seed, as a
   search trains it), then its WSD run to T at the located factor (seed 0; at factor 1 it is the
   proxy-fidelity bench's own cached WSD run, read from that cache, not retrained), replayed through
   the ladder's rule (``experiments/proxy_fidelity_ladder.py``) with the locating rung = the grid's best,
   and its grid steps added to the ladder's compute. Against truth at the fair rate (the long cosine
   runs' mean test loss, ``proxy_fidelity``); Delta tau (located - fair-rate ladder), paired bootstrap.

``--rung first`` replays the rule's first version (the grid at rung 1, T/16): its cached runs are
the evidence it was replaced (the factor chosen at T/16 was best at T on 0 of the first 2 held).

A grid run is a WSD run of length r (the locating rung, ``Recipe.with_steps``): bit for bit the fork
at r of the run to T (tests/training/test_forks.py), at ``Recipe.with_lr_factor(f)``, which scales
the whole schedule (peak and floor) and so every group's fair rate by f, as ``climb.scale_rates``
does (equal up to float rounding); at x1 it is read from the proxy-fidelity WSD run's fork at r. The
jobs of stage 2 and 3 depend on stage 1's results, so the bench runs in rounds until nothing new is
due; ``--plan`` prints what is known now and the most the rule can add.

    python experiments/located_rate.py --plan
    nice -n 15 python experiments/located_rate.py --max-minutes 60
    python experiments/located_rate.py --report
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

from experiments import proxy_fidelity as pf  # noqa: E402
from experiments.harness import jobs as jobs_lib  # noqa: E402
from experiments.harness import store  # noqa: E402
from experiments.harness.cli import bench_parser  # noqa: E402
from npas import Recipe  # noqa: E402
from npas.training.located_rate import DEFAULT_GRID as LR_GRID  # noqa: E402
from npas.training.located_rate import MAX_EXTENSIONS as LR_MAX_EXTENSIONS  # noqa: E402
from npas.training.located_rate import best_factor as lr_best_factor  # noqa: E402
from npas.training.located_rate import locate_rung as lr_locate_rung  # noqa: E402
from npas.training.located_rate import next_factor as lr_next_factor  # noqa: E402

RESULTS = ROOT / "experiments" / "results" / "located_rate"
N_HOLD = 8  # candidates of the hold-at-T check: the 3 baselines, then samples (``hold_set``)
HOLD_MAX_FLOPS = 1.3e6  # samples held at T cost under this many FLOPs/token (a T run of one at 3.4M: ~2.5x)
HOLD_SEED = 2000  # a fresh seed: never a proxy seed (0, 2) nor a long seed (1000, 1001)


@dataclass(frozen=True)
class Job:
    cand: pf.Candidate
    kind: str  # "grid" (to the rung, seed 0) | "hold" (to T, HOLD_SEED) | "wsd" (to T at the located factor, seed 0)
    factor: float
    rung: int = 0  # a grid run's length: the locating rung

    def recipe(self, wsd: Recipe) -> Recipe:
        base = wsd.with_steps(self.rung) if self.kind == "grid" else wsd
        seed = HOLD_SEED if self.kind == "hold" else wsd.seed
        return Recipe.from_dict({**base.with_lr_factor(self.factor).to_dict(), "seed": seed})

    def key(self, wsd: Recipe, version: str) -> str:
        r = self.recipe(wsd)
        return f"{self.cand.config.hash}-{self.kind}-{r.steps}-s{r.seed}-x{self.factor:g}-{version}"




def hold_set(cands: list[pf.Candidate]) -> list[str]:
    """The candidates held at T: the baselines, then the first samples under ``HOLD_MAX_FLOPS``."""
    base = [c.name for c in cands if not c.name.startswith("s")]
    cheap = [c.name for c in cands if c.name.startswith("s") and c.flops <= HOLD_MAX_FLOPS]
    return (base + cheap)[:N_HOLD]


def located(cand: pf.Candidate, grid: dict[float, float]) -> tuple[float | None, float | None]:
    """(the next factor the rule wants, the located factor once it wants none)."""
    nxt = lr_next_factor(grid)
    return nxt, (lr_best_factor(grid) if nxt is None and grid else None)


class Bench:
    """The three stages over the cache: what is known, what is due next."""

    def __init__(self, setup: pf.Setup, cands: list[pf.Candidate], out: Path, first_rung: bool = False) -> None:
        assert setup.wsd is not None
        self.setup, self.cands, self.out, self.wsd = setup, cands, out, setup.wsd
        # where the grid is scored: the rule's locating rung (T/4), or the first version's rung 1
        self.rung = self.wsd.fork_rungs()[0] if first_rung else lr_locate_rung(self.wsd)
        self.held = hold_set(cands) if not first_rung else [c.name for c in cands[:N_HOLD]]
        self.fair_version = pf.code_version(setup)
        # the proxy-fidelity bench's WSD code version: these are WSD runs of the same numerics and WSD
        # recipe; the rule that picks factors is not in it: it decides which runs are due, not what a
        # run computes
        self.version = f"{self.fair_version}-{pf.wsd_version(setup)}"

    def path(self, j: Job) -> Path:
        return self.out / f"{j.key(self.wsd, self.version)}.json"

    def fair_wsd(self, c: pf.Candidate) -> dict | None:
        """The proxy-fidelity bench's own WSD run to T at the fair rate, seed 0."""
        pj = pf.Job(c, "wsd", self.setup.proxy.seed, pf.DEFAULT_PAR)
        p = self.setup.out / f"{pj.key(self.setup, self.fair_version)}.json"
        return store.load(p) if store.exists(p) else None

    def record(self, j: Job) -> dict | None:
        if j.kind == "wsd" and j.factor == 1.0 and (rec := self.fair_wsd(j.cand)) is not None:
            return rec
        if j.kind == "grid" and j.factor == 1.0 and j.rung != self.wsd.fork_rungs()[0]:
            # the x1 grid run is the fork at the rung of that same run (bit for bit): read, not retrained
            rec = self.fair_wsd(j.cand)
            if rec is not None and rec.get("status") == "ok" and str(j.rung) in (rec.get("rung_losses") or {}):
                return {"status": "ok", "val_loss": rec["rung_losses"][str(j.rung)], "wall_s": 0.0}
        p = self.path(j)
        return store.load(p) if store.exists(p) else None

    def grid(self, c: pf.Candidate) -> dict[float, float]:
        """Losses at the locating rung of the factors tried so far, in the rule's order (failed: +inf)."""
        out: dict[float, float] = {}
        while (f := lr_next_factor(out)) is not None:
            rec = self.record(Job(c, "grid", f, self.rung))
            if rec is None:
                break
            v = rec.get("val_loss")
            out[f] = float(v) if rec.get("status") == "ok" and v is not None and math.isfinite(v) else math.inf
        return out

    def climb_steps(self) -> int:
        """Optimizer steps of one grid run as a search trains it: a climb to the locating rung, the lower
        rungs' fork decays included (the bench's own run of length r trains r, with equal loss)."""
        from experiments.proxy_fidelity_ladder import segment_steps

        rungs = tuple(self.wsd.fork_rungs())
        return sum(segment_steps(self.wsd, rungs, i) for i in range(rungs.index(self.rung) + 1))

    def ladder_losses(self, grids: dict[str, dict[float, float]]) -> tuple[dict[str, dict[int, float]], set[str]]:
        """Every candidate's rung losses as the located ladder sees them: below the locating rung at x1
        (the fair WSD run's forks), at it the grid's best, above it the WSD run at the located factor.
        What is not known yet stands in from the fair run (those names are returned apart): only the
        decisions it leads to are used, to ask for the runs it lacks."""
        from experiments.proxy_fidelity_ladder import rung_losses_of

        T, out, stand_in = self.wsd.steps, {}, set()
        for c in self.cands:
            fair = rung_losses_of(self.fair_wsd(c), T)
            if not fair:
                continue
            got = {t: v for t, v in fair.items() if t < self.rung}
            _, f = located(c, grids[c.name])
            got[self.rung] = grids[c.name][f] if f is not None else fair[self.rung]
            rec = self.record(Job(c, "wsd", f)) if f is not None else None
            above = rung_losses_of(rec, T) if rec is not None and rec.get("status") == "ok" else None
            if above is None:
                above = fair
            if f is None or above is fair:
                stand_in.add(c.name)
            got.update({t: v for t, v in above.items() if t > self.rung})
            out[c.name] = got
        return out, stand_in

    def replay(self, losses: dict[str, dict[int, float]]) -> Any:
        from experiments.proxy_fidelity_ladder import replay

        order = [c.name for c in self.cands if c.name in losses]
        return replay(order, losses, self.wsd, {c.name: c.flops for c in self.cands})

    def reached(self, grids: dict[str, dict[float, float]]) -> dict[str, int]:
        """The rung the located ladder lets each candidate reach, as the cache stands (``ladder_losses``:
        what is missing stands in from the fair run)."""
        losses, _ = self.ladder_losses(grids)
        return self.replay(losses).reached if losses else {}

    def due(self) -> list[Job]:
        """Jobs the rule asks for now and the cache lacks: the held candidates' grid steps and holds first
        (the check of the rule itself; holds cheapest candidate first), then the grid steps of the others the ladder lets reach the
        locating rung, then the WSD runs to T at a located factor of those the ladder lets reach T."""
        grid, hold, wsd, other = [], [], [], []
        grids = {c.name: self.grid(c) for c in self.cands}
        reached = self.reached(grids)
        for c in self.cands:
            at = reached.get(c.name, 0)
            if c.name not in self.held and at < self.rung:
                continue  # stopped below the locating rung: a search locates no rate for it
            nxt, f = located(c, grids[c.name])
            if nxt is not None:
                (grid if c.name in self.held else other).append(Job(c, "grid", nxt, self.rung))
                continue
            assert f is not None
            if c.name in self.held:
                hold += [Job(c, "hold", x) for x in (f / 2, f, 2 * f) if self.record(Job(c, "hold", x)) is None]
            if at == self.wsd.steps and self.record(Job(c, "wsd", f)) is None:
                wsd.append(Job(c, "wsd", f))
        # the verdict's runs, cheapest candidate first (FLOPs/token), so a time box completes the most candidates
        held = sorted(hold, key=lambda j: (j.cand.flops, self.held.index(j.cand.name), j.factor))
        return grid + held + other + wsd

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
    T, r = b.wsd.steps, b.rung
    steps = {"grid": r, "hold": T, "wsd": T}
    known = sum(steps[j.kind] for j in due)
    reached = b.reached({c.name: b.grid(c) for c in b.cands})
    gridded = set(b.held) | {n for n, t in reached.items() if t >= r}
    at_top = sum(1 for t in reached.values() if t == T)
    g_max = len(gridded) * (len(LR_GRID) + LR_MAX_EXTENSIONS) * r
    most = g_max + len(b.held) * 3 * T + at_top * T
    print(f"due now: {len(due)} runs, {known:,} steps ({', '.join(f'{k} {sum(j.kind == k for j in due)}' for k in steps)}); "
          f"the whole bench as the ladder stands now at most {most:,} optimizer steps (grids of {len(gridded)} "
          f"candidates {g_max:,}, hold {len(b.held) * 3 * T:,}, wsd <= {at_top * T:,} for the {at_top} it takes to T; "
          f"fewer where a factor is 1: proxy_fidelity's runs are reused)")


def hold_losses(b: Bench, c: pf.Candidate) -> dict[float, float]:
    """Every factor this candidate was trained to T at on the hold seed (test loss): the located rule's three
    and any the first rule's holds left (x0.125 ... x16 probed)."""
    out = {}
    for k in range(-3, 5):
        rec = b.record(Job(c, "hold", 2.0 ** k))
        if rec is not None and rec.get("status") == "ok" and rec.get("test_loss") is not None:
            out[2.0 ** k] = float(rec["test_loss"])
    return out


def held_at_best(b: Bench, grids: dict[str, dict[float, float]]) -> dict[str, Any] | None:
    """Item 4 on the held candidates, from runs the hold check already trained (no new run): truth at T at
    each one's best rate (the lowest test loss of its holds) and at its fair rate (its x1 hold: the same
    seed, recipe and schedule), against the rung-T/4 score at the located factor (its grid's best) and at
    x1. The order at T moves with the rate by tau(fair, best) < 1; Delta tau (located - fair) asks whether
    the located score tracks the order at the best rates better. Eight candidates and one seed: the
    intervals are wide, and are printed as a diagnostic, not the 24-candidate target."""
    from experiments.proxy_fidelity_report import _delta_target, _horizon_row

    cols: dict[str, dict[str, float]] = {"located": {}, "fair": {}, "truth_best": {}, "truth_fair": {}}
    for c in b.cands:
        if c.name not in b.held:
            continue
        g, h = grids[c.name], hold_losses(b, c)
        _, f = located(c, g)
        if f is None or 1.0 not in g or 1.0 not in h or not all(x in h for x in (f / 2, f, 2 * f)):
            continue
        cols["located"][c.name], cols["fair"][c.name] = g[f], g[1.0]
        cols["truth_best"][c.name], cols["truth_fair"][c.name] = min(h.values()), h[1.0]
    n = len(cols["located"])
    print(f"held candidates at T, from the hold runs (seed {HOLD_SEED}, test loss): {n} of {len(b.held)} complete")
    if n < 3:
        return None
    for name in cols["located"]:
        print(f"  {name:<14} rung-{b.rung} located {cols['located'][name]:.4f} x1 {cols['fair'][name]:.4f} | "
              f"T best {cols['truth_best'][name]:.4f} x1 {cols['truth_fair'][name]:.4f}")
    m = len(b.held)  # out of the whole held set: INCOMPLETE until every one is in
    rows = {"n": n, "fair_vs_best_at_T": _horizon_row("T at x1 vs T at best rate", cols["truth_fair"],
                                                      cols["truth_best"], None, m)}
    for score in ("located", "fair"):
        for truth in ("truth_best", "truth_fair"):
            rows[f"{score}_vs_{truth}"] = _horizon_row(f"rung {b.rung} {score} vs {truth.replace('_', ' at ')}",
                                                       cols[score], cols[truth], None, m)
    rows["delta"] = _delta_target(cols["located"], cols["fair"], cols["truth_best"], m,
                                  f"rung {b.rung} located", f"rung {b.rung} x1",
                                  prefix="held set, truth at each one's best rate (diagnostic)")
    return rows


def report(b: Bench) -> dict[str, Any]:
    from experiments.proxy_fidelity_ladder import rung_losses_of
    from experiments.proxy_fidelity_report import _delta_target, _horizon_row

    T = b.wsd.steps
    print(f"located rates over {len(b.cands)} candidates (grid {list(LR_GRID)} at rung {b.rung}, seed {b.wsd.seed}; "
          f"hold at T = {T} on seed {HOLD_SEED}, test loss; held: {', '.join(b.held)})")
    print(f"{'candidate':<14}{f'grid (factor: rung-{b.rung} val loss)':<58}{'f':>6}{'hold f/2':>10}{'f':>9}{'2f':>9}  best")
    holds = {"best": 0, "near": 0, "n": 0, "edge": 0}
    grids = {c.name: b.grid(c) for c in b.cands}  # read from the cache once
    for c in b.cands:
        g = grids[c.name]
        nxt, f = located(c, g)
        cells = " ".join(f"{k:g}:{v:.3f}" for k, v in sorted(g.items()))
        if f is None:
            if g:
                print(f"{c.name:<14}{cells:<58}{'-':>6}  (grid incomplete: next x{nxt:g})")
            continue
        edge = f in (min(g), max(g)) and len(g) > 1
        line = f"{c.name:<14}{cells:<58}{f:>6g}{'*' if edge else ' '}"
        if c.name in b.held:
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
    full = holds["n"] == len(b.held)
    verdict = (("PASS" if holds["best"] >= 6 and holds["near"] == holds["n"] else "MISS") if full
               else f"INCOMPLETE ({holds['n']} of {len(b.held)})")
    print(f"target: located factor best of three at T for {holds['best']} of {holds['n']} (>= 6 of 8), within one "
          f"step for {holds['near']} of {holds['n']}: {verdict}")
    held_rows = held_at_best(b, grids)
    # the ladder with located rates, replayed, against the ladder at the fair rate
    res = pf.load(b.setup, b.cands, b.fair_version)
    longs = {c.name: [r["test_loss"] for s in b.setup.long_seeds
                      if (r := res.get((c.config.hash, "long", s, pf.DEFAULT_PAR))) and r.get("test_loss") is not None]
             for c in b.cands}
    target = {n: statistics.fmean(v) for n, v in longs.items() if len(v) == len(b.setup.long_seeds)}
    losses, stand_in = b.ladder_losses(grids)
    if len(losses) < 3:
        print("ladder with located rates: fewer than 3 candidates have a fair WSD run; nothing to replay")
        return {"hold": holds, "held": held_rows}
    rep = b.replay(losses)
    missing = sorted(n for n in stand_in if rep.reached.get(n, 0) >= b.rung)
    if missing:
        print(f"ladder with located rates: INCOMPLETE, {len(missing)} of the candidates it promotes to rung "
              f"{b.rung} or T lack their grid or WSD run ({', '.join(missing)}); the fair run stands in for them")
    score = rep.score()
    n = len(losses)
    row = _horizon_row("ladder, located rates", {c.name: score.get(c.name) for c in b.cands}, target, None,
                       len(b.cands))
    located_here = [nm for nm in losses if rep.reached.get(nm, 0) >= b.rung and nm not in stand_in]
    grid_steps = sum((len(grids[nm]) - 1) * b.climb_steps() for nm in located_here)
    frac = (rep.total_steps + grid_steps) / (n * T)
    reached = {t: sum(1 for v in rep.reached.values() if v == t) for t in b.wsd.fork_rungs()}
    print(f"ladder compute with the grids: {rep.total_steps:,} + {grid_steps:,} grid steps "
          f"({len(located_here)} grids) = {frac:.3f} x N x T; reached rungs {reached}")
    if missing:
        print("target: delta tau (ladder located - ladder fair): INCOMPLETE")
        return {"hold": holds, "held": held_rows, "ladder": row, "compute_fraction": frac, "target": None,
                "complete": False}
    fair = {c.name: rung_losses_of(b.fair_wsd(c), T) for c in b.cands if c.name in losses}
    frep = b.replay(fair)
    fs = frep.score()
    delta = _delta_target({k: score.get(k) for k in target}, {k: fs.get(k) for k in target}, target,
                          len(b.cands), "ladder located", "ladder fair")
    return {"hold": holds, "held": held_rows, "ladder": row, "compute_fraction": frac, "target": delta,
            "complete": not missing}


def main(argv: list[str] | None = None) -> int:
    p = bench_parser(__doc__.split("\n\n")[0], "4 candidates, smoke recipe, tiny steps, temp dir", RESULTS)
    p.add_argument("--max-minutes", type=float, default=None, help="start no new run after this many minutes")
    p.add_argument("--rung", choices=("locate", "first"), default="locate",
                   help="where the grid is scored: the rule's locating rung (T/4, default) or rung 1, the "
                        "rule's first version (its cached runs)")
    a = p.parse_args(argv)
    setup = pf.make_setup(a.quick, None, None, None, a.workers)
    _, cands = pf.load_candidates(setup)
    out = a.out or (Path(tempfile.mkdtemp(prefix="npas-located-")) if a.quick else RESULTS)
    b = Bench(setup, cands, out, first_rung=a.rung == "first")
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
