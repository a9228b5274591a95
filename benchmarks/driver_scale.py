"""Driver scale: does the driver's own per-trial bookkeeping stay flat as a study grows to thousands of trials?

    python benchmarks/driver_scale.py                 # 2,000 trials, random and tpe, SQLite and PostgreSQL,
                                                 # then 4 drivers x 500 trials on one PostgreSQL study
    python benchmarks/driver_scale.py --quick         # 200 trials (windows 1-50 vs 151-200), 2 drivers x 20
    python benchmarks/driver_scale.py --db sqlite --samplers random --trials 500

No model is trained and Ray is not started. The REAL searcher (`npas.service.search.searcher.NpasSearcher`) is driven
through Ray Tune's Searcher protocol (suggest, then on_trial_complete) exactly as the runner drives it, with a
SYNTHETIC result (a loss derived from the allocation hash), on the frozen bench space
experiments/spaces/full_frozen.yaml: baselines enqueued first, infeasible and duplicate asks told as the searcher
tells them, constraints, heartbeat claims, the study-wide target, all of it the searcher's own.

Per counted trial (one suggest that returns a config, which may include skipped asks, plus its
on_trial_complete) the bench measures wall and CPU time and, separately, the time spent inside the sampler
(infer_relative_search_space, sample_relative, sample_independent, before_trial, after_trial: a wrapper
around the study's sampler, which also counts the asks). Bookkeeping = total - sampler: the searcher's and
Optuna's storage work, sampling and fitting the candidate, accounting. Reported per ask (every ask is an
Optuna trial; as TPE converges it proposes more duplicates, so asks per counted trial grow for reasons that
are the sampler's, not the bookkeeping's) for the first and the last window of counted trials (1-50 and
1,951-2,000). The verdict uses the driver process's CPU time, which a scan over the study shows and other
processes on a shared machine do not; the wall time is printed beside it. Target: late bookkeeping <= 1.2x
early bookkeeping, for every sampler on both databases. The sampler's own growth (TPE refits on every trial)
is reported, not targeted.

Several drivers (full mode: 4 processes x 500 trials; quick: 2 x 20) then share one PostgreSQL study
with a study-wide target, each keeping two trials in flight, and the bench checks: 0 trials lost (none left
RUNNING or WAITING, every finished trial has its status), exactly the target counted, 0 duplicate allocations
among the counted trials, and reports how many duplicates ran concurrently (caught when told).
PostgreSQL studies get a unique name and are deleted afterwards. Exits 0; prints PASS/MISS.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import sys
import tempfile
import time
import uuid
import warnings
from pathlib import Path

import numpy as np
import optuna
from optuna.samplers import BaseSampler
from optuna.trial import TrialState

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # a checkout run without the editable install still finds npas

from npas import Space, TrialAttr, load_space, open_storage  # noqa: E402
from npas.service.search.samplers import enqueue_baselines, learns_from_infeasible, make_sampler  # noqa: E402
from npas.service.search.searcher import NpasSearcher  # noqa: E402
from npas.service.study.storage import reachable  # noqa: E402
from npas.service.study.studies import (  # noqa: E402
    counts_toward_target,
    status,
    was_evaluated,
)

TARGET = 1.20
SPACE = ROOT / "experiments" / "spaces" / "full_frozen.yaml"
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
RECIPE = {"batch_size": 8, "seq_len": 64, "steps": 1}  # what the accounting and the trial key see


def clock() -> tuple[float, float]:
    """(wall, CPU of this process): the CPU time is what the driver itself computes, whatever else
    runs on the machine; the wall time adds waiting for the database (and for other processes)."""
    return time.perf_counter(), time.process_time()


class TimedSampler(BaseSampler):
    """The study's sampler with the time spent inside it summed up (so the bench can subtract it),
    and the asks counted (each ask calls `before_trial` once)."""

    def __init__(self, inner: BaseSampler) -> None:
        self.inner = inner
        self.wall = self.cpu = 0.0
        self.asks = 0

    def _timed(self, name: str, *args, **kwargs):
        w, c = clock()
        try:
            return getattr(self.inner, name)(*args, **kwargs)
        finally:
            w2, c2 = clock()
            self.wall += w2 - w
            self.cpu += c2 - c

    def infer_relative_search_space(self, study, trial):
        return self._timed("infer_relative_search_space", study, trial)

    def sample_relative(self, study, trial, search_space):
        return self._timed("sample_relative", study, trial, search_space)

    def sample_independent(self, study, trial, param_name, param_distribution):
        return self._timed("sample_independent", study, trial, param_name, param_distribution)

    def before_trial(self, study, trial):
        self.asks += 1
        return self._timed("before_trial", study, trial)

    def after_trial(self, study, trial, state, values):
        return self._timed("after_trial", study, trial, state, values)

    def reseed_rng(self) -> None:
        self.inner.reseed_rng()

    def reading(self) -> np.ndarray:
        return np.array([self.wall, self.cpu, float(self.asks)])


def synthetic_result(config: dict) -> dict:
    """What a worker would report, with a loss that depends only on the allocation."""
    import hashlib
    import json

    h = int(hashlib.sha256(json.dumps(config["allocation"], sort_keys=True).encode()).hexdigest()[:8], 16)
    loss = 1.5 + (h % 10_000) / 10_000
    proxy = {"status": "ok", "val_loss": loss, "steps_done": RECIPE["steps"], "curve": [[RECIPE["steps"], loss]]}
    return {"val_loss": loss, "step": RECIPE["steps"], "final": True, "proxy": json.dumps(proxy)}


def new_study(url: str, name: str, sampler: BaseSampler, space: Space) -> optuna.Study:
    storage = open_storage(url).storage
    study = optuna.create_study(study_name=name, storage=storage, directions=["minimize"] * 2, sampler=sampler)
    enqueue_baselines(study, space, TrialAttr.BASELINE)  # as the driver does, first in the study
    return study


def drive(study: optuna.Study, space: Space, target: int, timer: TimedSampler | None,
          inflight: int = 1, tag: str = "") -> np.ndarray:
    """Run the searcher until it says FINISHED. One row per counted trial (its suggest, skipped asks
    included, and its on_trial_complete): wall, CPU, sampler wall, sampler CPU, asks."""
    from ray.tune.search import Searcher

    sampler = timer.inner if timer is not None else study.sampler  # what the searcher would see unwrapped
    searcher = NpasSearcher(study, space, RECIPE, "synthetic", target,
                            learn_infeasible=learns_from_infeasible(sampler))

    def now() -> np.ndarray:  # wall, cpu, sampler wall, sampler cpu, asks
        return np.array([*clock(), *(timer.reading() if timer is not None else np.zeros(3))])

    rows: list[np.ndarray] = []
    live: collections.deque[tuple[str, dict, np.ndarray]] = collections.deque()
    i = 0
    while True:
        if len(live) < inflight and not searcher.finished:
            t = now()
            config = searcher.suggest(f"{tag}{i}")
            if config is not Searcher.FINISHED and config is not None:
                live.append((f"{tag}{i}", config, now() - t))
                i += 1
                continue
        if not live:
            break
        tid, config, spent = live.popleft()
        t = now()
        searcher.on_trial_complete(tid, synthetic_result(config))
        rows.append(spent + now() - t)
    return np.array(rows).reshape(-1, 5)


def window(rows: np.ndarray) -> dict[str, float]:
    """Per-ask means over a window of counted trials (a counted trial may include skipped asks)."""
    asks = max(rows[:, 4].sum(), 1.0)
    return {"book_wall": (rows[:, 0] - rows[:, 2]).sum() / asks, "book_cpu": (rows[:, 1] - rows[:, 3]).sum() / asks,
            "samp_wall": rows[:, 2].sum() / asks, "samp_cpu": rows[:, 3].sum() / asks,
            "asks": rows[:, 4].sum() / len(rows)}


def scale_run(db: str, sampler_name: str, n: int, w: int, space: Space, tmp: str) -> bool:
    url = f"sqlite:///{tmp}/{sampler_name}.db" if db == "sqlite" else PG_URL
    name = f"npas-bench-scale-{sampler_name}-{uuid.uuid4().hex[:8]}"
    timer = TimedSampler(make_sampler(sampler_name, 0, 2))
    study = new_study(url, name, timer, space)
    t0 = time.perf_counter()
    try:
        per = drive(study, space, n, timer)
        infeasible = sum(1 for t in study.get_trials(deepcopy=False) if status(t) == "infeasible")
        asked = len(study.get_trials(deepcopy=False))
    finally:
        if db == "postgresql":
            optuna.delete_study(study_name=name, storage=open_storage(url).storage)
    elapsed = time.perf_counter() - t0
    e, l_ = window(per[:w]), window(per[-w:])
    lo = len(per) - w + 1
    ratio = l_["book_cpu"] / e["book_cpu"]
    ok = ratio <= TARGET
    print(f"{db} {sampler_name}: {len(per)} counted trials, {asked} asks ({infeasible} infeasible), {elapsed:.1f} s")
    for label, x in ((f"trials 1-{w}", e), (f"trials {lo}-{len(per)}", l_)):
        print(f"  {label:>16}: bookkeeping {x['book_cpu'] * 1e3:7.2f} ms CPU ({x['book_wall'] * 1e3:7.2f} ms wall) "
              f"per ask; sampler {x['samp_cpu'] * 1e3:7.2f} ms CPU ({x['samp_wall'] * 1e3:7.2f} ms wall) per ask; "
              f"{x['asks']:.2f} asks per counted trial")
    print(f"  sampler growth late/early {l_['samp_cpu'] / max(e['samp_cpu'], 1e-9):.2f}x CPU (reported, not targeted); "
          f"bookkeeping wall late/early {l_['book_wall'] / e['book_wall']:.2f}x (includes waiting on a shared machine)")
    print(f"ratio: {db} {sampler_name} bookkeeping late/early = {ratio:.2f}x (driver CPU per ask) "
          f"(target <= {TARGET:.2f}x) {'PASS' if ok else 'MISS'}")
    return ok


# ---- several drivers on one PostgreSQL study -----------------------------------------------------
def _driver_process(url: str, name: str, target: int, seed: int) -> int:
    quiet()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = load_space(SPACE)
    study = optuna.load_study(study_name=name, storage=open_storage(url).storage,
                              sampler=make_sampler("random", seed, 2))
    return len(drive(study, space, target, None, inflight=2, tag=f"d{seed}-"))


def drivers_run(n_drivers: int, per_driver: int, space: Space) -> bool:
    target = n_drivers * per_driver
    name = f"npas-bench-drivers-{uuid.uuid4().hex[:8]}"
    study = new_study(PG_URL, name, make_sampler("random", 0, 2), space)
    t0 = time.perf_counter()
    try:
        with multiprocessing.get_context("spawn").Pool(n_drivers) as pool:
            ran = pool.starmap(_driver_process, [(PG_URL, name, target, s) for s in range(n_drivers)])
        trials = study.get_trials(deepcopy=False)
    finally:
        optuna.delete_study(study_name=name, storage=open_storage(PG_URL).storage)
    elapsed = time.perf_counter() - t0
    lost = [t.number for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)
            or (t.state == TrialState.FAIL and TrialAttr.STATUS not in t.user_attrs)]
    counted = [t for t in trials if counts_toward_target(t)]
    complete = [t for t in trials if was_evaluated(t)]
    keys = collections.Counter(t.user_attrs.get(TrialAttr.KEY) for t in counted)
    dup_counted = sum(c - 1 for c in keys.values() if c > 1)
    concurrent = sum(1 for t in trials if status(t) == "duplicate"
                     and str(t.user_attrs.get(TrialAttr.REASON, "")).startswith("ran concurrently"))
    dup_asked = sum(1 for t in trials if status(t) == "duplicate") - concurrent
    ok = not lost and len(counted) == target and len(complete) == target and dup_counted == 0
    print(f"{n_drivers} drivers x {per_driver} trials on one PostgreSQL study (random sampler, 2 in flight each): "
          f"{len(trials)} asked, {elapsed:.1f} s; trials run per driver: {ran}")
    print(f"  lost {len(lost)}, counted {len(counted)} / target {target}, complete {len(complete)}, "
          f"duplicate allocations counted {dup_counted}; duplicates that ran concurrently {concurrent} "
          f"(told as duplicates when they finished); duplicates caught at the ask {dup_asked}")
    print(f"drivers: lost 0, exactly the target, 0 counted duplicates {'PASS' if ok else 'MISS'}")
    return ok


def quiet() -> None:
    """Optuna warns that heartbeats are meant for `Study.optimize`; npas beats them itself (npas.service.study.faults)."""
    warnings.filterwarnings("ignore", message="Heartbeat of storage")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="200 trials, 2 drivers x 20")
    ap.add_argument("--trials", type=int, default=None,
                    help="counted trials per run (default 2000, quick 200; 0 runs only the drivers)")
    ap.add_argument("--window", type=int, default=50, help="trials in the early and the late window")
    ap.add_argument("--db", choices=("sqlite", "postgresql", "both"), default="both")
    ap.add_argument("--samplers", default="random,tpe", help="comma-separated, from npas's samplers")
    ap.add_argument("--drivers", type=int, default=None, help="drivers sharing one PostgreSQL study (4, quick 2)")
    ap.add_argument("--per-driver", type=int, default=None, help="target per driver (500, quick 20); 0 skips")
    args = ap.parse_args(argv)
    n = args.trials if args.trials is not None else (200 if args.quick else 2000)  # 0: only the drivers run
    w = min(args.window, n // 2)
    n_drivers = args.drivers or (2 if args.quick else 4)
    per_driver = args.per_driver if args.per_driver is not None else (20 if args.quick else 500)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    quiet()
    space = load_space(SPACE)
    dbs = ["sqlite", "postgresql"] if args.db == "both" else [args.db]
    if "postgresql" in dbs and not reachable(PG_URL):
        print(f"no PostgreSQL server at {PG_URL}: PostgreSQL runs skipped")
        dbs.remove("postgresql")
    print(f"npas bench: driver scale, {n} trials per run, space {SPACE.relative_to(ROOT)}, SYNTHETIC results "
          f"(nothing trained, no Ray); bookkeeping = suggest + on_trial_complete wall minus time in the sampler")
    verdicts = []
    with tempfile.TemporaryDirectory(prefix="npas-scale-") as tmp:
        for db in dbs if n > 0 else []:
            for sampler_name in args.samplers.split(","):
                verdicts.append(scale_run(db, sampler_name.strip(), n, w, space, tmp))
    if "postgresql" in dbs and per_driver > 0:
        verdicts.append(drivers_run(n_drivers, per_driver, space))
    print(f"overall: {sum(verdicts)}/{len(verdicts)} PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
