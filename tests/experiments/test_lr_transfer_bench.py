"""experiments/lr_transfer.py: --quick runs every arm under both parameterizations, caches each run,
resumes without retraining, and prints the side-by-side optima and the target line; --plan estimates."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from experiments.harness import store
from tests.conftest import ROOT

ARMS = ("reference", "untied_L1", "untied_L4", "untied_d8", "untied_d32", "tied_full", "tied_cycle2",
        "pools_tmix", "lora_r2", "lora_r4")


def _bench(*args: str) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "lr_transfer.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.slow  # a bench --quick sweep that trains in a subprocess
def test_quick_sweep_caches_resumes_and_reports(tmp_path):
    out = _bench("--quick", "--out", str(tmp_path))
    runs = [tmp_path / n for n in store.names(tmp_path)]  # the run cache (experiments/harness/store.py)
    # 9 arms x 2 parameterizations x 3 lrs, plus the reference once (fair == uniform for it)
    assert len(runs) == 9 * 2 * 3 + 3
    rec = store.load(runs[0])
    assert {"arm", "lr", "seed", "parameterization", "code_version", "val_loss", "allocation"} <= set(rec)
    for arm in ARMS:
        for par in ("fair", "uniform"):
            assert re.search(rf"^{arm}\s+{par}\s+((\d\.\d{{4}}|div)\s+){{3}}\[0\]$", out, re.M), (arm, par, out)
        assert re.search(rf"^{arm}\s+[\d.]+\s+[+-]\d+\s+[+-][\d.]+\s+[\d.]+\s+[+-]\d+\s+[+-][\d.]+$", out, re.M), out
    assert re.search(r"^target: every optimum within one grid step of the reference's under fair: (PASS|MISS) "
                     r"\(\d+/10 arms within one step, 10 arms in all\)$", out, re.M), out
    assert re.search(r"^old \(uniform\) already met it: (yes|no) ", out, re.M), out
    implied = out.split("implied sharing exponent", 1)[1]
    for arm in ("tied_full", "tied_cycle2", "pools_tmix", "lora_r2", "lora_r4"):  # every shared arm, no untied one
        assert re.search(rf"^{arm}\s+[+-]\d\.\d\d\s+[+-]\d\.\d\d\s+([+-]\d+\.\d\d|- \(the rule moved it)", implied, re.M), implied
    assert "untied_" not in implied.split("target:")[0]
    # a second run trains nothing: every finished run is read back from the cache
    again = _bench("--quick", "--out", str(tmp_path))
    assert "runs: 0 to train, 57 cached" in again
    assert again.split("mean final val loss")[1] == out.split("mean final val loss")[1]


@pytest.mark.slow  # a bench script in a subprocess (imports torch and the bench)
def test_plan_estimates_cpu_hours_without_training(tmp_path):
    out = _bench("--plan", "--out", str(tmp_path))
    m = re.search(r"^plan: (\d+) runs x ([\d,]+) tokens = \d+M tokens -> ~([\d.]+) CPU-hours", out, re.M)
    assert m, out
    assert int(m[1]) == 9 * 2 * 6 * 2 + 6 * 2 and float(m[3]) > 0.1  # 6-point grid, 2 seeds
    assert not store.names(tmp_path)


def test_implied_sharing_exponent_puts_the_optimum_on_the_reference_by_linear_interpolation():
    sys.path.insert(0, str(ROOT / "experiments"))
    try:
        import lr_transfer
    finally:
        sys.path.remove(str(ROOT / "experiments"))
    # H200 run: tied_full's optimum sat 0.66 step under the reference's without the rule and 0.81 over it
    # with k**-0.5, so the exponent that lands it on the reference is 0.5 * 0.66 / 1.47
    assert abs(lr_transfer.implied_exponent(-0.66, 0.81, 0.5) - 0.5 * 0.66 / 1.47) < 1e-12
    assert lr_transfer.implied_exponent(0.0, 1.0, 0.5) == 0.0  # already on the reference without the rule
    assert lr_transfer.implied_exponent(-1.0, 0.0, 0.5) == 0.5  # the rule exactly right
    assert lr_transfer.implied_exponent(0.9, 0.87, 0.5) is None  # the rule barely moved it: no estimate
