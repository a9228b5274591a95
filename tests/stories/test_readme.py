"""The README's set-up commands and CI must agree: CI runs exactly the README's test command.

The README's other blocks, and docs/'s, are run by the tests tests/docs/blocks.py names (RUNS)."""

from __future__ import annotations

from tests.conftest import ROOT


def first_code_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("```", 2)[1]
    return [line for line in block.splitlines()[1:] if line.strip()]


def test_readme_opens_with_exactly_two_commands():
    lines = first_code_block()
    assert len(lines) == 2
    assert "npas " in lines[0] and "pytest" in lines[1]


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert first_code_block()[1] in ci


# ---- .ci/run, driven with stand-ins for python3, pip, pytest and PostgreSQL's tools ------------------
STUBS = {
    "python3": 'if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin" && : > "$3/bin/activate"; fi',
    "pip": 'echo "pip $*" >> "$CALLS"',
    # the slow tier (`-m slow`) answers FAKE_OUT_SLOW / FAKE_RC_SLOW where set, else what the fast one does
    "python": 'echo "python $*" >> "$CALLS"; case "$*" in *"-m slow"*) printf "%b" "${FAKE_OUT_SLOW-${FAKE_OUT:-}}";'
              ' exit "${FAKE_RC_SLOW-${FAKE_RC:-0}}";; esac; printf "%b" "${FAKE_OUT:-}"; exit "${FAKE_RC:-0}"',
    "pg_isready": 'exit "${FAKE_PG:-0}"',
    "pg_ctlcluster": "exit 1",
    "apt-get": "exit 1",
}


def run_ci(tmp_path, *, ci: bool, pg: int = 0, rc: int = 0, out: str = "", slow_rc: int | None = None,
           slow_out: str | None = None):
    import shutil
    import subprocess

    repo, bin_ = tmp_path / "repo", tmp_path / "bin"
    (repo / ".ci").mkdir(parents=True)
    shutil.copy(ROOT / ".ci" / "run", repo / ".ci" / "run")
    bin_.mkdir()
    for name, body in STUBS.items():
        (bin_ / name).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (bin_ / name).chmod(0o755)
    env = {"PATH": f"{bin_}:/usr/bin:/bin", "CALLS": str(tmp_path / "calls"), "FAKE_PG": str(pg),
           "FAKE_RC": str(rc), "FAKE_OUT": out, "HOME": str(tmp_path), **({"CI": "true"} if ci else {}),
           **({"FAKE_RC_SLOW": str(slow_rc)} if slow_rc is not None else {}),
           **({"FAKE_OUT_SLOW": slow_out} if slow_out is not None else {})}
    proc = subprocess.run(["bash", str(repo / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=120)
    calls = (tmp_path / "calls").read_text() if (tmp_path / "calls").exists() else ""
    return proc, calls


def test_ci_fails_on_unreachable_postgresql_before_running_tests(tmp_path):
    proc, calls = run_ci(tmp_path, ci=True, pg=1)
    assert proc.returncode == 1
    assert "PostgreSQL is not reachable" in proc.stderr
    assert "pytest" not in calls


def test_outside_ci_unreachable_postgresql_only_warns(tmp_path):
    proc, calls = run_ci(tmp_path, ci=False, pg=1)
    assert proc.returncode == 0, proc.stderr
    assert "warning: PostgreSQL is not reachable" in proc.stderr and "python -m pytest -q" in calls


def test_ci_passes_pytest_failures_through_and_refuses_no_tests(tmp_path):
    assert run_ci(tmp_path / "a", ci=True, rc=1)[0].returncode == 1
    assert run_ci(tmp_path / "b", ci=True, rc=2)[0].returncode == 2
    proc, _ = run_ci(tmp_path / "c", ci=True, rc=5)
    assert proc.returncode == 1 and "collected no tests" in proc.stdout + proc.stderr
    assert run_ci(tmp_path / "d", ci=True, rc=0)[0].returncode == 0


def test_ci_fails_when_a_service_test_was_skipped(tmp_path):
    skipped = "SKIPPED [1] tests/service/test_search.py:42: no PostgreSQL server reachable at postgresql://x\\n"
    assert run_ci(tmp_path / "a", ci=True, out=skipped)[0].returncode == 1
    assert run_ci(tmp_path / "b", ci=False, out=skipped)[0].returncode == 0


def test_chromium_test_does_not_skip_in_ci(tmp_path):
    """With the browser absent, the page test skips outside CI and runs (and would fail) under CI=true."""
    import os
    import subprocess
    import sys

    probe = ("import pathlib; real = pathlib.Path.exists\n"
             "pathlib.Path.exists = lambda p: False if str(p) == '/usr/bin/chromium' else real(p)\n"
             "import tests.presentation.test_dashboard as t; print(t.needs_chromium.args[0])")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    for ci, expect in ((None, "True"), ("true", "False")):
        run_env = {**env, **({"CI": ci} if ci else {})}
        out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=run_env, capture_output=True, text=True,
                             timeout=120)
        assert out.stdout.strip() == expect, out.stderr[-2000:]
