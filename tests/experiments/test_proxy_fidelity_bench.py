"""experiments/proxy_fidelity.py: --quick trains 4 candidates' proxy and 4x runs under both
parameterizations and one WSD run each, caches each run, reruns nothing the second time, and prints
the side-by-side table with tau, its interval and a verdict, then the horizon rows; the time box and
the statistics behave as documented."""

from __future__ import annotations

import importlib.util
import math
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from experiments.harness import store
from tests.conftest import ROOT

BENCH = ROOT / "experiments" / "proxy_fidelity.py"
ROW = r"\s+(\d\.\d{4}|div|-)\s+(\d\.\d{4}|div|-)\s+\d"  # proxy, long, seeds of one parameterization


def _bench(*args: str) -> str:
    proc = subprocess.run([sys.executable, str(BENCH), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)  # 24 tiny runs and six bootstrapped rows; minutes on a loaded 2-core box
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
    return importlib.import_module("experiments.proxy_fidelity_report")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> tuple[str, Path]:
    """One `--quick` run (24 trainings, a minute or more) shared by the tests below: (stdout, its cache
    directory). A test that writes more runs works on a copy of the directory."""
    out_dir = tmp_path_factory.mktemp("quick")
    return _bench("--quick", "--out", str(out_dir)), out_dir


# both tests share quick_run: the same xdist worker (pyproject's --dist loadgroup) runs them
@pytest.mark.slow  # a bench --quick run that trains in a subprocess
@pytest.mark.xdist_group("proxy_fidelity_quick")
def test_quick_runs_caches_and_reruns_nothing(quick_run):
    out, tmp_path = quick_run
    runs = [tmp_path / n for n in store.names(tmp_path)]  # the run cache (experiments/harness/store.py)
    # 4 candidates x {fair, uniform} x {proxy, 1 long seed}, + fair at 2x, + one fair WSD run to T each
    assert len(runs) == 4 * 2 * 2 + 4 + 4
    assert "ran 24, cached 0" in out
    recs = [store.load(p) for p in runs]
    assert {"candidate", "kind", "seed", "parameterization", "val_loss", "test_loss", "code_version",
            "allocation", "recipe"} <= set(recs[0])
    mids = [r for r in recs if r["kind"] == "mid"]
    assert len(mids) == 4 and {(r["parameterization"], r["seed"]) for r in mids} == {("fair", 0)}
    proxy_seeds = {r["seed"] for r in recs if r["kind"] == "proxy"}
    long_seeds = {r["seed"] for r in recs if r["kind"] == "long"}
    assert proxy_seeds and long_seeds and not proxy_seeds & long_seeds  # fresh seeds for the long run
    steps = {r["kind"]: r["recipe"]["steps"] for r in recs}
    assert steps["long"] == 4 * steps["proxy"] and steps["mid"] == 2 * steps["proxy"] and steps["wsd"] == steps["long"]
    wsd = [r for r in recs if r["kind"] == "wsd"]
    assert len(wsd) == 4 and all(r["recipe"]["schedule"] == "wsd" and r["parameterization"] == "fair" for r in wsd)
    assert all(list(r["rung_losses"]) == ["3", "6", "24"] and r["rung_losses"]["24"] == r["val_loss"]
               for r in wsd if r["status"] == "ok")
    assert all(r["tokens"] > r["steps"] * r["recipe"]["batch_size"] * r["recipe"]["seq_len"] for r in wsd)  # + forks
    assert {r["recipe"]["lr"] for r in recs} == {recs[0]["recipe"]["lr"]}  # same base lr
    assert all(r["test_loss"] is not None for r in recs if r["status"] == "ok" and r["kind"] == "long")
    for name in ("narrow_untied", "full_tying", "cycle_tying"):  # the space's baselines are candidates
        assert re.search(rf"^{name}\s+[\d,]+{ROW}{ROW}$", out, re.M), out
    for par in ("fair", "uniform"):
        assert re.search(rf"^{par}\s+Kendall tau over 4/4 candidates = [+-]\d\.\d{{3}} \[95% bootstrap "
                         r"(\S+), (\S+); 2000 resamples\] \| tau among the 4 best proxy = \S+ \| target tau "
                         r">= 0\.7 and lower bound > 0\.3: (PASS|MISS)$", out, re.M), out
    for label in ("proxy 6", "fork 3", "fork 6", "wsd 24"):
        assert re.search(rf"^{label}\s+tau over 4/4 = \S+ \[95% bootstrap \S+, \S+\] \| tau over \d+ resolvable "
                         r"pairs = \S+ \| top-3 recall \d\.\d\d$", out, re.M), out
    assert re.search(r"^target: delta tau \(fork 6 - proxy 6\) over 4/4 candidates = \S+ \[95% paired bootstrap "
                     r"\S+, \S+; \d+ resamples\] above 0: (PASS|MISS)$", out, re.M), out
    # the ladder row, replayed from the WSD runs' rung losses (experiments/proxy_fidelity_ladder.py)
    m = re.search(r"^ladder \(4 of 4 candidates, sampler order, 2 workers, eta 4, rungs 3, 6, 24, .*reached "
                  r"3: (\d+), 6: (\d+), 24: (\d+)$", out, re.M)
    assert m and sum(map(int, m.groups())) == 4, out
    assert re.search(r"^target: ladder compute [\d,]+ steps \(forks counted\) = \d\.\d{3} x N x T \(4 x 24\) "
                     r"<= 0\.5: (PASS|MISS); in FLOPs \d\.\d{3} x N x T$", out, re.M), out
    assert re.search(r"^target: delta tau \(ladder - proxy 6\) over 4/4 candidates", out, re.M), out
    again = _bench("--quick", "--out", str(tmp_path))
    assert "ran 0, cached 24" in again
    assert len(store.names(tmp_path)) == 24
    assert again.split("proxy = ")[1] == out.split("proxy = ")[1]  # the same table from the cache


@pytest.mark.slow  # a bench script in a subprocess (imports torch and the bench)
def test_time_box_of_zero_starts_nothing_and_marks_incomplete(tmp_path):
    out = _bench("--quick", "--out", str(tmp_path), "--max-minutes", "0")
    assert not store.names(tmp_path)
    assert "ran 0, cached 0; time box of 0 min: 24 runs not started" in out
    assert len(re.findall(r"  incomplete$", out, re.M)) == 4
    assert len(re.findall(r": INCOMPLETE$", out, re.M)) == 4  # fair, uniform, the 2x-steps row and the horizon target


def test_jobs_cheapest_first_and_fresh_long_seeds(pf, tmp_path):
    setup = pf.make_setup(False, None, 2, tmp_path, 2, proxy_repeats=1)
    space = pf.load_space(pf.SPACE).bind(vocab_size=68)
    cands = pf.candidates(space, 12)
    assert len(cands) == 12 and len({c.config.hash for c in cands}) == 12
    assert [c.name for c in cands[:3]] == list(space.baselines())
    jobs = pf._table_jobs(setup, cands)  # the original table's runs, as before the horizon rows
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
    from npas.service.execution.outcome import repeat_seeds

    setup = pf.make_setup(False, None, 2, tmp_path, 2)  # the full bench's default: 2 proxy seeds
    assert setup.proxy_seeds == repeat_seeds(setup.proxy.seed, 2) == (0, 2)
    assert setup.mid.steps == 2 * setup.proxy.steps and setup.mid.lr == setup.proxy.lr
    space = pf.load_space(pf.SPACE).bind(vocab_size=68)
    cands = pf.candidates(space, 12)
    jobs = pf._table_jobs(setup, cands)
    main = pf._table_jobs(pf.make_setup(False, None, 2, tmp_path, 2, proxy_repeats=1), cands)
    extra = [j for j in jobs if j not in main]
    # the verdict's table first, untouched (its cache keys are unchanged), then the repeats, then the 2x row
    assert jobs[:72] == main[:72] and jobs[-12:] == main[-12:] and len(jobs) == len(main) + 12
    assert len(extra) == 12 and {(j.kind, j.parameterization, j.seed) for j in extra} == {("proxy", "fair", 2)}
    assert [j.cand.flops for j in extra] == sorted(c.flops for c in cands)
    assert {(j.kind, j.parameterization, j.seed) for j in jobs[-12:]} == {("mid", "fair", setup.proxy.seed)}
    assert len({j.key(setup, "v") for j in jobs}) == len(jobs)  # no two runs share a cache file


@pytest.mark.slow  # a bench --quick run that trains in a subprocess
@pytest.mark.xdist_group("proxy_fidelity_quick")
def test_quick_with_proxy_repeats_reports_the_mean_and_the_ceiling(quick_run, tmp_path):
    shutil.copytree(quick_run[1], tmp_path, dirs_exist_ok=True)  # the plain --quick runs, cached: 12 new ones
    out = _bench("--quick", "--out", str(tmp_path), "--proxy-repeats", "2", "--long-seeds", "2")
    assert "ran 12, cached 24" in out  # the repeats and the second long seed add to the cache, reusing it
    recs = [store.load(tmp_path / n) for n in store.names(tmp_path)]
    # + one more fair proxy seed per candidate, + fair at 2x steps, + one fair WSD run each
    assert len(recs) == 4 * 2 * 3 + 4 + 4 + 4
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


def test_horizon_rows_add_24_candidates_fair_only_and_leave_the_table_as_it_was(pf, tmp_path):
    """The default bench: the first 12 candidates are the 12 the table always had, with the same runs
    and keys; the 12 added ones get the fair proxy and long seeds; each of the 24 one WSD run to T,
    forked at T/16 and T/4, keyed apart from every cosine run."""
    setup = pf.make_setup(False, None, None, tmp_path, 2)
    assert setup.n_candidates == 24 and setup.n_full == 12
    assert setup.wsd.steps == setup.long.steps == 1600 and setup.wsd.fork_rungs() == (100, 400, 1600)
    assert setup.wsd.schedule == "wsd" and setup.wsd.lr == setup.proxy.lr and setup.wsd.horizon == 1600
    space = pf.load_space(pf.SPACE).bind(vocab_size=68)
    cands = pf.candidates(space, 24)
    assert len({c.config.hash for c in cands}) == 24
    assert [c.config.hash for c in cands[:12]] == [c.config.hash for c in pf.candidates(space, 12)]
    jobs = pf.jobs_of(setup, cands)
    table = pf._table_jobs(setup, cands[:12])
    core = [j for j in table if j.kind != "mid"]  # the original table's runs, its mid diagnostic last of all
    mids = [j for j in table if j.kind == "mid"]
    assert len(mids) == 12 and jobs[:len(core)] == core and jobs[len(jobs) - len(mids):] == mids
    horizon = jobs[len(core):len(jobs) - len(mids)]
    assert {(j.kind, j.parameterization) for j in horizon} == {("proxy", "fair"), ("long", "fair"), ("wsd", "fair")}
    assert sorted(j.cand.name for j in horizon if j.kind == "wsd") == sorted(c.name for c in cands)
    added = {c.name for c in cands[12:]}
    assert {j.cand.name for j in horizon if j.kind != "wsd"} == added
    assert sum(j.kind == "long" for j in horizon) == 12 * 2 and sum(j.kind == "proxy" for j in horizon) == 12
    extras = horizon[12:]  # after the original twelve's WSD runs, each added candidate whole, in turn
    assert [j.cand.name for j in extras] == [name for name in dict.fromkeys(j.cand.name for j in extras)
                                             for _ in range(4)]
    keys = [j.key(setup, "v") for j in jobs]
    assert len(set(keys)) == len(keys)
    wsd = next(j for j in horizon if j.kind == "wsd")
    assert wsd.key(setup, "v").endswith(f"-proxy-wsd-1600-s0-fair-v-{pf.wsd_version(setup)}")
    # a WSD run costs its T steps plus its two forks' decays (20 + 80 steps)
    assert wsd.tokens(setup) == (1600 + 20 + 80) * setup.proxy.tokens_per_step


def test_delta_target_is_a_paired_bootstrap_over_candidates(pfr, capsys):
    names = [f"c{i}" for i in range(12)]
    target = {n: float(i) for i, n in enumerate(names)}
    good = dict(target)  # a row that ranks exactly like the target
    noisy = {n: float((i * 7) % 12) for i, n in enumerate(names)}  # a scrambled row
    up = pfr._delta_target(good, noisy, target, 12, "fork 400", "proxy 400")
    assert up["delta"] > 0.5 and up["low"] > 0 and up["verdict"] == "PASS"
    same = pfr._delta_target(good, good, target, 12, "fork 400", "proxy 400")
    assert same["delta"] == 0 and same["low"] == same["high"] == 0 and same["verdict"] == "MISS"
    part = pfr._delta_target({n: v for n, v in good.items() if n != "c0"}, noisy, target, 12, "a", "b")
    assert part["n"] == 11 and part["verdict"] == "INCOMPLETE"
    assert "target: delta tau (fork 400 - proxy 400) over 12/12 candidates = " in capsys.readouterr().out


def test_why_rows_tell_a_horizon_crossover_from_a_schedule_miss(pfr, capsys):
    """Two 400-step rows that agree with each other and both reverse the order at T read as a crossover
    between T/4 and T (tau -1 against wsd at T, +1 against each other); a failed run stays ranked last."""
    names = [f"c{i}" for i in range(8)]
    target = {n: float(i) for i, n in enumerate(names)}
    short = {n: float(-i) for i, n in enumerate(names)}  # the short rows reverse the order at T
    cols = {"proxy 400": dict(short), "fork 100": dict(short), "fork 400": {**short, "c7": math.inf},
            "wsd 1600": dict(target)}
    out = pfr._why_rows(cols, target, "proxy 400", "wsd 1600", 8)
    assert out["fork 400 vs wsd 1600"]["tau"] == pytest.approx(-1.0 + 2 * 7 / 28)  # c7 failed: last, i.e. worst
    assert out["proxy 400 vs wsd 1600"]["tau"] == pytest.approx(-1.0)
    assert out["fork 400 vs proxy 400"]["tau"] == pytest.approx(1.0 - 2 * 7 / 28)
    assert "wsd 1600 vs wsd 1600" not in out
    assert "diagnostic (why)" in capsys.readouterr().out


def test_resolvable_tau_counts_only_pairs_beyond_the_noise(pfr):
    x = [1.0, 2.0, 3.0, 4.0]
    y = [1.0, 1.05, 3.0, 2.9]  # (0,1) and (2,3) are inside 2 x 0.1; (2,3) is also discordant
    tau, n = pfr._resolvable_tau(x, y, 0.1)
    assert n == 4 and tau == pytest.approx(1.0)
    tau_all, n_all = pfr._resolvable_tau(x, y, 0.0)
    assert n_all == 6 and tau_all == pytest.approx(4 / 6)
    assert pfr._resolvable_tau(x, y, None) == (pytest.approx(math.nan, nan_ok=True), 0)


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
    text = (ROOT / "experiments" / "README.md").read_text()
    assert "| `proxy_fidelity.py` |" in text
    assert Path(ROOT / "experiments" / "spaces" / "full_frozen.yaml").is_file()
