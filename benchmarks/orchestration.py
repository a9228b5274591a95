"""Orchestration overhead of `npas search`: a real search on 2 workers vs the ideal of its trials run bare.

    python benchmarks/orchestration.py            # 8 trials of ~15 s each (~4 minutes idle, ~7 on a loaded machine)
    python benchmarks/orchestration.py --trial-seconds 55 --no-profile   # 8 trials of ~55 s (~12 minutes idle)
    python benchmarks/orchestration.py --quick    # 4 trials of ~3 s each (~1 minute): a smoke run
    python benchmarks/orchestration.py --pairs    # also the trials bare 2 at a time in plain processes (no Ray)

What is compared, in one run:
  * measured: the wall time of `python -m npas search SPACE --recipe R --trials N --workers 2
    --no-early-stop --storage sqlite:///TMP/x.db --study o` as a subprocess, so interpreter start,
    imports, Ray start-up, worker start, Tune's scheduling, the searcher's database writes and the
    teardown are all inside it;
  * ideal: the same N allocations (read back from the study) trained bare with `run_proxy` in this
    process, one after another, threads=1 each (as the recipe gives every worker), summed and divided
    by the 2 workers: a perfect scheduler with zero overhead on 2 free cores.
Targets (Ray start-up included): measured <= 1.20x ideal at 15 s trials, <= 1.08x at 55 s trials,
linear in between (the fixed costs weigh less on longer trials); shorter trials, such as --quick's,
are held to the 15 s target. Prints PASS/MISS; exits 0 (1 only if the search itself fails).

Every trial costs the same: the temporary space searches only the MLP taper (schedule and ratio) with
`fit.width: mlp`, `max_width_scale: 1.0` and a 1x budget, so every candidate keeps the reference's
total MLP width (taper profiles have mean 1) and hence its FLOPs per token. The baselines npas
enqueues itself (narrow_untied, full_tying, cycle_tying) then also keep the reference widths: tying
changes where weights are stored, not the FLOPs. The recipe's step count is calibrated at start so a
bare trial takes ~15 s (--quick ~3 s); the calibration run also warms torch up in this process, so
the bare figures exclude one-time start-up that a Ray worker does pay (that is overhead).

Where the time goes is read from the study itself (each trial's ask and tell timestamps and the
worker-measured `proxy.wall_s`) plus the timestamp of Optuna's "study created" log line:
  launch -> study created            interpreter, imports, corpus
  study created -> first ask         Ray start-up (ray.init) and Tune set-up
  first ask -> last tell             the trials; split into ideal + slowdown of the trials under
                                     concurrency (sum of worker wall_s - sum of bare) / 2 + the rest
                                     (worker start and torch import, Tune dispatch, idle slots)
  last tell -> exit                  Tune and Ray shutdown, printing the front
The machine is shared and noisy: load average and the bare runs' CPU/wall ratio are printed. Because
other jobs move wall times by 2x within minutes, the CPU seconds of the search's whole process tree
(driver, Ray daemons, Ray workers; polled from /proc) are also compared with the bare trials' CPU
seconds: that ratio barely depends on other load. Full mode then profiles the fixed costs apart: a
Ray probe (ray.init, first task on fresh workers importing torch and npas, ray.shutdown) and the
driver-side cost of `NpasSearcher.suggest` / `on_trial_complete` on SQLite without Ray.

Measured (2-core machine shared with other jobs, load 9-20, so wall ratios there mean little; the
phases and CPU seconds compare side by side, --quick, main before vs after, load ~9):
  * the driver no longer imports torch (corpus described, not tokenized; Tune's auto loggers off:
    tensorboardX imported torch): driver CPU 4.2 -> 2.0 s, launch -> study created 9.5 -> 7.4 s;
  * a finished `npas search` exits without Ray's graceful shutdown: teardown 3.8 -> 0.5 s;
  * tried and dropped: Ray's `preload_python_modules` (torch imported in prestarted workers). Tune
    placed its first actors on freshly started workers, not on the preloaded idle ones, so the first
    two trials took 18-20 s instead of 8-13 s (A/B, 2 runs each); a background-thread preload hit
    circular-import errors in ray.tune. Later trials reuse their actor (reuse_actors): ~0.1 s each.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import optuna

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # a checkout run without the editable install still finds npas

from npas import ArchConfig, Recipe, TrialAttr  # noqa: E402
from npas.service.search.samplers import make_sampler  # noqa: E402
from npas.service.study.studies import counts_toward_target  # noqa: E402

TARGETS = ((15.0, 1.20), (55.0, 1.08))  # (bare seconds per trial, target ratio measured / ideal)
WORKERS = 2


def target_for(trial_s: float) -> float:
    """The target ratio for trials of `trial_s` bare seconds: TARGETS, linear between, flat outside."""
    (s0, t0), (s1, t1) = TARGETS
    if trial_s <= s0:
        return t0
    if trial_s >= s1:
        return t1
    return t0 + (t1 - t0) * (trial_s - s0) / (s1 - s0)

SPACE_TEXT = """\
# benchmarks/orchestration.py: every candidate has the reference's FLOPs (taper keeps the mean width)
name: orchestration
chassis: {vocab_size: 68, context: 64, d_model: 64, n_layers: 4, n_heads: 4, d_ff: 256, activation: gelu}
budget: 1x
objectives: [val_loss, train_memory_bytes]
fit: {width: mlp, max_width_scale: 1.0}
knobs:
  taper: {schedule: [linear, cosine, step, reverse, hourglass], ratio: {low: 1.0, high: 4.0}}
"""
SEQ_LEN, BATCH, EVAL_BATCHES = 64, 16, 4
LOG_CREATED = re.compile(r"\[I (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] A new study created")


def make_recipe(steps: int) -> Recipe:
    return Recipe(name="orchestration", seq_len=SEQ_LEN, batch_size=BATCH, steps=steps,
                  warmup_steps=min(10, steps), eval_every=steps, eval_batches=EVAL_BATCHES, threads=1)


def calibrate(cfg: ArchConfig, corpus, target_s: float, probe_steps: int) -> tuple[int, float]:
    """Steps for a ~target_s bare trial, from a short probe run (which also warms torch up)."""
    from npas import run_proxy

    run_proxy(cfg, make_recipe(max(4, probe_steps // 4)), corpus)  # first-call costs, not timed
    t = time.perf_counter()
    run_proxy(cfg, make_recipe(probe_steps), corpus)
    per_step = (time.perf_counter() - t) / probe_steps
    return max(20, min(20000, round(target_s / per_step))), per_step


@dataclass
class TrialRow:
    number: int
    baseline: str
    start: datetime.datetime
    end: datetime.datetime
    wall_s: float  # run_proxy's own wall time inside the Ray worker
    val_loss: float
    cfg: ArchConfig
    bare_s: float = 0.0
    bare_cpu_s: float = 0.0
    bare_loss: float = float("nan")


class TreeCPU:
    """CPU seconds (user + system) of a process and all its descendants, read from /proc by polling:
    the driver, Ray's daemons (gcs_server, raylet, agents) and the Ray workers, apart. Linux only;
    a process that exits between two polls loses at most its last poll interval."""

    TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def __init__(self, root: int) -> None:
        self.root = root
        self.cpu: dict[int, float] = {}
        self.kind: dict[int, str] = {}

    @staticmethod
    def _stat(pid: int) -> tuple[int, float] | None:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return int(fields[1]), (int(fields[11]) + int(fields[12])) / TreeCPU.TICK  # ppid, utime + stime
        except (OSError, IndexError, ValueError):
            return None

    def _classify(self, pid: int) -> str:
        if pid == self.root:
            return "driver (npas search, Tune, searcher)"
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            return "other"
        head = " ".join(argv[:3])  # interpreter and script, not the options (raylet names default_worker.py)
        worker = "default_worker.py" in head or "setup_worker.py" in head or argv[0].startswith("ray::")
        return "Ray workers (trials)" if worker else "Ray daemons"

    def poll(self) -> None:
        if not os.path.isdir("/proc"):
            return
        parent: dict[int, int] = {}
        cpu: dict[int, float] = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                st = self._stat(int(name))
                if st is not None:
                    parent[int(name)], cpu[int(name)] = st
        inside = {self.root}
        changed = True
        while changed:
            changed = False
            for pid, pp in parent.items():
                if pp in inside and pid not in inside:
                    inside.add(pid)
                    changed = True
        for pid in inside & cpu.keys():
            if pid not in self.kind:
                self.kind[pid] = self._classify(pid)
            self.cpu[pid] = max(self.cpu.get(pid, 0.0), cpu[pid])

    def by_kind(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for pid, c in self.cpu.items():
            out[self.kind[pid]] = out.get(self.kind[pid], 0.0) + c
        return out


def run_cli(space_path: Path, recipe_path: Path, trials: int, tmp: Path):
    cmd = [sys.executable, "-m", "npas", "search", str(space_path), "--recipe", str(recipe_path),
           "--trials", str(trials), "--workers", str(WORKERS), "--no-early-stop",
           "--storage", f"sqlite:///{tmp}/x.db", "--study", "o"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    out_path, err_path = tmp / "search.out", tmp / "search.err"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        launched = datetime.datetime.now()
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=out, stderr=err)  # cwd: Tune's scratch goes to tmp
        tree = TreeCPU(proc.pid)
        while proc.poll() is None:
            tree.poll()
            time.sleep(0.5)
        wall = time.perf_counter() - t
        exited = datetime.datetime.now()
    stdout, stderr = out_path.read_text(), err_path.read_text()
    if proc.returncode != 0:
        print(f"npas search failed (exit {proc.returncode}):\n{stdout[-3000:]}\n{stderr[-3000:]}")
        sys.exit(1)
    return wall, launched, exited, stderr, tree.by_kind()


def read_trials(url: str) -> list[TrialRow]:
    study = optuna.load_study(study_name="o", storage=url)
    rows = []
    for t in study.get_trials(deepcopy=False):
        proxy = t.user_attrs.get(TrialAttr.PROXY)
        if not counts_toward_target(t) or not proxy:
            continue
        rows.append(TrialRow(t.number, str(t.user_attrs.get(TrialAttr.BASELINE, "")), t.datetime_start,
                             t.datetime_complete, float(proxy["wall_s"]), float(proxy.get("val_loss") or "nan"),
                             ArchConfig.from_dict(t.user_attrs[TrialAttr.ALLOC])))
    return sorted(rows, key=lambda r: r.number)


def searcher_cost(space, recipe: Recipe, corpus, tmp: Path, trials: int, proxy: dict) -> tuple[float, float, float]:
    """Median ms per suggest() and per on_trial_complete() of the real NpasSearcher on SQLite, and the
    import time of ray.tune: the driver-side work per trial, without Ray running."""
    t = time.perf_counter()
    from npas import open_storage
    from npas.service.search.searcher import NpasSearcher

    import_s = time.perf_counter() - t
    url = f"sqlite:///{tmp}/searcher.db"
    study = optuna.create_study(study_name="s", storage=open_storage(url).storage, directions=["minimize"] * 2,
                                sampler=make_sampler("tpe", 0, 2))
    searcher = NpasSearcher(study, space, recipe.to_dict(), corpus.fingerprint, trials)
    ask, tell = [], []
    for i in range(trials):
        t = time.perf_counter()
        cfg = searcher.suggest(f"t{i}")
        ask.append(time.perf_counter() - t)
        if not isinstance(cfg, dict):
            break
        result = {"proxy": json.dumps({**proxy, "steps_done": recipe.steps}),
                  "step": recipe.steps, "val_loss": proxy["val_loss"], "final": True}
        t = time.perf_counter()
        searcher.on_trial_complete(f"t{i}", result)
        tell.append(time.perf_counter() - t)
    return 1e3 * statistics.median(ask), 1e3 * statistics.median(tell), import_s


# ---- profiling helpers (full mode) -------------------------------------------------------------
_POOL: dict = {}


def _pool_init(steps: int) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    from npas import load_corpus, run_proxy
    from npas.allocation.space_parser import parse_space

    corpus = load_corpus(None)
    space = parse_space(SPACE_TEXT, "orchestration.yaml").bind(vocab_size=corpus.vocab_size)
    cfg = space.sample(optuna.create_study().ask(), fixed=space.baselines()["narrow_untied"]).config
    run_proxy(cfg, make_recipe(8), corpus)  # warm-up, as in the sequential bare runs
    _POOL.update(corpus=corpus, recipe=make_recipe(steps))


def _pool_run(alloc: dict) -> tuple[float, float]:
    from npas import run_proxy

    t, c = time.perf_counter(), time.process_time()
    run_proxy(ArchConfig.from_dict(alloc), _POOL["recipe"], _POOL["corpus"])
    return time.perf_counter() - t, time.process_time() - c


def bare_pairs(allocs: list[dict], steps: int) -> tuple[list[float], float]:
    """The same trials bare in 2 plain processes at once (no Ray, no driver): per-trial wall times and
    the makespan, to tell the slowdown two trials cause each other on 2 cores from what Ray adds."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(WORKERS, mp_context=mp.get_context("spawn"), initializer=_pool_init,
                             initargs=(steps,)) as pool:
        list(pool.map(time.sleep, [0.5] * WORKERS))  # both workers initialised and warm before timing
        t = time.perf_counter()
        out = list(pool.map(_pool_run, allocs))
        makespan = time.perf_counter() - t
    return [w for w, _ in out], makespan


def _ray_task_cold() -> float:
    t = time.perf_counter()
    import torch  # noqa: F401

    from npas import load_corpus

    load_corpus(None)
    return time.perf_counter() - t


def ray_probe() -> dict[str, float]:
    """ray.init as npas does it, a first task on a fresh worker importing what the trainable imports,
    a warm round trip, and ray.shutdown: the fixed costs of the Ray layer, apart from Tune."""
    t = time.perf_counter()
    import ray

    out = {"import ray": time.perf_counter() - t}
    from npas.service.execution.session import init_ray

    t = time.perf_counter()
    init_ray(None, num_cpus=WORKERS)  # as `npas search` starts an embedded Ray (workers preload torch)
    out["ray.init"] = time.perf_counter() - t
    task = ray.remote(num_cpus=1)(_ray_task_cold)
    t = time.perf_counter()
    inner = max(ray.get([task.remote() for _ in range(WORKERS)]))
    out["2 fresh workers: start + import torch/npas + corpus"] = time.perf_counter() - t
    out["  of which imports + corpus inside the worker"] = inner
    t = time.perf_counter()
    ray.get(task.remote())
    out["warm task round trip"] = time.perf_counter() - t
    t = time.perf_counter()
    ray.shutdown()
    out["ray.shutdown"] = time.perf_counter() - t
    return out


def secs(a: datetime.datetime, b: datetime.datetime) -> float:
    return (b - a).total_seconds()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4 trials of ~3 s: a smoke run")
    ap.add_argument("--trials", type=int, default=None, help="trials in the search (default 8, quick 4)")
    ap.add_argument("--trial-seconds", type=float, default=None, help="bare seconds per trial (default 15, quick 3)")
    ap.add_argument("--steps", type=int, default=None, help="recipe steps (default: calibrated to --trial-seconds)")
    ap.add_argument("--no-profile", action="store_true", help="skip the Ray probe and searcher timing (full mode runs them)")
    ap.add_argument("--pairs", action="store_true",
                    help="also run the trials bare 2 at a time in plain processes (no Ray): +sum(bare)/2 seconds")
    args = ap.parse_args(argv)
    n = args.trials or (4 if args.quick else 8)
    target_s = args.trial_seconds or (3.0 if args.quick else 15.0)
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    from npas import load_corpus, run_proxy
    from npas.allocation.space_parser import parse_space

    load0 = os.getloadavg()[0]
    corpus = load_corpus(None)
    space = parse_space(SPACE_TEXT, "orchestration.yaml").bind(vocab_size=corpus.vocab_size)
    ref_cfg = space.sample(optuna.create_study().ask(), fixed=space.baselines()["narrow_untied"]).config
    if args.steps:
        steps, per_step = args.steps, float("nan")
        run_proxy(ref_cfg, make_recipe(8), corpus)  # warm-up
    else:
        steps, per_step = calibrate(ref_cfg, corpus, target_s, 12 if args.quick else 40)
    recipe = make_recipe(steps)

    print("npas bench: orchestration overhead of `npas search` (Ray Tune, 2 workers, SQLite) vs its trials run bare")
    print(f"load average {load0:.2f} on {os.cpu_count()} cores (a shared machine: absolute times drift with other jobs)")
    print(f"space: taper-only, fixed FLOPs (d_model 64, 4 layers, d_ff 256); recipe: {steps} steps x batch {BATCH} x "
          f"seq {SEQ_LEN}, threads=1, no early stop ({1e3 * per_step:.1f} ms/step calibrated)")

    with tempfile.TemporaryDirectory(prefix="npas-orch-") as d:
        tmp = Path(d)
        space_path, recipe_path = tmp / "space.yaml", tmp / "recipe.yaml"
        space_path.write_text(SPACE_TEXT)
        recipe_path.write_text(recipe.to_yaml())
        wall, launched, exited, stderr, tree_cpu = run_cli(space_path, recipe_path, n, tmp)
        rows = read_trials(f"sqlite:///{tmp}/x.db")
        if len(rows) != n:
            print(f"expected {n} completed trials in the study, found {len(rows)}")
            return 1
        # bare: the same allocations, in-process, one after another
        for r in rows:
            t, c = time.perf_counter(), time.process_time()
            res = run_proxy(r.cfg, recipe, corpus)
            r.bare_s, r.bare_cpu_s = time.perf_counter() - t, time.process_time() - c
            r.bare_loss = float(res.val_loss) if res.val_loss is not None else float("nan")
        profile = not args.quick and not args.no_profile
        if args.pairs:
            pair_walls, pair_makespan = bare_pairs([r.cfg.to_dict() for r in rows], steps)
        if profile:
            probe = ray_probe()
            proxy = {"status": "ok", "val_loss": rows[0].val_loss, "wall_s": rows[0].wall_s, "curve": []}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Optuna: "Heartbeat of storage is supposed to be used with ..."
                ask_ms, tell_ms, tune_import_s = searcher_cost(space, recipe, corpus, tmp, n, proxy)
        load1 = os.getloadavg()[0]

    bare = [r.bare_s for r in rows]
    ideal = sum(bare) / WORKERS
    ratio = wall / ideal
    m = re.search(LOG_CREATED, stderr)
    created = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f") if m else None
    first_ask = min(r.start for r in rows)
    last_tell = max(r.end for r in rows)
    startup, search_phase, teardown = secs(launched, first_ask), secs(first_ask, last_tell), secs(last_tell, exited)
    ray_start = secs(created, first_ask) if created else float("nan")
    pre_ray = secs(launched, created) if created else float("nan")
    slowdown = (sum(r.wall_s for r in rows) - sum(bare)) / WORKERS
    rest = search_phase - sum(r.wall_s for r in rows) / WORKERS
    first_two = sorted(rows, key=lambda r: r.start)[:WORKERS]
    cold = statistics.mean(secs(r.start, r.end) - r.wall_s for r in first_two)
    later = [secs(r.start, r.end) - r.wall_s for r in rows if r.number not in {f.number for f in first_two}]
    same_loss = all(abs(r.bare_loss - r.val_loss) <= 1e-4 * max(1.0, abs(r.val_loss)) for r in rows)

    print(f"\n{'trial':>5} {'baseline':<14}{'ask s':>7}{'tell s':>8}{'span s':>8}{'worker s':>10}{'bare s':>8}"
          f"{'slowdown':>10}{'overhead s':>12}")
    for r in rows:
        span = secs(r.start, r.end)
        print(f"{r.number:>5} {r.baseline or '-':<14}{secs(launched, r.start):>7.1f}{secs(launched, r.end):>8.1f}"
              f"{span:>8.2f}{r.wall_s:>10.2f}{r.bare_s:>8.2f}{r.wall_s / r.bare_s:>9.2f}x{span - r.wall_s:>12.2f}")
    print("(ask/tell: seconds after launch; worker s: proxy.wall_s in the Ray worker; overhead: span - worker s)")

    cpu_share = sum(r.bare_cpu_s for r in rows) / sum(bare)
    print(f"\nbare: {n} trials, mean {statistics.mean(bare):.2f} s/trial (min {min(bare):.2f}, max {max(bare):.2f}), "
          f"sum {sum(bare):.1f} s; CPU/wall {cpu_share:.2f} (1.00 = an uncontended core); "
          f"same val_loss as the search: {'yes' if same_loss else 'NO'}")
    print(f"under the search: mean worker wall_s {statistics.mean(r.wall_s for r in rows):.2f} s/trial = "
          f"{statistics.mean(r.wall_s for r in rows) / statistics.mean(bare):.2f}x bare")
    print(f"ideal wall: {ideal:.1f} s (sum of bare / {WORKERS} workers)")
    print(f"measured wall: {wall:.1f} s (npas search as a subprocess, launch to exit)")
    target = target_for(target_s)
    verdict = "PASS" if ratio <= target else "MISS"
    print(f"ratio: measured {wall:.1f} s / ideal {ideal:.1f} s = {ratio:.2f}x (target <= {target:.2f}x for "
          f"{target_s:g} s trials) {verdict}")
    if tree_cpu:
        print(f"cpu ratio: search process tree {sum(tree_cpu.values()):.1f} CPU s / bare trials "
              f"{sum(r.bare_cpu_s for r in rows):.1f} CPU s = "
              f"{sum(tree_cpu.values()) / sum(r.bare_cpu_s for r in rows):.2f}x (robust to other jobs; see below)")
    print(f"ray start-up: {ray_start:.1f} s = {100 * ray_start / wall:.0f}% of measured wall "
          f"(study created -> first trial asked: ray.init + Tune set-up)")
    print("\nwhere the measured wall goes:")
    parts = [
        ("interpreter, imports, corpus (launch -> study created)", pre_ray),
        ("Ray start-up and Tune set-up (study created -> first ask)", ray_start),
        (f"trials at ideal speed (sum bare / {WORKERS})", ideal),
        (f"trials slower under concurrency ((sum worker - sum bare) / {WORKERS})", slowdown),
        ("worker start, dispatch, idle slots (rest of first ask -> last tell)", rest),
        ("teardown (last tell -> exit: Tune/Ray shutdown, front)", teardown),
    ]
    for label, v in parts:
        print(f"  {label:<72}{v:>7.1f} s {100 * v / wall:>4.0f}%")
    print(f"  {'(launch -> first ask, in all)':<72}{startup:>7.1f} s")
    print(f"per-trial overhead (span - worker wall_s): first trial on each worker {cold:.2f} s "
          f"(actor start, torch import, corpus); later trials median "
          f"{statistics.median(later) if later else float('nan'):.2f} s")
    if tree_cpu:
        bare_cpu = sum(r.bare_cpu_s for r in rows)
        total = sum(tree_cpu.values())
        print("\nCPU seconds of the search's process tree (robust to other jobs, unlike wall time): "
              + ", ".join(f"{k} {v:.1f}" for k, v in sorted(tree_cpu.items())) + f"; total {total:.1f} s")
        print(f"  vs the bare trials' CPU {bare_cpu:.1f} s: {total / bare_cpu:.2f}x; extra {total - bare_cpu:.1f} CPU s "
              f"= {(total - bare_cpu) / WORKERS:.1f} s of wall on {WORKERS} cores if nothing else ran")
    print(f"bare ms/step: {1e3 * per_step:.1f} calibrating before the search (incl. build, short run) vs "
          f"{1e3 * statistics.mean(bare) / steps:.1f} after it (drift shows how the machine's load moved)")
    if args.pairs or profile:
        print("\nprofile (separate measurements after the search, same machine):")
    if args.pairs:
        print(f"  2 bare trials at once in plain processes (no Ray): mean {statistics.mean(pair_walls):.2f} s/trial = "
              f"{statistics.mean(pair_walls) / statistics.mean(bare):.2f}x sequential bare; makespan "
              f"{pair_makespan:.1f} s = {pair_makespan / ideal:.2f}x ideal")
        print(f"  measured wall / plain 2-process makespan = {wall / pair_makespan:.2f}x; worker wall_s under Ray / "
              f"plain 2-process = {statistics.mean(r.wall_s for r in rows) / statistics.mean(pair_walls):.2f}x")
    if profile:
        print(f"  searcher per trial (NpasSearcher on SQLite, no Ray): suggest {ask_ms:.1f} ms, on_trial_complete "
              f"{tell_ms:.1f} ms (median); importing ray.tune + npas.service.search.searcher {tune_import_s:.1f} s")
        for label, v in probe.items():
            print(f"  ray probe: {label:<56}{v:>6.2f} s")
    print(f"load average {load0:.2f} -> {load1:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
