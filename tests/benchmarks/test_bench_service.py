"""The service benches run in `--quick` mode. Speed is not asserted (their targets live in benchmarks/), so a
ratio line may say PASS or MISS; what is asserted is what does not depend on the machine's load: the
bare runs reproduce the search's losses, and the search-efficiency verdict agrees with its numbers."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.service.test_search import NEEDS_PG

pytestmark = pytest.mark.slow  # every test runs a bench --quick (training, searches) in a subprocess
NUM = r"[\d.]+"


def run_quick(bench: str, timeout: int) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / bench), "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout


def assert_lines(out: str, patterns: list[str]) -> None:
    for pattern in patterns:
        assert re.search(pattern, out, re.MULTILINE), f"no line matching {pattern!r} in:\n{out}"


@pytest.mark.slow  # a real `npas search` subprocess with Ray start-up: ~1 minute on a loaded 2-core machine
def test_orchestration_quick_reproduces_losses_and_prints_its_ratio_lines():
    out = run_quick("orchestration.py", timeout=300)
    assert_lines(out, [
        rf"^bare: 4 trials, mean {NUM} s/trial .* same val_loss as the search: yes$",
        rf"^ideal wall: {NUM} s \(sum of bare / 2 workers\)$",
        rf"^measured wall: {NUM} s ",
        rf"^ratio: measured {NUM} s / ideal {NUM} s = {NUM}x \(target <= 1\.20x for 3 s trials\) (PASS|MISS)$",
        rf"^ray start-up: {NUM} s = \d+% of measured wall",
    ])


def test_search_efficiency_quick_verdict_matches_its_hypervolumes():
    out = run_quick("search_efficiency.py", timeout=300)
    assert "SYNTHETIC" in out  # the output says that nothing was trained
    hv = {}
    for arm in ("tpe@12", "random@12", "random@36"):
        m = re.search(rf"^{arm}: +HV ({NUM}) ± {NUM}$", out, re.M)
        assert m, f"no line for {arm}:\n{out}"
        hv[arm] = float(m[1])
        assert 0.0 < hv[arm] <= 1.0  # hypervolume of a front normalised to the unit box
    m = re.search(rf"^ratio: tpe@12 / random@36 = ({NUM})x .*\(target >= ({NUM})x\) (PASS|MISS)$", out, re.M)
    assert m, out
    ratio, target, verdict = float(m[1]), float(m[2]), m[3]
    assert abs(hv["tpe@12"] / hv["random@36"] - ratio) < 0.002  # the printed ratio is of the printed means
    assert verdict == ("PASS" if ratio >= target else "MISS")


def run_bench(bench: str, *args: str, timeout: int) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / bench), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout


def test_driver_scale_prints_bookkeeping_and_sampler_times_and_its_ratio_line():
    """A short run on SQLite (the --quick windows on fewer trials); timing is not asserted."""
    out = run_bench("driver_scale.py", "--quick", "--db", "sqlite", "--samplers", "random", "--trials", "40",
                    "--window", "10", "--per-driver", "0", timeout=300)
    assert "SYNTHETIC" in out
    assert_lines(out, [
        r"^sqlite random: 40 counted trials, \d+ asks \(\d+ infeasible\)",
        rf"^ +trials 1-10: bookkeeping +{NUM} ms CPU \( *{NUM} ms wall\) per ask; sampler +{NUM} ms CPU",
        rf"^ +trials 31-40: bookkeeping +{NUM} ms CPU",
    ])
    m = re.search(rf"^ratio: sqlite random bookkeeping late/early = ({NUM})x .*\(target <= ({NUM})x\) (PASS|MISS)$",
                  out, re.M)
    assert m, out
    assert m[3] == ("PASS" if float(m[1]) <= float(m[2]) else "MISS")


@NEEDS_PG
def test_driver_scale_drivers_sharing_one_postgresql_study_lose_nothing():
    out = run_bench("driver_scale.py", "--db", "postgresql", "--trials", "0", "--drivers", "2", "--per-driver", "8",
                    timeout=300)
    assert_lines(out, [
        r"^2 drivers x 8 trials on one PostgreSQL study",
        r"^  lost 0, counted 16 / target 16, complete 16, duplicate allocations counted 0; "
        r"duplicates that ran concurrently \d+",
        r"^drivers: lost 0, exactly the target, 0 counted duplicates PASS$",
    ])
