"""The bench harness's run store and public-API rule: records read back identically from legacy files
and from the compacted JSON Lines, compaction is idempotent and safe beside a legacy writer, and no
bench imports an internal npas module."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import npas
from bench.harness import store
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
    proc = subprocess.run([sys.executable, "-m", "bench.harness", "compact", "nope"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "error: unknown experiment 'nope'; choose one of " + ", ".join(store.EXPERIMENTS)]


def npas_imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of every npas import in ``path``, a function-level one too: ``("npas", name)`` for
    ``from npas import name`` and ``npas.name``, ``(module, "")`` for an import of a module below npas."""
    found: list[tuple[str, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "npas":
            found += [("npas", a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("npas."):
            found.append((node.module, ""))
        elif isinstance(node, ast.Import):
            found += [(a.name, "") for a in node.names if a.name.startswith("npas.")]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "npas":
            found.append(("npas", node.attr))
    return found


def documented_modules() -> set[str]:
    """The npas modules docs/architecture.md names, each under its package's heading."""
    from tests.docs.test_architecture import sections

    return {f"{package}.{name}" for package, names in sections().items() for name in names} | set(sections())


def test_benches_import_only_public_names_and_documented_modules():
    """A bench uses `npas.__all__` (what a user scripts with) or imports a module docs/architecture.md names:
    a module's move then shows in that page and here, never as a bench broken at run time."""
    public, documented = set(npas.__all__), documented_modules()
    bad = sorted({f"{p.relative_to(ROOT).as_posix()}: {module}{'.' + name if name else ''}"
                  for p in sorted((ROOT / "bench").rglob("*.py")) for module, name in npas_imports(p)
                  if (module == "npas" and name not in public and name != "__version__")
                  or (module != "npas" and module not in documented)})
    assert bad == [], "not in npas.__all__ nor a module named in docs/architecture.md:\n" + "\n".join(bad)
    assert len(documented) > 80 and ("npas", "Recipe") in npas_imports(ROOT / "bench" / "harness" / "recipes.py")
