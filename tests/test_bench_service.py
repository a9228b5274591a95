"""The service benches run: each `--quick` run exits 0 and prints its ratio lines. Speed is not asserted."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from .conftest import ROOT

NUM = r"[\d.]+"


def run_quick(bench: str, timeout: int) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / bench), "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout


def assert_lines(out: str, patterns: list[str]) -> None:
    for pattern in patterns:
        assert re.search(pattern, out, re.MULTILINE), f"no line matching {pattern!r} in:\n{out}"


@pytest.mark.slow  # a real `npas search` subprocess with Ray start-up: ~1 minute on a loaded 2-core machine
def test_orchestration_quick_prints_its_ratio():
    out = run_quick("orchestration.py", timeout=300)
    assert_lines(out, [
        rf"^bare: 4 trials, mean {NUM} s/trial .* same val_loss as the search: yes$",
        rf"^ideal wall: {NUM} s \(sum of bare / 2 workers\)$",
        rf"^measured wall: {NUM} s ",
        rf"^ratio: measured {NUM} s / ideal {NUM} s = {NUM}x \(target <= 1\.10x\) (PASS|MISS)$",
        rf"^ray start-up: {NUM} s = \d+% of measured wall",
    ])


def test_search_efficiency_quick_prints_its_ratio():
    out = run_quick("search_efficiency.py", timeout=120)
    assert "SYNTHETIC" in out  # the output says that nothing was trained
    assert_lines(out, [
        rf"^tpe@12: +HV {NUM} ± {NUM}$",
        rf"^random@12: +HV {NUM} ± {NUM}$",
        rf"^random@36: +HV {NUM} ± {NUM}$",
        rf"^ratio: tpe@12 / random@36 = {NUM}x .*\(target >= 1\.00x\) (PASS|MISS)$",
    ])
