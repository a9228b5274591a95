"""bench/proxy_fidelity.py: --quick trains 4 candidates' proxy and 4x runs under both
parameterizations, caches each run, reruns nothing the second time, and prints the side-by-side table
with tau, its interval and a verdict; the time box and the statistics behave as documented."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT

BENCH = ROOT / "bench" / "proxy_fidelity.py"
ROW = r"\s+(\d\.\d{4}|div|-)\s+(\d\.\d{4}|div|-)\s+\d"  # proxy, long, seeds of one parameterization


def _bench(*args: str) -> str:
    proc = subprocess.run([sys.executable, str(BENCH), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def pf():
    spec = importlib.util.spec_from_file_location("proxy_fidelity", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["proxy_fidelity"] = mod  # dataclasses look their module up while the class is built
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop("proxy_fidelity", None)


@pytest.fixture(scope="module")
def pfr(pf):
    """The bench's report module (statistics and tables), importable once the bench put ROOT on the path."""
    return importlib.import_module("bench.proxy_fidelity_report")


@pytest.mark.slow  # a bench --quick run that trains in a subprocess
def test_quick_runs_caches_and_reruns_nothing(tmp_path):
    out = _bench("--quick", "--out", str(tmp_path))
    runs = sorted(tmp_path.glob("*.json"))
    assert len(runs) == 4 * 2 * 2 + 4  # 4 candidates x {fair, uniform} x {proxy, 1 long seed}, + fair at 2x
    assert "ran 20, cached 0" in out
    recs = [json.loads(p.read_text()) for p in runs]
    assert {"candidate", "kind", "seed", "parameterization", "val_loss", "test_loss", "code_version",
            "allocation", "recipe"} <= set(recs[0])
    mids = [r for r in recs if r["kind"] == "mid"]
    assert len(mids) == 4 and {(r["parameterization"], r["seed"]) for r in mids} == {("fair", 0)}
    proxy_seeds = {r["seed"] for r in recs if r["kind"] == "proxy"}
    long_seeds = {r["seed"] for r in recs if r["kind"] == "long"}
    assert proxy_seeds and long_seeds and not proxy_seeds & long_seeds  # fresh seeds for the long run
    steps = {r["kind"]: r["recipe"]["steps"] for r in recs}
    assert steps["long"] == 4 * steps["proxy"] and steps["mid"] == 2 * steps["proxy"]
    assert {r["recipe"]["lr"] for r in recs} == {recs[0]["recipe"]["lr"]}  # same base lr
    assert all(r["test_loss"] is not None for r in recs if r["status"] == "ok" and r["kind"] == "long")
    for name in ("narrow_untied", "full_tying", "cycle_tying"):  # the space's baselines are candidates
        assert re.search(rf"^{name}\s+[\d,]+{ROW}{ROW}$", out, re.M), out
    for par in ("fair", "uniform"):
        assert re.search(rf"^{par}\s+Kendall tau over 4/4 candidates = [+-]\d\.\d{{3}} \[95% bootstrap "
                         r"(\S+), (\S+); 2000 resamples\] \| tau among the 4 best proxy = \S+ \| target tau "
                         r">= 0\.7 and lower bound > 0\.3: (PASS|MISS)$", out, re.M), out
    again = _bench("--quick", "--out", str(tmp_path))
    assert "ran 0, cached 20" in again
    assert len(list(tmp_path.glob("*.json"))) == 20
    assert again.split("proxy = ")[1] == out.split("proxy = ")[1]  # the same table from the cache


@pytest.mark.slow  # a bench script in a subprocess (imports torch and the bench)
def test_time_box_of_zero_starts_nothing_and_marks_incomplete(tmp_path):
    out = _bench("--quick", "--out", str(tmp_path), "--max-minutes", "0")
    assert not list(tmp_path.glob("*.json"))
    assert "ran 0, cached 0; time box of 0 min: 20 runs not started" in out
    assert len(re.findall(r"  incomplete$", out, re.M)) == 4
    assert len(re.findall(r": INCOMPLETE$", out, re.M)) == 3  # fair, uniform and the 2x-steps row


def test_jobs_cheapest_first_and_fresh_long_seeds(pf, tmp_path):
    setup = pf.make_setup(False, None, 2, tmp_path, 2, proxy_repeats=1)
    space = pf.load_space(pf.SPACE).bind(vocab_size=68)
    cands = pf.candidates(space, 12)
    assert len(cands) == 12 and len({c.config.hash for c in cands}) == 12
    assert [c.name for c in cands[:3]] == list(space.baselines())
    jobs = pf.jobs_of(setup, cands)
    assert len(jobs) == 12 * 2 * 3 + 12  # + the 2x-steps row
    assert all(j.seed != setup.proxy.seed for j in jobs if j.kind == "long")
    assert setup.long.steps == 4 * setup.proxy.steps and setup.long.lr == setup.proxy.lr
    fair = [j.cand.flops for j in jobs if j.kind == "proxy" and j.parameterization == "fair"]
    assert fair == sorted(fair) and len(fair) == 12
    # the first long seed's whole fair table (proxy + long, every candidate) comes before any uniform run
    first_uniform = next(i for i, j in enumerate(jobs) if j.parameterization == "uniform")
    assert first_uniform == 24 and all(j.parameterization == "fair" for j in jobs[:24])
    assert {(j.cand.name, j.kind) for j in jobs[:24]} == {(c.name, k) for c in cands for k in ("proxy", "long")}
    # all of the first long seed's runs come before any of the second's
    order = [j.seed for j in jobs if j.kind == "long"]
    assert order == sorted(order)


def test_diagnostics_come_last_on_the_seeds_a_search_repeats(pf, tmp_path):
    from npas.service.outcome import repeat_seeds

    setup = pf.make_setup(False, None, 2, tmp_path, 2)  # the full bench's default: 2 proxy seeds
    assert setup.proxy_seeds == repeat_seeds(setup.proxy.seed, 2) == (0, 2)
    assert setup.mid.steps == 2 * setup.proxy.steps and setup.mid.lr == setup.proxy.lr
    space = pf.load_space(pf.SPACE).bind(vocab_size=68)
    cands = pf.candidates(space, 12)
    jobs = pf.jobs_of(setup, cands)
    main = pf.jobs_of(pf.make_setup(False, None, 2, tmp_path, 2, proxy_repeats=1), cands)
    extra = [j for j in jobs if j not in main]
    # the verdict's table first, untouched (its cache keys are unchanged), then the repeats, then the 2x row
    assert jobs[:72] == main[:72] and jobs[-12:] == main[-12:] and len(jobs) == len(main) + 12
    assert len(extra) == 12 and {(j.kind, j.parameterization, j.seed) for j in extra} == {("proxy", "fair", 2)}
    assert [j.cand.flops for j in extra] == sorted(c.flops for c in cands)
    assert {(j.kind, j.parameterization, j.seed) for j in jobs[-12:]} == {("mid", "fair", setup.proxy.seed)}
    assert len({j.key(setup, "v") for j in jobs}) == len(jobs)  # no two runs share a cache file


@pytest.mark.slow  # a bench --quick run that trains in a subprocess
def test_quick_with_proxy_repeats_reports_the_mean_and_the_ceiling(tmp_path):
    out = _bench("--quick", "--out", str(tmp_path), "--proxy-repeats", "2", "--long-seeds", "2")
    recs = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]
    assert len(recs) == 4 * 2 * 3 + 4 + 4  # + one more fair proxy seed per candidate, + fair at 2x steps
    extra = [r for r in recs if r["kind"] == "proxy" and r["seed"] == 2]
    assert len(extra) == 4 and {r["parameterization"] for r in extra} == {"fair"}
    assert "proxy repeats (fair): seeds [0, 2]" in out
    for par in ("fair", "uniform"):
        assert re.search(rf"^{par}\s+ceiling: Kendall tau between long seeds 1000 and 1001 over 4 candidates = "
                         r"\S+ \[95% bootstrap \S+, \S+\]$", out, re.M), out
    # each candidate's row: seed 0, seed 2, their mean, 2x steps, the long mean (the printed seeds' mean)
    by = {(r["candidate"], r["kind"], r["seed"]): r for r in recs if r["parameterization"] == "fair"}
    table = out.split("fair, validation loss: the proxy on seeds [0, 2] and their mean")[1]
    for name in ("narrow_untied", "full_tying", "cycle_tying"):
        row = re.search(rf"^{name}\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)$", table, re.M)
        assert row, table
        s0, s2, mean, mid = (float(row[i]) for i in (1, 2, 3, 4))
        p0, p2 = by[name, "proxy", 0]["val_loss"], by[name, "proxy", 2]["val_loss"]
        assert (s0, s2) == (round(p0, 4), round(p2, 4))
        assert mean == pytest.approx((p0 + p2) / 2, abs=1e-4)
        assert mid == round(by[name, "mid", 0]["val_loss"], 4)
    assert re.search(r"^fair 2x\s+Kendall tau over 4/4 candidates = .*: (PASS|MISS)$", out, re.M), out
    assert re.search(r"^fair R=2\s+Kendall tau over 4/4 candidates = .*: (PASS|MISS)$", out, re.M), out
    assert re.search(r"^fair R=2\s+seed noise of the proxy: mean within-candidate std \d\.\d{4} nats over 4 ",
                     out, re.M), out


def test_ceiling_is_tau_between_the_long_seeds(pfr, capsys):
    setup = types.SimpleNamespace(long_seeds=(1000, 1001))
    same = pfr._ceiling("fair", setup, [[float(i), float(i) + 0.1] for i in range(6)])
    assert same["tau"] == pytest.approx(1.0) and same["n"] == 6
    flipped = pfr._ceiling("fair", setup, [[float(i), -float(i)] for i in range(6)])
    assert flipped["tau"] == pytest.approx(-1.0)
    one_seed = pfr._ceiling("fair", setup, [[1.0], [2.0], [0.5, 0.6], [3.0, 2.0], [1.0, 1.5]])
    assert one_seed["n"] == 3  # candidates missing a seed are left out, not guessed
    assert "ceiling: Kendall tau between long seeds 1000 and 1001 over 6 candidates = +1.000" in capsys.readouterr().out


def _synthetic(pfr, longs_of):
    """12 candidates whose proxy losses are fixed and whose long runs (2 seeds) come from `longs_of`,
    scored by the bench's own reporting path (`_stats`): tau, its interval and the verdict."""
    rng = np.random.default_rng(1)
    proxy = list(rng.normal(size=12))
    cands = [types.SimpleNamespace(name=f"c{i}") for i in range(12)]
    rows = {c.name: (p, longs_of(p, rng)) for c, p in zip(cands, proxy, strict=True)}
    return pfr._stats("fair", rows, cands, 2)


def test_statistics_planted_order_passes_and_pure_noise_misses(pfr, capsys):
    planted = _synthetic(pfr, lambda p, rng: [2 * p + 0.01, 2 * p + 0.02])  # same order: tau 1, interval at 1
    assert planted["tau"] == pytest.approx(1.0) and planted["tau_top"] == pytest.approx(1.0)
    assert planted["low"] == pytest.approx(1.0) and planted["high"] == pytest.approx(1.0)
    assert planted["complete"] and planted["verdict"] == "PASS"
    noise = _synthetic(pfr, lambda p, rng: list(rng.normal(size=2)))  # unrelated to the proxy
    assert noise["low"] < 0 < noise["high"] and noise["high"] - noise["low"] > 0.4
    assert noise["verdict"] == "MISS"
    assert _synthetic(pfr, lambda p, rng: list(rng.normal(size=2))) == noise  # seeded: same data, same interval
    out = capsys.readouterr().out
    assert re.search(r"^fair\s+Kendall tau over 12/12 candidates = \+1\.000 \[95% bootstrap \+1\.000, \+1\.000; "
                     r"2000 resamples\].*: PASS$", out, re.M), out


def test_failed_runs_rank_last(pfr):
    assert pfr.ranked([1.0, math.inf, 0.5, None]) == [1.0, 2.0, 0.5, 2.0]
    one_sided = _synthetic(pfr, lambda p, rng: [1.0, 1.0])  # every long run tied: no ranking to compare
    assert math.isnan(one_sided["tau"]) and one_sided["verdict"] == "MISS"


def test_bench_readme_row():
    text = (ROOT / "bench" / "README.md").read_text()
    assert "| `proxy_fidelity.py` |" in text
    assert Path(ROOT / "bench" / "spaces" / "full_frozen.yaml").is_file()
