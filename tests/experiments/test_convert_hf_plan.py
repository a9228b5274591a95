"""`experiments/convert.py --hf --plan` (issue 37, item 6) prints the run's plan without training anything."""

from __future__ import annotations

import math
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.slow  # an experiment script in a subprocess (imports torch and the experiment)
def test_hf_plan_names_the_arms_the_rate_location_and_the_cost():
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "convert.py"), "--hf", "--plan", "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    m = re.search(r"cycle\+lora8@0\.5x: [\d,]+ params \((0\.\d+)x\)", out)
    assert m and abs(float(m[1]) - 0.5) <= 0.01, out
    assert "LlamaForCausalLM" in out and "scratch at equal total steps" in out and "located rate" in out
    m = re.search(r"dense ([\d,]+) \+ grids ([\d,]+) \+ seeds ([\d,]+) = ([\d,]+)", out)
    parts = [int(x.replace(",", "")) for x in m.groups()]
    assert parts[0] + parts[1] + parts[2] == parts[3]
    # quick without --out caches in a fresh temporary folder: nothing cached, one grid run per arm due, the
    # dense model first (experiments/convert_hf.py: due_jobs; tests/experiments/test_convert_hf_cache.py)
    assert re.search(r"cache \S+ \(code version [0-9a-f]{10}\): 0 runs cached, the dense model not cached; due now: "
                     r"3 runs and the dense model", out), out


@pytest.mark.parametrize("name", ["quick", "full"])
def test_the_printed_step_counts_are_what_the_rate_location_spends(name, capsys):
    """The plan's totals against `locate_and_repeat` run on a stub trainer that counts steps: a loss
    falling with the rate always picks the grid's edge (every arm extends MAX_EXTEND times: "at most");
    a shallow bowl at the recipe's rate trains the whole grid and never extends (the plain total); a
    steep one stops going up once x2 is clearly worse, so x4 is never trained."""
    from experiments.convert_hf import (
        GRID,
        MAX_EXTEND,
        arm_steps,
        cycle_lora,
        hf_modes,
        locate_and_repeat,
        print_hf_plan,
    )

    mode = hf_modes()[name]
    print_hf_plan(mode, cycle_lora(mode.chassis))
    m = re.search(r"dense ([\d,]+) \+ grids ([\d,]+) \+ seeds ([\d,]+) = ([\d,]+) \(at most ([\d,]+) with",
                  capsys.readouterr().out)
    dense, grids, seeds, total, at_most = (int(x.replace(",", "")) for x in m.groups())
    per_arm = sum(arm_steps(mode).values())
    assert dense == mode.dense.steps
    assert total == dense + (len(GRID) + len(mode.seeds) - 1) * per_arm
    assert at_most == total + MAX_EXTEND * per_arm

    def spent(loss) -> int:
        used = []

        def train(arm, mult, seed):
            used.append(arm_steps(mode)[arm])
            return loss(mult)

        located, _ = locate_and_repeat(mode, train)
        return dense + sum(used), located

    edge, located = spent(lambda mult: -mult)  # ever higher rates win: the edge, extended each time
    assert edge == at_most and all(not interior for _, interior in located.values())
    shallow, located = spent(lambda mult: 0.01 * math.log(mult) ** 2)  # x2 within the noise of x1
    assert shallow == total and all(best == 1.0 and interior for best, interior in located.values())
    steep, located = spent(lambda mult: math.log(mult) ** 2)
    assert steep == total - per_arm and all(best == 1.0 and interior for best, interior in located.values())
    if name == "full":  # issue 37's full run: 2,000 dense steps, then proxy (400) and 2,400-step arms
        assert (total, at_most) == (30_800, 37_200)
