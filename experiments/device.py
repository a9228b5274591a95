"""Run benches' prepared training jobs on a lent GPU machine, and bring the results home.

A GPU machine is lent for minutes, starts bare (no optuna, no ray, another torch) and returns at most
a few files. So the work is split in three:

    python experiments/device.py export [--groups a,b]   # here: every missing run of the GPU-ready benches,
                                                   # one JSON spec each, into experiments/results/device/jobs.json
    python experiments/device.py run JOBS --out DIR --deadline-s S [--gpu-workers a=4,b=4]
                                                   # there: train them in a process pool per group (all
                                                   # on the one GPU), stop starting runs that would end
                                                   # past S, tar what finished into DIR/results.tar.gz
    python experiments/device.py collect DIR             # here: unpack the records into each bench's cache

A spec names everything a run needs (allocation JSON, recipe, reference chassis, whether to score the
test split) and where its record goes (``dest``, the same cache file the bench itself would write),
so ``--report`` of each bench reads device runs like its own. Records carry ``device``; each bench
keeps GPU runs in a cache folder of their own (``*_h200``), never mixed with CPU ones.

Groups (each bench module exposes ``device_specs() -> list[dict]``):
    lr_transfer      experiments/lr_transfer.py, every arm x grid x seed, both parameterizations
    proxy_fidelity   experiments/proxy_fidelity.py, proxy and 4x-longer runs, both parameterizations
    taper_scale      experiments/evidence/taper_scale.py, taper arms at d_model 256 x 8 layers, 5 seeds
    evidence         every training run of experiments/evidence/{EVIDENCE} (each script run with
                     NPAS_EVIDENCE_EXPORT, which makes it list its missing runs instead of training)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing as mp
import os
import statistics
import sys
import tarfile
import tempfile
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from experiments.harness import store  # noqa: E402
from experiments.harness.jobs import run_spec  # noqa: E402  (the one training function)
from experiments.harness.version import commit  # noqa: E402

JOBS = ROOT / "experiments" / "results" / "device" / "jobs.json"
GROUPS = {"lr_transfer": "experiments/lr_transfer.py", "proxy_fidelity": "experiments/proxy_fidelity.py",
          "taper_scale": "experiments/evidence/taper_scale.py", "evidence": "experiments/evidence/runs.py"}
EVIDENCE = ("taper", "relaxed", "low_budget", "high_budget", "atoms")


# ------------------------------------------------------------------------------------------ export
def load_module(rel: str) -> Any:
    path = ROOT / rel
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = mod  # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


def make_spec(dest: Path, config: Any, recipe: Any, reference: Any, *, test: bool, priority: int, meta: dict,
              est_s: float | None = None) -> dict:
    """One run as the spec `run_spec` trains: allocation, recipe, reference chassis, whether to score the
    test split, and its record's place (``dest``, the bench's own cache file, relative to the checkout),
    so every bench's ``device_specs`` writes the same fields. ``est_s`` (seconds on the GPU, for the
    deadline) defaults to a per-step cost growing with depth."""
    if est_s is None:
        est_s = recipe.steps * (0.002 + 0.0006 * config.chassis.n_layers)
    return {"dest": str(dest.relative_to(ROOT)), "config": config.to_json(), "recipe": recipe.to_dict(),
            "reference": dict(reference.__dict__), "test": test, "priority": priority, "est_s": est_s, "meta": meta}


def export(groups: list[str], out: Path) -> list[dict]:
    specs: list[dict] = []
    for g in groups:
        mine = evidence_specs() if g == "evidence" else load_module(GROUPS[g]).device_specs()
        missing = [s for s in mine if not store.exists(ROOT / s["dest"])]
        for s in missing:
            s["group"] = g
            s["commit"] = commit()  # the lent machine's copy of the tree has no history: its records say this
        print(f"  {g}: {len(mine)} runs, {len(missing)} not cached yet", flush=True)
        specs.extend(missing)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(specs))
    print(f"wrote {len(specs)} specs to {out} ({out.stat().st_size / 1e6:.1f} MB)")
    return specs


def evidence_specs() -> list[dict]:
    """The evidence scripts' missing runs: each script, run with NPAS_EVIDENCE_EXPORT, appends one spec
    a line (experiments/evidence/runs.py) and trains nothing."""
    import subprocess

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "specs.jsonl"
        env = {**os.environ, "NPAS_EVIDENCE_EXPORT": str(out), "NPAS_EVIDENCE_DEVICE": "cuda"}
        for name in EVIDENCE:
            subprocess.run([sys.executable, str(ROOT / "experiments" / "evidence" / f"{name}.py")], cwd=ROOT, env=env,
                           check=True, capture_output=True, text=True)
        lines = out.read_text().splitlines() if out.exists() else []
    specs = {}
    for i, line in enumerate(lines):
        s = json.loads(line)
        specs.setdefault(s["dest"], {**s, "priority": i})  # an arm shared by two experiments runs once
    return list(specs.values())


# ------------------------------------------------------------------------------------------ run (there)
def write_record(path: Path, doc: dict) -> None:
    """Write one finished run's JSON record atomically: a kill never leaves half a record, so a
    resumed bench trusts every record file it finds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    tmp.replace(path)


class Pool:
    """One group's runs: at most ``workers`` in flight, priority order, none started that would end
    past the deadline at this group's observed pace (the spec's ``est_s`` until a run finishes)."""

    def __init__(self, group: str, specs: list[dict], workers: int, results: Path, deadline: float) -> None:
        self.group, self.workers, self.results, self.deadline = group, workers, results, deadline
        self.queue = sorted(specs, key=lambda s: (s.get("priority", 0), s.get("est_s", 0)))
        self.walls: list[float] = []
        self.done = self.failed = 0
        self.skipped = 0

    def eta(self, spec: dict) -> float:
        if not self.walls:
            return float(spec.get("est_s", 0))
        scale = statistics.median(w / max(1e-9, e) for w, e in self.walls)
        return scale * float(spec.get("est_s", 1)) * 1.1

    def next(self) -> dict | None:
        for i, s in enumerate(self.queue):
            if time.time() + self.eta(s) <= self.deadline:
                return self.queue.pop(i)
        return None

    def save(self, spec: dict, rec: dict) -> None:
        write_record(self.results / spec["dest"], rec)
        self.done += 1
        self.failed += rec["status"] == "failed"
        if rec.get("wall_s"):
            self.walls.append((rec["wall_s"], float(spec.get("est_s", 1)) or 1.0))
        print(f"[{self.group}] {self.done} done ({self.failed} failed), {len(self.queue)} queued | "
              f"{spec['dest'].rsplit('/', 1)[-1][:60]} {rec['status']} val {rec.get('val_loss')} "
              f"{rec.get('wall_s', 0):.1f} s", flush=True)

    def run(self) -> None:
        if not self.queue:
            return
        with ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn")) as pool:
            live: dict[Future, dict] = {}
            while self.queue or live:
                while self.queue and len(live) < self.workers and (s := self.next()) is not None:
                    live[pool.submit(run_spec, s)] = s
                if not live:
                    break
                done, _ = wait(list(live), timeout=5, return_when=FIRST_COMPLETED)
                for fut in done:
                    s = live.pop(fut)
                    try:
                        self.save(s, fut.result())
                    except Exception as err:  # a dead worker process: record and go on
                        self.save(s, {**s["meta"], "status": "failed", "failure_reason": repr(err)[:300]})
                if time.time() > self.deadline + 60:  # runs far past the box are abandoned
                    print(f"[{self.group}] abandoning {len(live)} runs past the deadline", flush=True)
                    for p in list(getattr(pool, "_processes", {}).values()):  # no public kill in the API
                        p.kill()
                    break
        self.skipped = len(self.queue)


def tar_results(results: Path, out: Path) -> None:
    tmp = out / "results.tar.gz.tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(results, arcname="results")
    tmp.replace(out / "results.tar.gz")


def run(jobs: Path, out: Path, deadline_s: float, workers: dict[str, int], pre: list[str]) -> int:
    t0 = time.time()
    specs = json.loads(jobs.read_text())
    out.mkdir(parents=True, exist_ok=True)
    results = Path(tempfile.mkdtemp(prefix="npas-device-results-"))  # this run's records only
    for cmd in pre:  # exclusive-GPU measurements first (benchmarks/gpu_efficiency.py)
        print(f"[device] {cmd}", flush=True)
        os.system(cmd)  # noqa: S605 - the operator's own command line
    deadline = t0 + deadline_s
    print(f"[device] {len(specs)} specs, {deadline - time.time():.0f} s left for them", flush=True)
    pools = [Pool(g, [s for s in specs if s["group"] == g], workers.get(g, 2), results, deadline)
             for g in sorted({s["group"] for s in specs})]
    threads = [threading.Thread(target=p.run, name=p.group) for p in pools]
    for th in threads:
        th.start()
    while any(th.is_alive() for th in threads):
        time.sleep(20)
        tar_results(results, out)  # what finished survives a kill of this command
    tar_results(results, out)
    for p in pools:
        print(f"[device] {p.group}: {p.done} ran ({p.failed} failed), {p.skipped} not started", flush=True)
    print(f"[device] wall {time.time() - t0:.0f} s", flush=True)
    return 0


# ------------------------------------------------------------------------------------------ collect
def collect(folder: Path) -> int:
    tar = folder / "results.tar.gz"
    n, touched = 0, set()
    with tarfile.open(tar) as t:
        for m in t.getmembers():
            if not m.isfile() or not m.name.endswith(".json"):
                continue
            rel = Path(m.name).relative_to("results")
            if ".." in rel.parts or rel.is_absolute():
                continue
            dest = ROOT / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(t.extractfile(m).read())
            touched.add(dest.parent)
            n += 1
    print(f"collected {n} records from {tar}")
    for folder in sorted(touched & set(store.folders())):  # an experiment's cache: fold into its JSON Lines
        folded, total = store.compact(folder)
        print(f"  {folder.relative_to(ROOT)}: {folded} folded, {total} runs compacted")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("--groups", default=",".join(GROUPS))
    e.add_argument("--out", type=Path, default=JOBS)
    r = sub.add_parser("run")
    r.add_argument("jobs", type=Path)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--deadline-s", type=float, default=420)
    r.add_argument("--workers", default="", help="group=N,...: processes per group (default 2)")
    r.add_argument("--pre", action="append", default=[], help="a command to run first, alone on the GPU")
    c = sub.add_parser("collect")
    c.add_argument("folder", type=Path)
    a = p.parse_args(argv)
    if a.cmd == "export":
        export([g for g in a.groups.split(",") if g], a.out)
        return 0
    if a.cmd == "run":
        workers = {k: int(v) for k, v in (kv.split("=") for kv in a.workers.split(",") if kv)}
        return run(a.jobs, a.out, a.deadline_s, workers, a.pre)
    return collect(a.folder)


if __name__ == "__main__":
    sys.exit(main())
