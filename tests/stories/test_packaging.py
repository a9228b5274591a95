"""What a user gets from `pip install .`: the shipped spaces and recipes, by name, from any directory.

The YAML files live once, inside the package; the checkout's `search_spaces/` and `trials/*.yaml`
are links to them. These tests fail if the two drift apart, if `pyproject.toml` lists package data
that does not exist or misses a shipped file, and (slow) if a non-editable install in a fresh venv,
used from an unrelated directory, cannot search a shipped space by name and export the result.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

from npas.builtin import shipped, shipped_dir, space_path
from npas.training.recipe import resolve_recipe
from tests.conftest import ROOT

DOCUMENTED_RECIPES = ("smoke", "proxy", "long")
DOCUMENTED_SPACES = ("full", "taper", "recursive_lora", "shapeshifter")


@pytest.mark.parametrize("kind, repo_dir", [("spaces", "search_spaces"), ("recipes", "trials")])
def test_repo_paths_are_the_package_files_not_copies(kind, repo_dir):
    in_repo = {p.stem: p for p in (ROOT / repo_dir).glob("*.yaml")}
    in_package = shipped(kind)
    assert set(in_repo) == set(in_package), f"{repo_dir}/ and npas/builtin/{kind}/ list different files"
    for name, path in in_repo.items():
        assert path.samefile(in_package[name]), f"{repo_dir}/{path.name} is a copy, not the shipped file"


def test_documented_names_are_shipped():
    assert set(DOCUMENTED_RECIPES) <= set(shipped("recipes"))
    assert set(DOCUMENTED_SPACES) <= set(shipped("spaces"))


def test_package_data_patterns_match_and_cover_the_shipped_files():
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = conf["tool"]["setuptools"]["package-data"]["npas"]
    pkg = ROOT / "npas"
    covered = set()
    for pattern in patterns:
        matched = set(pkg.glob(pattern))
        assert matched, f"package-data pattern {pattern!r} matches no file"
        covered |= matched
    data = {p for p in (pkg / "builtin").rglob("*") if p.is_file() and p.suffix != ".py" and "__pycache__" not in p.parts}
    assert data <= covered, f"shipped files missing from package-data: {sorted(map(str, data - covered))}"


def test_names_resolve_from_an_unrelated_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in DOCUMENTED_RECIPES:
        assert resolve_recipe(name).parent == shipped_dir("recipes")
    for name in DOCUMENTED_SPACES:
        assert space_path(name).parent == shipped_dir("spaces")
    (tmp_path / "trials").mkdir()  # a project's own recipe of the same name wins
    (tmp_path / "trials" / "smoke.yaml").write_text("steps: 5\nwarmup_steps: 1\neval_every: 5\n")
    assert resolve_recipe("smoke") == tmp_path / "trials" / "smoke.yaml"


def _copy_source(dst: Path) -> Path:
    """The checkout's files (symlinks kept), without build outputs, databases or virtualenvs."""
    ignore = shutil.ignore_patterns(".git", ".venv", "venv", "build", "dist", "*.egg-info", "__pycache__", "runs",
                                    "*.db", ".hypothesis", ".pytest_cache", ".ruff_cache", "dashboards", "results")
    shutil.copytree(ROOT, dst, symlinks=True, ignore=ignore)
    return dst


@pytest.mark.slow  # a wheel build, a fresh venv and a real 2-trial search with Ray: about a minute
def test_non_editable_install_runs_search_and_export_from_anywhere(tmp_path):
    src = _copy_source(tmp_path / "src")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    # reuse this environment's installed dependencies (torch, ray, optuna ...) without its npas: a
    # plain path in a .pth is added to sys.path, and the .pth files there (the editable npas) are not run
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "parent.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "NPAS_STORAGE")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", str(src)],
                   check=True, env=env, cwd=tmp_path, timeout=600)
    shutil.rmtree(src)  # nothing may be read from the source tree after installing

    work = tmp_path / "elsewhere"
    work.mkdir()

    def npas(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(venv / "bin" / "npas"), *args], cwd=work, env=env, capture_output=True,
                              text=True, timeout=900)

    where = subprocess.run([str(py), "-c", "import npas; print(npas.__file__)"], cwd=work, env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert where.startswith(str(site)), f"npas imported from {where}, not the installed copy"
    url = f"sqlite:///{work}/npas.db"
    out = npas("search", "full", "--recipe", "smoke", "--trials", "1", "--workers", "1", "--study", "pkg",
               "--storage", url)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    out = npas("export", "pkg", "--storage", url, "--out", "best.yaml")
    assert out.returncode == 0, out.stderr[-3000:]
    assert (work / "best.yaml").is_file()
    out = npas("count", "taper")  # a shipped space by name
    assert out.returncode == 0 and "reference model of space 'taper'" in out.stdout, out.stderr[-3000:]
    for recipe in ("proxy", "long"):  # the other documented recipes, by name
        out = npas("train", "best.yaml", "--recipe", recipe, "--steps", "2", "--out", f"model-{recipe}")
        assert out.returncode == 0, out.stderr[-3000:]
        assert (work / f"model-{recipe}" / "model.safetensors").is_file()
