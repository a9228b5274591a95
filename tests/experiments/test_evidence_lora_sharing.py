"""experiments/evidence/lora_sharing.py: the grid fixed in its docstring (each shared arm at P/4 and P/8 of private
LoRA's relaxation parameters), its --plan under the 10 core-hour cap, and a --quick smoke run."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

MODULES = ("common", "report", "runs", "stats", "lora_sharing")


@pytest.fixture
def script(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "experiments" / "evidence"))
    for name in MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield importlib.import_module("lora_sharing")
    for name in MODULES:
        sys.modules.pop(name, None)


def test_each_shared_arm_stores_its_fraction_of_private_loras_relaxation(script):
    from npas.allocation.lora_sharing import relaxation_params

    configs, P = script.arms(script.common.FULL_CHASSIS, quick=False)
    assert P == 147_456  # rank 16 on q, k, v, o (64 + 64 each) and up, down (64 + 256) at 8 positions
    assert len(configs) == 12 and script.FRACTIONS == (4, 8)
    for k in script.FRACTIONS:
        for mode in ("private", "shared_a", "vera", "shards", "shards+private"):
            cfg = configs[f"{mode} P/{k}"]
            stored = relaxation_params(cfg)[0]
            assert 0.8 * P / k <= stored <= P / k, (mode, k, stored)  # at most P/k, the closest the free size allows
            assert cfg.lora_sharing == ("private" if mode == "private" else mode.split("+")[0])
        assert configs[f"shards+private P/{k}"].lora_private_fraction == 1 / 8
        assert configs[f"shards P/{k}"].lora_private_fraction == 0.0
    claims = script.claims(list(configs), "private r=16")
    assert len(claims) == 2 * (4 * 3 + 1)  # each shared arm vs private r=16, private P/k and r=0; shards +- private


@pytest.mark.slow  # two bench script runs in subprocesses
def test_plan_fits_the_cap_and_quick_runs(tmp_path):
    path = str(ROOT / "experiments" / "evidence" / "lora_sharing.py")
    plan = subprocess.run([sys.executable, path, "--plan", "--out", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    hours = [float(h) for h in re.findall(r"~([\d.]+) CPU-hours", plan.stdout)]
    # the plan within the cap, and with two edge steps per arm (the rows so far moved one or two; the
    # printed worst case is four)
    assert len(hours) == 2 and hours[0] + hours[1] / 2 <= 10, plan.stdout
    assert "claim" not in plan.stdout and not list(tmp_path.iterdir())
    quick = subprocess.run([sys.executable, path, "--quick", "--out", str(tmp_path)], cwd=ROOT, capture_output=True,
                           text=True, timeout=600)
    assert quick.returncode == 0, quick.stdout + quick.stderr
    assert re.search(r"^claim private shards beat pure sharing .*: shards\+private P/8 - shards P/8 ", quick.stdout,
                     re.M)
    assert (tmp_path / "lora_sharing_quick.json").is_file()
