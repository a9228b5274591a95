"""The benches run in `--quick` mode, and what their output claims is consistent with its own numbers.

Speed is not asserted (a loaded 2-core machine decides it; the targets live in benchmarks/), so a speed
line may say PASS or MISS; but its verdict must agree with the numbers printed beside it, and what
is not a matter of speed is asserted outright: the accounting is exact for every allocation, and no
sharing variant changes FLOPs per token.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # every test runs a bench --quick (training, searches) in a subprocess
NUM = r"[\d,]+(?:\.\d+)?"


def quick(bench: str) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / bench), "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def num(text: str) -> float:
    return float(text.replace(",", ""))


def test_accounting_bench_is_exact_and_its_speed_verdict_matches_its_numbers():
    out = quick("accounting.py")
    assert re.search(r"^exact: (\d+)/\1 allocations agree .* PASS$", out, re.M), out  # exactness must PASS
    m = re.search(rf"^ratio: analytic parameter count ({NUM}) allocations/s vs build-and-count ({NUM}) "
                  rf"allocations/s = ({NUM})x \(target >= ({NUM})x and exact\) (PASS|MISS)$", out, re.M)
    assert m, out
    fast, slow, ratio, target, verdict = num(m[1]), num(m[2]), num(m[3]), num(m[4]), m[5]
    assert abs(fast / slow - ratio) <= 0.02 * ratio  # the ratio is the two printed rates' (rounded)
    assert verdict == ("PASS" if ratio >= target else "MISS")
    assert re.search(rf"^record: the full accounting record .* {NUM} allocations/s = {NUM}x build-and-count$",
                     out, re.M), out


def verdict_matches(verdict: str, printed: float, target: float, digits: int = 3) -> bool:
    """The bench decides on the unrounded ratio and prints it to `digits` decimals: a printed ratio at
    the target (1.100 from 1.1004) may carry either verdict; anywhere else the verdict must follow it."""
    if abs(printed - target) < 0.5 * 10 ** -digits + 1e-12:
        return verdict in ("PASS", "MISS")
    return verdict == ("PASS" if printed <= target else "MISS")


def test_sharing_overhead_keeps_flops_and_its_verdicts_match_its_ratios():
    out = quick("sharing_overhead.py")
    variants = ("tied_all", "tied_cycle", "pooled_template_mix", "pooled_slice", "tapered_cosine3",
                "relaxed_cycle_lora8", "relaxed_cycle_shared_a8", "relaxed_cycle_vera8", "relaxed_cycle_shards8",
                "atoms_qkvo_third", "kv_shared_g2")
    passed = []
    for v in variants:
        m = re.search(rf"^{v}\s+({NUM})\s+({NUM})\s+({NUM})\s+({NUM})\s+({NUM})\s+(PASS|MISS)", out, re.M)
        assert m, f"no row for {v}:\n{out}"
        ratio, flop_ratio, verdict = num(m[2]), num(m[3]), m[6]
        if v == "kv_shared_g2":  # consumer layers skip their K/V projections: fewer FLOPs, by design
            assert flop_ratio < 1.0, m[0]
        else:
            assert flop_ratio == 1.0, f"{v} changes FLOPs per token: {m[0]}"  # sharing moves params, not FLOPs
        assert verdict_matches(verdict, ratio, 1.10), m[0]
        passed += [v] if verdict == "PASS" else []
    # hashed sharing: the reference's shapes (equal FLOPs per token), its own 1.25x target
    for v in ("hashed_global_0.5x", "hashed_global_0.25x", "hashed_global_0.1x"):
        m = re.search(rf"^{re.escape(v)}\s+({NUM})\s+({NUM})\s+({NUM})\s+({NUM})\s+({NUM})\s+(PASS|MISS)", out, re.M)
        assert m, f"no row for {v}:\n{out}"
        assert num(m[3]) == 1.0, m[0]
        assert verdict_matches(m[6], num(m[2]), 1.25), m[0]
        passed += [v] if m[6] == "PASS" else []
    m = re.search(r"^result: (\d+)/14 variants within 1\.10x", out, re.M)
    assert m and int(m[1]) == len(passed), out
    # expert pools: activated FLOPs = the dense reference's + routers; own targets (1.5x, pool size 1.15x)
    for v in ("experts_global_k1", "experts_global4x_k1", "experts_global_k2", "experts_per_layer_k1"):
        m = re.search(rf"^{v}\s+({NUM})\s+({NUM})\s+({NUM})\s+({NUM})\s+({NUM})\s+(PASS|MISS)", out, re.M)
        assert m, f"no row for {v}:\n{out}"
        assert 1.0 < num(m[3]) < 1.1, m[0]  # only the routers' scores add FLOPs
        assert num(m[4]) <= num(m[5]), m[0]  # a token activates at most what is stored
        assert verdict_matches(m[6], num(m[2]), 1.5), m[0]
    m = re.search(rf"^pool size: global pool 4x larger at the same k = ({NUM})x the step time "
                  rf"\(target <= 1\.15x\) (PASS|MISS)$", out, re.M)
    assert m and verdict_matches(m[2], num(m[1]), 1.15), out


def test_data_bench_reports_its_cache_and_its_verdict_matches_its_ratio():
    out = quick("data.py")
    m = re.search(rf"^ratio: tokenize\+cache ({NUM}) MB/s vs encode_batch(?:_fast)? ({NUM}) MB/s = ({NUM})x "
                  rf"\(target >= 0\.80x\) (PASS|MISS)$", out, re.M)
    assert m, out
    ratio, verdict = num(m[3]), m[4]
    assert verdict == ("PASS" if ratio >= 0.80 else "MISS")
    assert re.search(r"^cache: [\d,]+ tokens, [\d.]+ MB on disk \(uint16", out, re.M), out
    assert re.search(r"^load: hit=True, memory-mapped in [\d.]+ ms", out, re.M), out  # the second load hits


def test_budget_fill_bench_finds_no_candidate_short_of_its_budget_without_a_reason():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "budget_fill.py"), "--quick", "--all"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = re.findall(r"^\| `(\w+)\.yaml` \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| ([\d.]+) \| ([\d.]+) \|", proc.stdout, re.M)
    assert len(rows) == len(list((ROOT / "search_spaces").glob("*.yaml"))), proc.stdout
    for _name, feasible, _under_09, under, reasoned, _p10, smallest in rows:
        assert int(feasible) > 0 and int(under) == int(reasoned)  # every short candidate says why
        assert int(under) > 0 or float(smallest) >= 0.98
    assert re.search(r"^result: 0 feasible samples under 0\.98 of the budget without a recorded reason PASS$",
                     proc.stdout, re.M), proc.stdout
