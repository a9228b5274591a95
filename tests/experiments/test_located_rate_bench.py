"""experiments/located_rate.py --quick end to end: the grid at the locating rung (T/4) by the located-rate rule,
the hold-at-T runs at f/2, f, 2f on a fresh seed, and a report from the cache alone."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.harness import store

ROOT = Path(__file__).resolve().parents[2]


def _bench(*args: str) -> str:
    p = subprocess.run([sys.executable, str(ROOT / "experiments" / "located_rate.py"), *args], capture_output=True,
                       text=True, timeout=1500)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout


@pytest.mark.slow  # trains ~40 tiny runs in subprocesses
def test_quick_locates_holds_and_reports_from_the_cache(tmp_path):
    out = _bench("--quick", "--workers", "1", "--out", str(tmp_path))
    recs = [store.load(tmp_path / n) for n in store.names(tmp_path)]
    grids: dict[str, dict[float, float]] = {}
    for r in recs:
        if r["kind"] == "grid":
            assert r["recipe"]["schedule"] == "wsd" and r["recipe"]["steps"] == 6 and r["seed"] == 0  # T/4 of 24
            grids.setdefault(r["candidate"], {})[r["factor"]] = r["val_loss"] if r["status"] == "ok" else math.inf
    # the held set: the 3 baselines (the quick run's one sample costs over HOLD_MAX_FLOPS); without the
    # proxy-fidelity bench's WSD runs (a fresh temp cache) the ladder asks no other candidate for a grid
    assert sorted(grids) == ["cycle_tying", "full_tying", "narrow_untied"], sorted(grids)
    from npas.training.located_rate import best_factor as lr_best_factor
    from npas.training.located_rate import next_factor as lr_next_factor

    for name, g in grids.items():
        walked: dict[float, float] = {}
        while (k := lr_next_factor(walked)) is not None:  # the cache holds exactly what the rule asks
            assert k in g, (name, g, walked)
            walked[k] = g[k]
        assert set(walked) == set(g), (name, g)
        f = lr_best_factor(g)
        hold = {r["factor"] for r in recs if r["kind"] == "hold" and r["candidate"] == name}
        assert hold == {f / 2, f, 2 * f}, (name, g, hold)
        assert all(r["seed"] == 2000 and r["recipe"]["steps"] == 24 for r in recs if r["kind"] == "hold")
        row = re.search(rf"^{name}\s+.*?\s{f:g}[* ]\s", out, re.M)
        assert row, out
    # the recipe's rate is scaled by the factor, the whole schedule with it
    base = next(r for r in recs if r["kind"] == "grid" and r["factor"] == 1.0)["recipe"]
    for r in recs:
        assert r["recipe"]["lr"] == pytest.approx(base["lr"] * r["factor"])
        assert r["recipe"]["min_lr"] == pytest.approx(base["min_lr"] * r["factor"])
    assert re.search(r"^target: located factor best of three at T for \d of 3 \(>= 6 of 8\), within one step for "
                     r"3 of 3: (PASS|MISS)$", out, re.M), out
    again = _bench("--quick", "--report", "--out", str(tmp_path))
    assert "runs due" not in again
    assert again.split("located rates over")[1] == out.split("located rates over")[1]
