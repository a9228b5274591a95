"""experiments/evidence/hashed.py: the full grid's plan (arms, accounting, CPU-hours against the cap) without
training, and the --quick smoke run's claim lines (form only: 60 steps rank nothing)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "experiments" / "evidence" / "hashed.py"
ROW = r"^{name}\s+([\d,]+)\s+([\d,]+|-)\s+([\d,]+|-)\s+([\d,]+|-)\s+([\d,]+)\s+([\d.]+)\s"


def _num(s: str) -> int:
    return int(s.replace(",", ""))


@pytest.mark.slow  # a bench script in a subprocess (imports torch and the bench)
def test_full_plan_fits_every_arm_to_its_budget_states_flops_and_stays_under_the_cap(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--plan", "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    ref = re.search(ROW.format(name="1x dense"), out, re.M)
    assert ref, out
    for budget in ("1x", "0.5x", "0.25x", "0.1x"):
        m = re.search(ROW.format(name=re.escape(f"{budget} hashed")), out, re.M)
        assert m, out
        assert _num(m[1]) == _num(m[2]), m[0]  # hashed meets its budget to the element
        assert m[6] == "1.000", m[0]  # the reference's shapes
        if budget == "1x":
            assert _num(m[1]) == _num(ref[1])
            assert "1x hashed        one array of 393,216 elements, 1.00 weights read" in out  # collision-free
        else:
            narrow = re.search(ROW.format(name=re.escape(f"{budget} narrow_untied")), out, re.M)
            pools = re.search(ROW.format(name=re.escape(f"{budget} pools_tmix")), out, re.M)
            assert 0 <= _num(narrow[3]) < _num(narrow[4]) and float(narrow[6]) < 0.6  # within a step; fewer FLOPs
            assert 0 <= _num(pools[3]) <= 0.02 * _num(pools[2]) and pools[6] == "1.000"
    m = re.search(r"^plan: 11 arms x \(5 seeds \+ 3 rate-check runs, more where an edge moves\) ~([\d.]+) CPU-hours "
                  r"\(cap 10\): within the cap",
                  out, re.M)
    assert m and 1.0 < float(m[1]) < 10.0, out
    assert re.search(r"^plan: 88 runs, ", out, re.M), out


@pytest.mark.slow
def test_quick_prints_every_claim_line_and_writes_report_and_figure_form_only(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--seeds", "2", "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert len(re.findall(r"^claim C1 at [\d.]+x hashed beats narrow_untied: .* over 2 seed\(s\): ", out, re.M)) == 3
    assert len(re.findall(r"^claim C2 ", out, re.M)) == 3 and len(re.findall(r"^claim C3 ", out, re.M)) == 3
    assert re.search(r"^claim C4 the collision-free 1x point is within 0.02 nats of dense: 1x hashed - 1x dense "
                     r"[+-]\d\.\d{4} \[", out, re.M), out
    assert re.search(r"^row claim \(hashed beats narrow untied .*\): (NOT )?REPRODUCED$", out, re.M), out
    assert (tmp_path / "hashed_quick.json").is_file() and (tmp_path / "hashed_quick.png").is_file()
