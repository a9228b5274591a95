"""The experiments harness's run store: records read back identically from legacy files and from the
compacted JSON Lines, and compaction is idempotent and safe beside a legacy writer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from experiments.harness import store
from tests.conftest import ROOT

A = "arm-s0-0123456789.json"
B = "arm-s1-0123456789.json"
C = "arm-s0-abcdefabcd.json"


def _write(folder: Path, name: str, doc: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(doc, indent=1) + "\n")
    return folder / name


def test_compacted_records_read_back_exactly_and_compaction_is_idempotent(tmp_path: Path):
    docs = {A: {"val_loss": 1.2345678901234567, "nan": float("nan")}, B: {"val_loss": 2.5}, C: {"steps": [1, 2]}}
    for name, doc in docs.items():
        _write(tmp_path, name, doc)
    _write(tmp_path, "report.json", {"not": "a run"})  # a report beside the runs is never folded
    before = {n: store.load(tmp_path / n) for n in docs}
    assert store.compact(tmp_path) == (3, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json", "runs-0123456789.jsonl", "runs-abcdefabcd.jsonl"]
    after = {n: store.load(tmp_path / n) for n in docs}
    assert json.dumps(after, sort_keys=True) == json.dumps(before, sort_keys=True)  # NaN included, floats exact
    assert all(store.exists(tmp_path / n) for n in docs) and not store.exists(tmp_path / "arm-s9-0123456789.json")
    text = (tmp_path / "runs-0123456789.jsonl").read_text()
    assert store.compact(tmp_path) == (0, 3)
    assert (tmp_path / "runs-0123456789.jsonl").read_text() == text


def test_a_legacy_writer_beside_the_compacted_store_is_read_and_folded(tmp_path: Path):
    _write(tmp_path, A, {"val_loss": 1.0})
    store.compact(tmp_path)
    _write(tmp_path, B, {"val_loss": 2.0})  # an older checkout's bench keeps writing one file per run
    assert store.names(tmp_path) == [A, B] and store.load(tmp_path / B) == {"val_loss": 2.0}
    _write(tmp_path, A, {"val_loss": 0.5})  # a rewrite wins over the compacted record
    assert store.load(tmp_path / A) == {"val_loss": 0.5}
    assert store.compact(tmp_path) == (2, 2)
    assert store.load(tmp_path / A) == {"val_loss": 0.5} and store.load(tmp_path / B) == {"val_loss": 2.0}
    assert [p.name for p in tmp_path.iterdir()] == ["runs-0123456789.jsonl"]
    store.forget(tmp_path / A)
    assert store.names(tmp_path) == [B]


def test_save_appends_a_run_that_survives_a_cut_short_write_and_compacts(tmp_path: Path):
    _write(tmp_path, A, {"val_loss": 9.0})  # a stale legacy record must not shadow the new one
    store.save(tmp_path / A, {"val_loss": 1.0})
    store.save(tmp_path / B, {"val_loss": 2.0, "path": Path("x")})  # written as the legacy writer did (default=str)
    assert [p.name for p in tmp_path.iterdir()] == ["runs-0123456789.jsonl"]
    with open(tmp_path / "runs-0123456789.jsonl", "a") as f:
        f.write('{"key": "arm-s2-0123456789.json", "rec')  # a kill mid-write: that run just trains again
    assert store.names(tmp_path) == [A, B] and store.load(tmp_path / B) == {"val_loss": 2.0, "path": "x"}
    store.save(tmp_path / "arm-s3-0123456789.json", {"val_loss": 3.0})  # the next write after it
    assert store.load(tmp_path / "arm-s3-0123456789.json") == {"val_loss": 3.0}
    store.save(tmp_path / "report.json", {"a": 1})  # not a run: its own file, as before
    assert json.loads((tmp_path / "report.json").read_text()) == {"a": 1}


def test_compact_command_names_a_bad_experiment_in_one_line():
    proc = subprocess.run([sys.executable, "-m", "experiments.harness", "compact", "nope"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "error: unknown experiment 'nope'; choose one of " + ", ".join(store.EXPERIMENTS)]
