"""The shared bench plumbing of issue 32: the plan's cost table (``experiments/harness/report.py``), a worker of
the experiment's own on ``Runs`` (the evidence pool's: its record order, no cache for a quick run), and
two bench commands that misbehaved: ``expert_pool.py --plan`` trained every run (it never returned),
and ``search_vs_hand.py --report`` died on a report saved before certificates."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

import npas
from experiments.harness import jobs, store
from experiments.harness.report import Columns, cost_table, format_table
from npas import Chassis, Recipe
from tests.conftest import ROOT

REF = Chassis(vocab_size=68, context=16, d_model=16, n_layers=2, n_heads=2, d_ff=64)
RECIPE = Recipe(name="report-test", seq_len=16, batch_size=4, steps=4, warmup_steps=1, eval_every=4, eval_batches=1,
                threads=1)


def _runs(out, **kw) -> jobs.Runs:
    cfg = npas.reference_config(REF)
    return jobs.Runs([1, 2, 3, 4], lambda j: out / f"seed{j}-0123456789.json",
                     lambda j: (cfg, Recipe.from_dict({**RECIPE.to_dict(), "seed": j}), REF),
                     lambda j: {"seed": j, "code_version": "0123456789"}, **kw)


def test_cost_table_prints_aligned_rows_per_group_and_sums_what_is_missing(tmp_path, capsys):
    runs = _runs(tmp_path)
    store.save(runs.path(3), {"val_loss": 1.0})
    cols = Columns((("group", "<6"), ("runs", ">5"), ("tokens", ">8,"), ("est h", ">7.2f")))
    total, left = cost_table(runs, [("odd", [1, 3]), ("even", [2, 4])], cols,
                             lambda g, c: (g, c.runs, c.tokens, c.secs / 3600), lambda j: 1000 * j, lambda j: 36, 30.0)
    assert capsys.readouterr().out.splitlines() == ["group  runs  tokens  est h",
                                                   "odd       2   4,000   4.00",
                                                   "even      2   6,000   6.00"]
    assert (total, left) == (3 * 36 * 10000 / 30.0, 3 * 36 * 7000 / 30.0)  # seed 3's 3,000 tokens are cached
    assert format_table(["a", "bb"], [[1, "x"], [22, ""]]).splitlines() == ["a   bb", "--  --", "1   x", "22"]


def test_a_worker_of_the_experiments_own_keeps_its_record_order_and_a_quick_run_caches_nothing(tmp_path):
    seen = []
    runs = _runs(tmp_path, work=lambda j: {"seed": j, "val_loss": j / 10}, work_args=lambda j: (j,), label_last=True)
    assert jobs.run_missing(runs, 1, None, lambda n, t, j, rec, s: seen.append(rec), lambda j, s: j < 3) == (2, 0, 4)
    assert seen == [{"seed": 1, "val_loss": 0.1}, {"seed": 2, "val_loss": 0.2}]  # the worker's record, as it came
    assert [list(rec) for _, rec in runs.cached()] == [["seed", "val_loss", "code_version"]] * 2  # label last
    quick = jobs.Runs([5], lambda j: None, runs.train, runs.label, work=runs.work, work_args=runs.work_args)
    assert jobs.run_missing(quick, 1, None) == (1, 0, 1) and quick.cached() == [] and not quick.has(5)
    assert sorted(store.names(tmp_path)) == ["seed1-0123456789.json", "seed2-0123456789.json"]


@pytest.mark.slow  # an experiment script in a subprocess (imports torch and the experiment)
def test_expert_pool_plan_trains_nothing_and_returns(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "experiments" / "evidence" / "expert_pool.py"), "--plan",
                          "--seeds", "2", "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"^plan: 8 runs, \d+ cached \(cpu, code [0-9a-f]{10}\); \d+ to train", out.stdout, re.M), out.stdout
    assert "results:" not in out.stdout and "val_loss" not in out.stderr and not list(tmp_path.iterdir())


def test_search_vs_hand_report_of_a_first_edition_report_prints_what_it_saved(tmp_path):
    saved = ROOT / "experiments" / "evidence" / "results" / "search_vs_hand.json"
    assert "certificate" not in json.loads(saved.read_text())  # the committed first edition has none
    shutil.copy(saved, tmp_path / "search_vs_hand.json")
    out = subprocess.run([sys.executable, str(ROOT / "experiments" / "evidence" / "search_vs_hand.py"), "--report",
                          "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stdout + out.stderr
    assert "no certificate: a first-edition report" in out.stdout
    assert re.search(r"^search: 12 proxy runs \(study evidence-svh-\d+\)$", out.stdout, re.M), out.stdout
    assert re.search(r"^2\s+cycle_tying\s+ok\s+200\s+2\.6387\s+100,540", out.stdout, re.M), out.stdout
    assert re.search(r"^min-loss\s+100,584\s+1\.092\s+2\.3936 ± 0\.0744\s+-0\.0937 ± 0\.0286\s+3/3", out.stdout, re.M)
    assert "Kendall tau-b, proxy vs retrained ranking: 0.619" in out.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["search_vs_hand.json"]  # nothing written
