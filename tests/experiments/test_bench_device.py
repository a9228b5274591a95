"""The GPU path of the benches, exercised on the CPU: experiments/device.py's export -> run -> collect round
trip on tiny specs, and benchmarks/gpu_efficiency.py's code path and its re-check of a saved H200 run."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.conftest import ROOT


def _bench(*args: str, timeout: int = 300) -> str:
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.slow  # a bench run that trains in a subprocess
def test_device_runner_trains_specs_writes_bench_records_and_respects_the_deadline(tmp_path: Path):
    sys.path.insert(0, str(ROOT / "experiments"))
    try:
        import lr_transfer
    finally:
        sys.path.remove(str(ROOT / "experiments"))
    specs = lr_transfer.device_specs()
    assert len(specs) == len({s["dest"] for s in specs}) > 100  # one record file per run, none shared
    tiny = []
    for s in specs[:3]:
        r = s["recipe"]
        r.update(steps=3, eval_every=3, warmup_steps=1, eval_batches=1, batch_size=2)
        tiny.append({**s, "group": "lr_transfer", "dest": f"out/{Path(s['dest']).name}"})
    tiny[2]["est_s"] = 1e6  # a run that cannot end before the deadline is never started
    jobs = tmp_path / "jobs.json"
    jobs.write_text(json.dumps(tiny))
    out = _bench("experiments/device.py", "run", str(jobs), "--out", str(tmp_path / "o"), "--deadline-s", "120",
                 "--workers", "lr_transfer=1")
    assert "lr_transfer: 2 ran (0 failed), 1 not started" in out, out
    with tarfile.open(tmp_path / "o" / "results.tar.gz") as t:
        names = sorted(m.name for m in t.getmembers() if m.isfile())
        rec = json.loads(t.extractfile(names[0]).read())
    assert names == sorted(f"results/out/{Path(s['dest']).name}" for s in tiny[:2])
    # a record is the bench's own: its meta (arm, lr, seed, code version) plus what the run measured
    assert {k: rec[k] for k in tiny[0]["meta"]} in [s["meta"] for s in tiny[:2]]
    assert rec["status"] == "ok" and rec["steps"] == 3 and rec["device"] == "cpu"


@pytest.mark.slow  # a bench run that trains in a subprocess
def test_gpu_efficiency_runs_its_code_path_on_cpu_and_rechecks_the_saved_h200_run():
    out = _bench("benchmarks/gpu_efficiency.py", "--cpu-smoke")
    row = json.loads(out.strip().splitlines()[-1])
    assert row["name"] == "smoke" and row["tokens_per_s"] > 0 and math.isfinite(row["final_loss"])
    assert row["tflops"] == row["tokens_per_s"] * row["train_flops_per_token"] / 1e12
    saved = ROOT / "benchmarks" / "results" / "gpu_efficiency_h200.json"
    out = _bench("benchmarks/gpu_efficiency.py", "--recheck", str(saved))
    rows = json.loads(saved.read_text())["rows"]
    m = re.search(r"at d_model >= 512: worst (\d+)% off (PASS|MISS)", out)
    assert m, out
    ratios = [float(x) for x in re.findall(r"estimate now +[\d.]+ GiB \(x([\d.]+);", out)]
    assert len(ratios) == len([r for r in rows if "error" not in r])
    big = [x for x, r in zip(ratios, [r for r in rows if "error" not in r], strict=True) if r["chassis"]["d_model"] >= 512]
    assert abs(int(m[1]) - 100 * max(abs(x - 1) for x in big)) < 1.5  # the verdict is of the printed ratios
    assert m[2] == ("PASS" if max(abs(x - 1) for x in big) <= 0.25 else "MISS")


@pytest.mark.slow  # a bench script in a subprocess (imports torch and the bench)
def test_evidence_export_lists_missing_runs_as_specs_and_writes_no_report(tmp_path: Path):
    import os

    specs = tmp_path / "specs.jsonl"
    out = tmp_path / "out"
    env = {**os.environ, "NPAS_EVIDENCE_EXPORT": str(specs), "NPAS_EVIDENCE_DEVICE": "cuda"}
    proc = subprocess.run([sys.executable, "experiments/evidence/taper.py", "--out", str(out), "--fig-dir", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [json.loads(x) for x in specs.read_text().splitlines()]
    # 4 arms x 5 seeds plus each arm's 3-point learning-rate check on seed 99
    assert len(lines) == 4 * 5 + 4 * 3
    assert {s["meta"]["seed"] for s in lines} == {0, 1, 2, 3, 4, 99}
    assert all(s["dest"].startswith("experiments/evidence/results/runs/") and "-cuda-" in s["dest"] for s in lines)
    assert not list(out.iterdir())  # nothing trained, so no report or figure was written


def test_run_pool_starts_only_what_fits_in_order_and_saves_each_record_in_this_process(tmp_path: Path):
    """The CPU benches' one training loop: a job that does not fit the box gives way to the ones behind
    it, every finished job is saved here (a closure over this process's list works), in one process and
    on spawned ones; write_record leaves only the whole record, never its temporary file."""
    from experiments.device import write_record
    from experiments.harness.pool import run_pool

    for workers in (1, 2):
        saved: list[tuple[int, int]] = []
        ran = run_pool([-3, -100, -2], abs, lambda j: (j,), lambda j, r, saved=saved: saved.append((j, r)), workers,
                       fits=lambda j: j != -100)
        assert ran == 2 and sorted(saved) == [(-3, 3), (-2, 2)], (workers, saved)
        if workers == 1:
            assert saved == [(-3, 3), (-2, 2)]  # in order
    write_record(tmp_path / "a" / "r.json", {"val_loss": 1.5})
    assert json.loads((tmp_path / "a" / "r.json").read_text()) == {"val_loss": 1.5}
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["r.json"]
