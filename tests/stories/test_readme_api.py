"""The README's Python API block runs as written: load a space, count its reference, plan and run a
4-trial search, export the knee and build its model (the block's own assert checks the count)."""

from __future__ import annotations

import contextlib
import io

import pytest

from tests.conftest import ROOT
from tests.docs.blocks import README_API, block


@pytest.mark.slow  # a real 4-trial search on Ray
def test_the_readme_python_api_searches_exports_and_builds(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "search_spaces").symlink_to(ROOT / "search_spaces")
    monkeypatch.setenv("NPAS_STORAGE", f"sqlite:///{tmp_path / 'npas.db'}")
    scope: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block(README_API), "README.md", "exec"), scope)  # noqa: S102 - the project's own README
    study, best = scope["study"], scope["best"]
    assert study.study_name == "api" and len(study.trials) >= 4
    assert best.hash in {t.user_attrs.get("allocation_hash") for t in study.best_trials}  # a front point
    stored, budget = map(int, out.getvalue().split()[:2])
    assert stored == 1_600_128 and budget == 400_032  # full.yaml's reference and its 0.25x budget
