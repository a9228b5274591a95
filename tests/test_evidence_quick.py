"""The evidence scripts run: taper and low_budget in --quick mode exit 0 and print their tables.

Losses are not asserted (a 60-step smoke run ranks nothing), so the claim lines (`REPRODUCED` or
`NOT REPRODUCED`, `best at k/3 budgets`) are checked for their form only, and the test names say so.
The analytic accounting is asserted: every arm of a comparison prints the same stored-parameter count
(taper) or one within the fit's step of the budget (low_budget).
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from .conftest import ROOT

NUM = r"[\d,]+"
LOSS = r"\d\.\d{4} ± (?:-|\d\.\d{4})"


def _run(script: str, tmp_path) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "evidence" / script), "--quick", "--out",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.slow
def test_taper_quick_arms_store_equal_params_claim_line_form_only(tmp_path):
    out = _run("taper.py", tmp_path)
    for arm in ("uniform", "cosine", "reverse", "hourglass"):
        # accounting row: every arm stores exactly the 1x reference's parameters, at 1.000x its FLOPs
        assert re.search(rf"^{arm}\s+52,640\s+52,640\s+0\s+{NUM}\s+{NUM}\s+1\.000\s", out, re.M), out
        assert re.search(rf"^{arm}\s+52,640\s+1\.000\s+{LOSS}", out, re.M), out
    assert re.search(r"^claim cosine < uniform < reverse: (NOT )?REPRODUCED$", out, re.M)
    assert (tmp_path / "taper_quick.json").is_file() and (tmp_path / "taper_quick.png").is_file()


@pytest.mark.slow
def test_low_budget_quick_arms_fill_the_budget_claim_line_form_only(tmp_path):
    out = _run("low_budget.py", tmp_path)
    for budget in ("0.1x", "0.25x", "0.5x"):
        assert re.search(rf"^budget {re.escape(budget)} \({NUM} params\):$", out, re.M), out
        for arm in ("narrow_untied", "full_tying", "cycle_tying", "pools_tmix"):
            m = re.search(rf"^{re.escape(budget)} {arm}\s+({NUM})\s+({NUM})\s+({NUM})\s+({NUM})\s", out, re.M)
            assert m, f"no accounting row for {budget} {arm}:\n{out}"
            stored, cap, gap, step = (int(g.replace(",", "")) for g in m.groups())
            assert stored <= cap and gap == cap - stored and gap < max(step, 1), m.group(0)
            assert re.search(rf"^{re.escape(budget)} {arm}\s+{NUM}\s+\d\.\d{{3}}\s+{LOSS}", out, re.M), out
    assert re.search(r"^pools_tmix best at \d/3 budgets", out, re.M)


@pytest.mark.slow
def test_expert_pool_quick_arms_match_activated_flops_claim_line_form_only(tmp_path):
    out = _run("expert_pool.py", tmp_path)
    for arm in ("dense", "per_layer_moe", "global_pool_50", "global_pool_67"):
        # every arm activates the dense MLP's width per token: FLOPs within the routers' few % of dense
        m = re.search(rf"^{arm}\s+{NUM}\s+-\s+-\s+-\s+{NUM}\s+(\d\.\d{{3}})\s", out, re.M)
        assert m and 1.0 <= float(m[1]) < 1.05, out
        assert re.search(rf"^{arm}\s+{NUM}\s+\d\.\d{{3}}\s+{LOSS}", out, re.M), out
    m = re.search(r"^global_pool_50\s+([\d,]+)\s+(\d\.\d{3})\s", out, re.M)
    assert m and 0.5 <= float(m[2]) < 0.55, out  # half the per-layer experts, plus wider routers
    assert re.search(r"^claim global pool matches or beats per-layer MoE at equal activated FLOPs: "
                     r"(NOT )?REPRODUCED$", out, re.M)
    assert (tmp_path / "expert_pool_quick.json").is_file()
