"""experiments/recipe_lr.py: --quick trains the space's baselines at x0.5, x1, x2 of the recipe's rate, caches
each run, reruns nothing the second time, and its verdict follows the printed grid."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from experiments.harness import store
from tests.conftest import ROOT

BENCH = ROOT / "experiments" / "recipe_lr.py"
CELL = r"\s+(\d\.\d{4}|div)"


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # a bench --quick sweep that trains in a subprocess
def test_quick_sweeps_the_recipes_rate_caches_and_its_verdict_follows_the_grid(tmp_path):
    first = _bench("--quick", "--out", str(tmp_path))
    assert first.returncode == 0, first.stdout + first.stderr
    recs = [store.load(tmp_path / n) for n in store.names(tmp_path)]
    assert len(recs) == 2 * 3  # narrow_untied and cycle_tying x {0.5, 1, 2} x 1 seed
    base = {r["recipe"]["lr"] / r["factor"] for r in recs}
    assert len(base) == 1  # every rate is factor x the one recipe rate, the floor scaled with it
    assert all(r["recipe"]["min_lr"] / r["recipe"]["lr"] == recs[0]["recipe"]["min_lr"] / recs[0]["recipe"]["lr"]
               for r in recs)
    assert {r["recipe"]["parameterization"] for r in recs} == {"fair"} and {r["seed"] for r in recs} == {20}
    bests = []
    for arm in ("narrow_untied", "cycle_tying"):
        m = re.search(rf"^{arm}{CELL}{CELL}{CELL}\s+x(\S+)\s+x\S+$", first.stdout, re.M)
        assert m, first.stdout
        losses = [float(v) if v != "div" else float("inf") for v in m.group(1, 2, 3)]
        assert float(m[4]) == (0.5, 1.0, 2.0)[losses.index(min(losses))]  # the printed best is the grid's
        bests.append(float(m[4]))
    verdict = "PASS" if bests == [1.0, 1.0] else "MISS"
    assert re.search(rf"^target: every arm's optimum at x1 of the recipe's rate \(\S+\): {verdict}$", first.stdout, re.M)
    again = _bench("--quick", "--out", str(tmp_path))
    assert again.returncode == 0 and "runs: 0 to train, 6 cached" in again.stdout, again.stdout
    assert len(store.names(tmp_path)) == 6


@pytest.mark.slow  # a bench script in a subprocess (imports torch and the bench)
def test_an_unknown_arm_is_refused_in_one_line_before_anything_trains(tmp_path):
    proc = _bench("--quick", "--out", str(tmp_path), "--arms", "narrow_untied,bogus")
    assert proc.returncode == 2 and "choose from narrow_untied" in proc.stderr.splitlines()[-1]
    assert not list(tmp_path.iterdir())


@pytest.mark.slow  # a bench script in a subprocess (imports torch and the bench)
def test_a_shipped_recipe_is_swept_at_its_own_rate_in_its_own_cache():
    """--recipe NAME (issue #35 item 2): the shipped recipe itself, its own cache version and folder."""
    from experiments.recipe_lr import shipped, shipped_version
    from npas.training.recipe import load_recipe, resolve_recipe

    ladder = shipped("ladder")
    assert ladder == load_recipe(resolve_recipe("ladder")) and ladder.schedule == "wsd"
    assert shipped_version(ladder) != shipped_version(shipped("long"))  # each recipe its own cache
    proc = _bench("--recipe", "ladder", "--arms", "narrow_untied", "--factors", "1,2,4", "--seeds", "20", "--plan")
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"recipe ladder: lr 0\.004 .* 4000 steps .* factors \[1\.0, 2\.0, 4\.0\] \| seeds \[20\]",
                     proc.stdout), proc.stdout
    assert "plan: 3 runs" in proc.stdout
    bad = _bench("--recipe", "ladder", "--factors", "2,4", "--plan")
    assert bad.returncode == 2 and "--factors must include 1" in bad.stderr


def test_a_shipped_sweep_keeps_its_runs_when_its_base_rate_is_retuned():
    """Re-tuning a shipped recipe's rate (item 2) must not orphan the grid it was re-tuned from: a shipped
    sweep's version leaves the base rate out and names each run by the rate it trains at."""
    from types import SimpleNamespace

    from experiments.recipe_lr import key, shipped, shipped_version
    from npas import Recipe

    smoke = shipped("smoke")
    quarter = Recipe.from_dict({**smoke.to_dict(), "lr": smoke.lr / 4, "min_lr": smoke.min_lr / 4})
    v = shipped_version(smoke)
    assert shipped_version(quarter) == v
    arm = SimpleNamespace(name="narrow_untied", config=SimpleNamespace(hash="0123456789abcdef"))
    for f in (0.125, 0.25, 0.5, 1.0, 2.0):  # x f at the new rate is x f/4 at the old one
        assert key(arm, f, 20, v, quarter.lr) == key(arm, f / 4, 20, v, smoke.lr)
    assert key(arm, 1.0, 20, v, quarter.lr) != key(arm, 1.0, 20, v, smoke.lr)
    # the floor's ratio to the peak is part of the recipe: another ratio is another cache
    assert shipped_version(Recipe.from_dict({**smoke.to_dict(), "min_lr": smoke.min_lr / 2})) != v
    # the frozen proxy's cache keeps its factor-named runs
    assert key(arm, 2.0, 20, "0c8e68bf57") == "narrow_untied-01234567-x2-s20-0c8e68bf57"
