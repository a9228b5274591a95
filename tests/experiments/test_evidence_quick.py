"""The evidence scripts run: taper, low_budget and atoms in --quick mode exit 0 and print their tables
(atoms' full-mode plan is checked without training).

Losses are not asserted (a 60-step smoke run ranks nothing), so the claim lines (`REPRODUCED` or
`NOT REPRODUCED`, `best at k/3 budgets`) are checked for their form only, and the test names say so.
The analytic accounting is asserted: every arm of a comparison prints the same stored-parameter count
(taper) or one within the fit's step of the budget (low_budget).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

NUM = r"[\d,]+"
LOSS = r"\d\.\d{4} ± (?:-|\d\.\d{4})"


def _run(script: str, tmp_path) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "evidence" / script), "--quick", "--out",
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


ATOM_ARMS = ("untied", "atoms", "cycle_attn", "sequential_attn")


def _atoms_accounting(out: str) -> dict[str, tuple[int, int]]:
    """arm -> (stored params, attention params) from the script's accounting lines."""
    got = {}
    for arm in ATOM_ARMS:
        stored = re.search(rf"^{arm}\s+({NUM})\s", out, re.M)
        attn = re.search(rf"^\s+{arm}\s+attention params ({NUM}) ", out, re.M)
        assert stored and attn, f"no accounting for {arm}:\n{out}"
        got[arm] = (int(stored.group(1).replace(",", "")), int(attn.group(1).replace(",", "")))
    return got


@pytest.mark.slow  # a bench script in a subprocess (imports torch and the bench)
def test_atoms_full_plan_prints_runs_times_tokens_and_matched_arms_without_training(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "evidence" / "atoms.py"), "--plan", "--out",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    # the report's chassis: 8 layers, K = 3 atoms; 4 arms x 5 seeds of 1000 steps x 48 x 64 tokens
    assert re.search(r"^plan: 4 arms x 5 seeds = 20 runs x 3,072,000 tokens \(1000 steps x 48x64\) = 61,440,000 tokens",
                     out, re.M), out
    acc = _atoms_accounting(out)
    d, L, K = 64, 8, 3
    assert acc["untied"][1] == 4 * L * d * d
    assert acc["atoms"][1] == 4 * K * (d * d + L)  # one dictionary per projection type, L x K coefficients
    for tied in ("cycle_attn", "sequential_attn"):
        assert acc[tied][1] == 4 * K * d * d  # K unique Q/K/V/O sets
        assert 0 <= acc["atoms"][0] - acc[tied][0] < 2 * d * L  # stored params matched within one MLP width step
    assert "claim" not in out and not list(tmp_path.iterdir())  # --plan trains and writes nothing


@pytest.mark.slow
def test_atoms_quick_prints_paired_intervals_and_verdicts_claim_line_form_only(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "evidence" / "atoms.py"), "--quick", "--seeds", "2",
                           "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    acc = _atoms_accounting(out)
    assert acc["cycle_attn"] == acc["sequential_attn"] and acc["atoms"][0] - acc["cycle_attn"][0] == 4 * 2 * 4
    for arm in ATOM_ARMS:
        assert re.search(rf"^{arm}\s+{NUM}\s+{NUM}\s+1\.000\s+{LOSS}", out, re.M), out
    iv = r"Δ [+-]\d\.\d{4} \[[+-]\d\.\d{4}, [+-]\d\.\d{4}\] over 2 seed\(s\): (NOT )?REPRODUCED \(.+\)$"
    assert re.search(rf"^claim atoms reach untied \(Δ < \+0\.02 nats\): {iv}", out, re.M), out
    for tied in ("cycle_attn", "sequential_attn"):
        assert re.search(rf"^claim atoms beat {tied} \(Δ < 0\): {iv}", out, re.M), out
    assert re.search(r"^seed claim \(atoms at K=2 of L=4, 49\.8% fewer attention params\): (NOT )?REPRODUCED$", out, re.M)
    assert (tmp_path / "atoms_quick.json").is_file() and (tmp_path / "atoms_quick.png").is_file()


EVIDENCE_MODULES = ("common", "report", "runs", "searches", "stats", "conversion")


@pytest.fixture
def evidence(monkeypatch):
    """experiments/evidence's modules, imported in-process the way its scripts import them (the folder on
    sys.path, modules by their bare names); sys.path and sys.modules are restored afterwards."""
    import importlib
    import types

    monkeypatch.syspath_prepend(str(ROOT / "experiments" / "evidence"))
    for name in EVIDENCE_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    mods = {name: importlib.import_module(name) for name in EVIDENCE_MODULES}
    yield types.SimpleNamespace(**mods)
    for name in EVIDENCE_MODULES:
        sys.modules.pop(name, None)


@pytest.mark.slow  # two bench script runs in subprocesses
def test_conversion_best_rates_picks_each_arms_optimum_and_refuses_a_partial_check(tmp_path, evidence):
    """--best-rates trains each recursive arm at its own checked optimum, the dense parent at x1 (--lr-factor
    would move the parent too); a check with a missing cell names no optimum."""
    conversion = evidence.conversion
    check = {"converted": {0.5: 1.61, 1.0: 1.62, 2.0: 1.66}, "scratch_lineage": {0.5: 1.70, 1.0: 1.65, 2.0: 1.62}}
    assert conversion.best_factors(check) == {"converted": 0.5, "scratch_lineage": 2.0}
    with pytest.raises(SystemExit, match=r"not cached \(scratch_lineage x2 missing\)"):
        conversion.best_factors({**check, "scratch_lineage": {0.5: 1.70, 1.0: 1.65, 2.0: None}})
    script = str(ROOT / "experiments" / "evidence" / "conversion.py")
    bad = subprocess.run([sys.executable, script, "--best-rates", "--quick", "--out", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "drop --quick" in bad.stderr and not list(tmp_path.iterdir())
    # the committed cache holds the full check: its optima, and a plan that moves only the recursive arms
    plan = subprocess.run([sys.executable, script, "--best-rates", "--plan", "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    m = re.search(r"^each arm at its learning-rate check's optimum \(x the recipe's rate\): dense x1, converted "
                  r"x([\d.]+), scratch_uptrain x([\d.]+), scratch_lineage x([\d.]+)$", plan.stdout, re.M)
    assert m and all(f in ("0.5", "1", "2") for f in m.groups()), plan.stdout
    assert re.search(r"^plan: 20 runs, ", plan.stdout, re.M) and not list(tmp_path.iterdir())


def test_lr_factor_scales_both_rates_renames_the_report_and_does_not_repeat_the_check(tmp_path, capsys, evidence):
    from npas.allocation.config import reference_config

    common, runs = evidence.common, evidence.runs
    plans = {}
    for factor in ("1", "2"):
        args = common.arg_parser("x").parse_args(["--plan", "--lr-factor", factor, "--out", str(tmp_path)])
        setup = common.setup_from(args, "relaxed")
        with pytest.raises(SystemExit):
            runs.run_arms({"a": reference_config(setup.chassis), "b": reference_config(setup.chassis)}, setup)
        plans[factor] = (setup, capsys.readouterr().out)
    base, scaled = plans["1"][0], plans["2"][0]
    assert (base.name, scaled.name) == ("relaxed", "relaxed_lr2")  # a second report, not an overwrite
    assert scaled.recipe.lr == pytest.approx(2 * base.recipe.lr) and scaled.recipe.min_lr == pytest.approx(
        2 * base.recipe.min_lr)
    assert "lr 0.012->0.0012" in plans["2"][1]
    # 2 arms x 5 seeds, plus the 3-point check on seed 99 only at the base rate
    assert re.search(r"^plan: 16 runs,", plans["1"][1], re.M) and re.search(r"^plan: 10 runs,", plans["2"][1], re.M)
    assert not list(tmp_path.iterdir())
    bad = common.arg_parser("x").parse_args(["--lr-factor", "0", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="--lr-factor must be positive"):
        common.setup_from(bad, "relaxed")


def test_lr_bracket_checks_around_the_moved_rate_first_and_needs_lr_factor(tmp_path, capsys, evidence, monkeypatch):
    from npas.allocation.config import reference_config

    common, runs = evidence.common, evidence.runs
    args = common.arg_parser("x").parse_args(["--plan", "--lr-factor", "2", "--lr-bracket", "--out", str(tmp_path)])
    setup = common.setup_from(args, "relaxed")
    seen = []
    monkeypatch.setattr(runs, "run_jobs", lambda jobs, *a, **k: seen.extend(jobs) or [])
    with pytest.raises(SystemExit):
        runs.run_arms({"a": reference_config(setup.chassis)}, setup)
    checks = [j for j in seen if j["recipe"]["seed"] == common.LR_CHECK_SEED]
    # the check brackets x2 (x1, x2, x4 of the recipe's rate), ahead of the 5 reported seeds
    base = common.FULL_RECIPE.lr
    assert sorted(round(j["recipe"]["lr"] / base, 6) for j in checks) == [1.0, 2.0, 4.0]
    assert seen[:3] == checks and len(seen) == 8
    bad = common.arg_parser("x").parse_args(["--lr-bracket", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="give --lr-factor too"):
        common.setup_from(bad, "relaxed")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(("optimum", "tried", "located"), [
    (4.0, [0.5, 1.0, 2.0, 4.0, 8.0], True),  # past the first grid's top: walked up until the loss turned
    (0.25, [0.125, 0.25, 0.5, 1.0, 2.0], True),
    (1.0, [0.5, 1.0, 2.0], True),
    (64.0, [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0], False),  # still falling at the last edge (x32): not located
])
def test_locate_rates_walks_past_an_edge_until_the_loss_turns(evidence, monkeypatch, capsys, optimum, tried, located):
    import math

    from npas.allocation.config import reference_config

    common, runs = evidence.common, evidence.runs
    setup = common.setup_from(common.arg_parser("x").parse_args(["--out", "/tmp"]), "relaxed")
    base = setup.recipe.lr
    ran = []

    def fake(jobs, *a, **k):  # a loss convex in log(rate), lowest at `optimum`
        out = []
        for j in jobs:
            f = j["recipe"]["lr"] / base
            ran.append(round(f, 6))
            out.append({"val_loss": 1.5 + (math.log2(f) - math.log2(optimum)) ** 2})
        return out

    monkeypatch.setattr(runs, "run_jobs", fake)
    rates = runs.locate_rates({"a": reference_config(setup.chassis)}, setup, "v")
    assert rates == {"a": (min(tried, key=lambda f: abs(math.log2(f / optimum))), located)}
    assert sorted(ran) == tried  # each rate trained once


def test_claim_verdicts_need_the_whole_interval_on_the_claims_side(evidence):
    stats = evidence.stats
    from npas.service.study.fidelity import Interval

    run = [{"name": n, "seed": s, "val_loss": v} for n, losses in
           (("a", [1.00, 1.10, 1.20]), ("b", [1.05, 1.16, 1.24])) for s, v in enumerate(losses)]
    iv = stats.paired_interval(run, "a", "b")  # a - b = -0.05, -0.06, -0.04 on the same seeds
    assert iv.n == 3 and iv.value == pytest.approx(-0.05) and iv.high < 0
    assert stats.claim_verdict(iv, "better") == (True, "the interval is below 0")
    assert stats.claim_verdict(iv, "parity")[0]  # better by any amount reaches the reference
    covers = Interval(-0.01, -0.03, 0.01, 3)
    assert stats.claim_verdict(covers, "better") == (False, "the interval covers 0")
    assert stats.claim_verdict(covers, "parity")[0]  # worse by at most 0.01 < the 0.02 margin
    assert stats.claim_verdict(Interval(0.01, -0.01, 0.03, 3), "parity") == (False, "the interval covers +0.02")
    assert stats.claim_verdict(Interval(0.05, 0.03, 0.07, 3), "parity")[1].startswith("contradicted")
    assert not stats.claim_verdict(Interval(-0.5, None, None, 1), "better")[0]  # one seed: no interval, no claim
    assert evidence.report.fmt_interval(iv).startswith("-0.0500 [")


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


@pytest.mark.slow  # a bench script in a subprocess (imports torch and the bench)
@pytest.mark.parametrize("script", ["search_vs_hand.py", "early_stop.py"])
def test_search_experiments_plan_prints_tokens_and_hours_and_writes_nothing(script, tmp_path):
    results = ROOT / "experiments" / "evidence" / "results"
    before = sorted(p.name for p in results.iterdir())
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "evidence" / script), "--plan", "--out",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    m = re.search(r"^plan: .* = ([\d.]+)M tokens.*-> ~([\d.]+) CPU-hours", proc.stdout, re.M)
    assert m and float(m.group(1)) > 0 and float(m.group(2)) > 0, proc.stdout
    assert not list(tmp_path.iterdir()) and sorted(p.name for p in results.iterdir()) == before
    assert "study" not in proc.stdout.split("plan:", 1)[1]  # no search was started


@pytest.mark.slow  # a bench --quick run that trains in a subprocess
def test_arms_trains_only_the_named_arms_and_writes_no_report(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "evidence" / "relaxed.py"), "--quick", "--steps", "4",
                           "--arms", "untied,cycle U=2 r=16", "--out", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[2/2]" in proc.stderr and "[3/" not in proc.stderr  # two arms x one seed, nothing else trained
    table = proc.stdout.split("partial (--arms; no report written)", 1)[1]
    assert re.search(r"^untied\s+1\s+\d\.\d{4}", table, re.M) and re.search(r"^cycle U=2 r=16\s+1\s+\d\.\d{4}", table, re.M)
    assert not list(tmp_path.glob("*.json"))
    bad = subprocess.run([sys.executable, str(ROOT / "experiments" / "evidence" / "relaxed.py"), "--quick", "--arms", "nope",
                          "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "unknown arm(s) ['nope']" in bad.stderr


@pytest.mark.slow
def test_conversion_quick_trains_each_phase_once_and_starts_from_the_dense_weights(tmp_path):
    """conversion.py's phases (dense with saved weights, then converted from them, then both scratch arms)
    train 2 seeds each, once; the recursive arms are one allocation; the converted model, scored before
    any uptraining, is close to the dense model it came from (a model built afresh would sit near ln 68),
    so the uptraining really starts from the converted weights' neighbourhood."""
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "evidence" / "conversion.py"), "--quick", "--seeds",
                           "2", "--steps", "8", "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    rows = {m[1]: (m[2], m[3]) for m in re.finditer(rf"^(\w+)\s+({NUM})\s+-\s+-\s+-\s+{NUM}\s+(\d\.\d{{3}})\s", out, re.M)}
    assert set(rows) == {"dense", "converted", "scratch_uptrain", "scratch_lineage"}, out
    assert rows["converted"] == rows["scratch_uptrain"] == rows["scratch_lineage"] and rows["converted"][1] == "1.000"
    assert "{'dense': 8, 'converted': 10, 'scratch_uptrain': 2, 'scratch_lineage': 10}" in out
    for arm in ("dense", "converted", "scratch_uptrain", "scratch_lineage"):
        assert proc.stderr.count(f"] {arm} seed ") == 2, proc.stderr  # each (arm, seed) trained exactly once
    assert len(re.findall(r"^claim .*: converted - scratch_\w+ [-+]\d\.\d{4} \[.*\] over 2 seed\(s\): "
                          r"(reproduced|contradicted|unresolved)", out, re.M)) == 2, out
    doc = json.loads((tmp_path / "conversion_quick.json").read_text())
    dense = {r["seed"]: r["val_loss"] for r in doc["results"] if r["name"] == "dense"}
    before = {int(k): v for k, v in doc["converted_before_uptraining"].items()}
    assert set(before) == set(dense) == {0, 1}
    assert all(abs(before[s] - dense[s]) < 0.1 < math.log(68) - before[s] for s in before), (before, dense)
    # the worker trained from the converted weights: without them the converted run is scratch_uptrain's
    # run exactly (same allocation, recipe and seed), 2 steps from a fresh init
    conv = {r["seed"]: r["val_loss"] for r in doc["results"] if r["name"] == "converted"}
    scratch = {r["seed"]: r["val_loss"] for r in doc["results"] if r["name"] == "scratch_uptrain"}
    assert all(conv[s] < scratch[s] - 0.2 for s in (0, 1)), (conv, scratch)
    assert (tmp_path / "conversion_quick.png").is_file()
    bad = subprocess.run([sys.executable, str(ROOT / "experiments" / "evidence" / "conversion.py"), "--quick", "--arms",
                          "dense", "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "run it whole" in bad.stderr
    plan = subprocess.run([sys.executable, str(ROOT / "experiments" / "evidence" / "conversion.py"), "--plan", "--out",
                           str(tmp_path / "plan")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    # 5 seeds x 4 arms, plus seed 99's dense model and 3 rates for each recursive arm: one plan for all phases
    assert plan.returncode == 0 and re.search(r"^plan: 30 runs, \d+ cached .*-> ~[\d.]+ CPU-hours", plan.stdout, re.M)
    assert not list((tmp_path / "plan").iterdir()), plan.stdout


@pytest.mark.slow
def test_recursion_plan_fits_the_cap_and_quick_reports_both_rules_claim_line_form_only(tmp_path):
    script = str(ROOT / "experiments" / "evidence" / "recursion.py")
    plan = subprocess.run([sys.executable, script, "--plan", "--out", str(tmp_path / "plan")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    m = re.search(r"^plan: 40 runs, \d+ cached .*-> ~([\d.]+) CPU-hours", plan.stdout, re.M)
    assert m and float(m.group(1)) <= 8.0, plan.stdout  # the cap: <= 8 core-hours
    # equal stored params for the MoR arms and the fixed-depth stack; equal training FLOPs by more steps
    for arm in ("fixed_depth", "mor_equal_tokens", "mor_equal_flops"):
        assert re.search(rf"^{arm}\s+206,336\s+206,336\s+0\s", plan.stdout, re.M), plan.stdout
    assert re.search(r"^mor_equal_flops\s+[\d,]+\s+1,343\s+4\.13M\s+1\.47\s+1\.000$", plan.stdout, re.M), plan.stdout
    assert "claim" not in plan.stdout and not list((tmp_path / "plan").iterdir())
    out = _run("recursion.py", tmp_path)
    assert re.search(r"^mor_equal_flops\s+1\s+\d\.\d{4}\s+\d\.\d{4}\s+[+-]\d\.\d{4}\s+\d\.\d{2}\s", out, re.M), out
    assert len(re.findall(r"^claim .*: unresolved \(too few seeds\)$", out, re.M)) == 3, out
    assert (tmp_path / "recursion_quick.json").is_file()
