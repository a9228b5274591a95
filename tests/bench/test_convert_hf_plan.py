"""`bench/convert.py --hf --plan` (issue 37, item 6) prints the run's plan without training anything."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import ROOT


def test_hf_plan_names_the_arms_the_rate_location_and_the_cost():
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "convert.py"), "--hf", "--plan", "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    m = re.search(r"cycle\+lora8@0\.5x: [\d,]+ params \((0\.\d+)x\)", out)
    assert m and abs(float(m[1]) - 0.5) <= 0.01, out
    assert "LlamaForCausalLM" in out and "scratch at equal total steps" in out and "located rate" in out
    m = re.search(r"dense ([\d,]+) \+ grids ([\d,]+) \+ seeds ([\d,]+) = ([\d,]+)", out)
    parts = [int(x.replace(",", "")) for x in m.groups()]
    assert parts[0] + parts[1] + parts[2] == parts[3]
