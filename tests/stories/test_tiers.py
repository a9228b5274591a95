"""The two test tiers and the isolation of every test from a contributor's own Ray cluster.

The README's test command runs the fast tier (pyproject's addopts deselect `slow`); `.ci/run` then
runs `python -m pytest -q -m slow`. Both tiers' exit statuses and skips decide CI. No test may join a
Ray cluster that happens to be up on the machine: each `ray.init` in tests and bench code names its
address, and tests/conftest.py drops RAY_ADDRESS for the session.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
import tomllib

import pytest

from tests.conftest import ROOT, needs
from tests.presentation.test_dashboard import CHROMIUM
from tests.stories.test_readme import first_code_block, run_ci


# ---- the mechanism: addopts, the README, .ci/run ---------------------------------------------------
def addopts() -> list[str]:
    return shlex.split(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"])


def test_the_readme_command_runs_the_fast_tier_and_the_readme_says_how_to_run_the_slow_one():
    opts = addopts()
    assert opts[opts.index("-m") + 1] == "not slow"  # the default selection is the fast tier
    assert first_code_block()[1].endswith("python -m pytest -q")  # no -m of its own: the default holds
    assert "`python -m pytest -q -m slow`" in (ROOT / "README.md").read_text()


def test_ci_runs_the_slow_tier_after_the_fast_one(tmp_path):
    proc, calls = run_ci(tmp_path, ci=False)
    assert proc.returncode == 0, proc.stderr
    pytest_calls = [line for line in calls.splitlines() if line.startswith("python -m pytest")]
    assert pytest_calls == ["python -m pytest -q", "python -m pytest -q -m slow"]


def test_ci_fails_when_the_slow_tier_fails_or_collects_nothing(tmp_path):
    # CI=false: the same exit handling, on machines without the Chromium that CI=true requires
    proc, _ = run_ci(tmp_path / "a", ci=False, slow_rc=1)
    assert proc.returncode == 1 and "slow tests failed (exit 1)" in proc.stderr
    assert run_ci(tmp_path / "b", ci=False, slow_rc=2)[0].returncode == 2
    proc, _ = run_ci(tmp_path / "c", ci=False, slow_rc=5)
    assert proc.returncode == 1 and "slow tier collected no tests" in proc.stderr
    proc, calls = run_ci(tmp_path / "d", ci=False, rc=1, slow_rc=0)  # a failing fast tier stops the run
    assert proc.returncode == 1 and "-m slow" not in calls


@needs(CHROMIUM.exists(), f"{CHROMIUM} is absent, and .ci/run under CI=true stops before the tests without it")
def test_ci_fails_when_a_service_test_of_the_slow_tier_was_skipped(tmp_path):
    skipped = "SKIPPED [1] tests/service/test_faults.py:84: no PostgreSQL server at postgresql://x\\n"
    proc, _ = run_ci(tmp_path / "a", ci=True, slow_out=skipped)
    assert proc.returncode == 1 and "slow tier" in proc.stderr
    assert run_ci(tmp_path / "b", ci=False, slow_out=skipped)[0].returncode == 0
    browser = "SKIPPED [1] tests/presentation/test_dashboard.py:300: /usr/bin/chromium is absent\\n"
    proc, _ = run_ci(tmp_path / "c", ci=True, slow_out=browser)
    assert proc.returncode == 1 and "slow tier" in proc.stderr


def collected(*args: str) -> set[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return {line for line in out.stdout.splitlines() if line.startswith("tests/") and "::" in line}  # node ids, not warnings


@pytest.mark.slow  # three collections of the whole suite: about a minute
def test_the_two_tiers_partition_the_suite():
    fast, slow, every = collected(), collected("-m", "slow"), collected("-m", "")
    assert fast and slow and not fast & slow
    assert fast | slow == every


# ---- isolation from a Ray cluster of the contributor's --------------------------------------------
def _ray_init_calls(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, source) of every call of Ray's init in the module, also inside string literals (code that
    a test runs in a subprocess)."""
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "init" \
                and getattr(node.func.value, "id", "") == "ray":
            calls.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            calls += [(node.lineno, m.group(0)) for m in re.finditer(r"ray\.init\([^()]*\)", node.value)]
    return calls


def test_every_ray_init_in_tests_benchmarks_and_experiments_names_its_address():
    """Without an address, `ray.init` joins the cluster `ray start --head` left on the machine (and with
    num_cpus it then refuses: "When connecting to an existing cluster, num_cpus ... must not be provided")."""
    seen, bare = 0, []
    for path in sorted(p for d in ("tests", "benchmarks", "experiments") for p in (ROOT / d).rglob("*.py")):
        for line, call in _ray_init_calls(ast.parse(path.read_text())):
            seen += 1
            if "address" not in call:
                bare.append(f"{path.relative_to(ROOT)}:{line}: {call}")
    assert seen >= 3  # the scan finds the calls it is about
    assert not bare, "\n".join(bare)


def test_conftest_drops_ray_address_for_the_session():
    probe = "import os, tests.conftest; print(os.environ.get('RAY_ADDRESS'))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "RAY_ADDRESS": "127.0.0.1:6379"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "None"


@pytest.mark.slow  # a Ray head and a pytest run with a real search: about a minute
@pytest.mark.xdist_group("ray_cluster")  # a cluster of its own: one at a time, see pyproject
def test_tests_pass_with_a_contributors_cluster_up(tmp_path):
    """`ray start --head` as a contributor runs it (default settings, the cluster recorded in Ray's temp
    dir, where Ray's init finds it when given no address) and RAY_ADDRESS exported for it: the dashboard tests, whose
    shared search once joined that cluster and failed, still pass, and so does a search on the session's Ray."""
    import shutil
    import tempfile

    from tests.service.test_faults import free_port, ray_node, stop_node, wait_until

    tmp = tempfile.mkdtemp(prefix="npr-", dir="/tmp")  # short: Ray's unix socket paths have a length limit
    ray = shutil.which("ray", path=str(os.path.dirname(sys.executable)))
    # RAY_TMPDIR: this test's cluster record and sessions stay out of /tmp/ray, where others would find them
    env = {**os.environ, "RAY_TMPDIR": tmp}
    token = {**env, "RAY_AUTH_MODE": "token"}  # `ray start` turns token auth on; its own clients need it said
    port = free_port()
    head = ray_node("--head", "--port", str(port), "--include-dashboard", "false", env=token,
                    log=tmp_path / "head.log", temp_dir=os.path.join(tmp, "ray"))
    try:
        address, record = f"127.0.0.1:{port}", os.path.join(tmp, "ray", "ray_current_cluster")
        wait_until(lambda: subprocess.run([ray, "status", "--address", address], env=token,
                                          capture_output=True).returncode == 0, 180, "the Ray head")
        wait_until(lambda: os.path.exists(record) or head.poll() is not None, 120, "the head's cluster record")
        assert os.path.exists(record), (tmp_path / "head.log").read_text()[-3000:]  # what a bare ray.init() reads
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                              "tests/presentation/test_dashboard.py", "tests/service/test_search.py",
                              "-k", "pareto_info_points or taper_and_curves or failed_trials_are_recorded"],
                             cwd=ROOT, env={**env, "RAY_ADDRESS": address}, capture_output=True, text=True,
                             timeout=600)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
        assert "3 passed" in out.stdout  # the search test starts the session's own Ray (address="local")
    finally:
        stop_node(head)
        shutil.rmtree(tmp, ignore_errors=True)
