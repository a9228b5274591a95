"""`experiments/convert.py --hf` trains across sessions from a per-run cache (issue 37, item 6): `due_jobs` is
the rate walk of `locate_and_repeat` stopped at the first run the cache lacks, so training what it
says until nothing is due caches exactly the runs the table reads; and the dense model is cached as
the Hugging Face directory `write_hf` wrote, which a later `--report` never retrains."""

from __future__ import annotations

import math
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT


def _mode():
    from experiments.convert_hf import HFMode, hf_modes

    quick = hf_modes()["quick"]
    return HFMode(quick.chassis, quick.dense, quick.uptrain, (0, 1, 2))


def test_due_jobs_walks_the_grid_one_run_per_arm_then_the_missing_seeds_at_the_located_rate():
    from experiments.convert_hf import ARMS, GRID, due_jobs

    mode = _mode()
    cache: dict[tuple[str, float, int], float] = {}

    def known(arm, mult, seed):
        return cache.get((arm, mult, seed))

    assert due_jobs(mode, known) == [(arm, GRID[0], 0) for arm in ARMS]  # nothing cached: each arm's first point
    for m in GRID[:2]:  # converted half-way up its grid: its next point, the other arms still their first
        cache["converted", m, 0] = 0.01 * math.log(m) ** 2
    assert due_jobs(mode, known) == [("converted", GRID[2], 0), *((arm, GRID[0], 0) for arm in ARMS[1:])]
    for arm in ARMS:  # every grid walked (a shallow bowl at x1: no extension), one extra seed cached for one arm
        for m in GRID:
            cache[arm, m, 0] = 0.01 * math.log(m) ** 2
    cache["scratch_equal_total", 1.0, 2] = 0.5
    assert due_jobs(mode, known) == [("converted", 1.0, 1), ("converted", 1.0, 2),
                                     ("scratch_equal_uptrain", 1.0, 1), ("scratch_equal_uptrain", 1.0, 2),
                                     ("scratch_equal_total", 1.0, 1)]
    for arm, seed in (("converted", 1), ("converted", 2), ("scratch_equal_uptrain", 1), ("scratch_equal_uptrain", 2),
                      ("scratch_equal_total", 1)):
        cache[arm, 1.0, seed] = 0.5
    assert due_jobs(mode, known) == []  # everything known: nothing due


def test_a_failed_run_is_known_and_ends_the_walk_up():
    """A cached run that diverged (its loss NaN) counts as tried: the walk goes on past it instead of
    asking for it again, and npas's rule stops going up at it."""
    from experiments.convert_hf import ARMS, due_jobs

    mode = _mode()
    cache = {(arm, m, 0): 0.01 * math.log(m) ** 2 for arm in ARMS for m in (0.25, 0.5, 1.0)}
    cache |= {(arm, 2.0, 0): math.nan for arm in ARMS}

    def known(arm, mult, seed):
        return cache.get((arm, mult, seed))

    assert due_jobs(mode, known) == [(arm, 1.0, s) for arm in ARMS for s in (1, 2)]


@pytest.mark.parametrize("loss", [lambda m: -m, lambda m: 0.01 * math.log(m) ** 2, lambda m: math.log(m) ** 2,
                                  lambda m: math.log(m / 0.2) ** 2], ids=["edge", "shallow", "steep", "low_edge"])
def test_training_what_is_due_until_nothing_is_caches_exactly_what_the_table_reads(loss):
    """Rounds of `due_jobs` on a stub trainer end with the cache holding the runs `locate_and_repeat`
    reads and no other (no run is trained that the table does not use), in at most grid + extensions
    + 1 rounds, and the table read from the cache is the one the sequential walk computes."""
    from experiments.convert_hf import GRID, MAX_EXTEND, due_jobs, locate_and_repeat

    mode = _mode()
    cache: dict[tuple[str, float, int], float] = {}
    rounds = 0
    while due := due_jobs(mode, lambda a, m, s: cache.get((a, m, s))):
        rounds += 1
        grid = [arm for arm, _, seed in due if seed == 0]
        assert len(grid) == len(set(grid))  # one grid point per arm per round: the next depends on its loss
        for job in due:
            assert job not in cache
            cache[job] = loss(job[1]) + 0.001 * job[2]
    assert rounds <= len(GRID) + MAX_EXTEND + 1
    read: list[tuple[str, float, int]] = []

    def train(arm, mult, seed):
        read.append((arm, mult, seed))
        return cache[arm, mult, seed]

    from_cache = locate_and_repeat(mode, train)
    assert sorted(read) == sorted(cache)
    assert from_cache == locate_and_repeat(mode, lambda a, m, s: loss(m) + 0.001 * s)


def _table(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("|") or line.startswith("converted vs scratch")]


@pytest.mark.slow
def test_quick_run_caches_the_dense_hf_model_and_every_run_and_report_trains_nothing(tmp_path):
    """The quick run end to end on one worker (about 1.5 minutes on one core): the dense model is
    cached as a Hugging Face directory that npas and transformers both load, one record per run the
    table reads (plus the dense model's), and `--report` prints the same table from the cache alone."""
    import npas
    from experiments.convert_hf import ARMS, Cache, cycle_lora, hf_modes, locate_and_repeat
    from experiments.harness import store

    out = tmp_path / "convert_hf"
    cmd = [sys.executable, str(ROOT / "experiments" / "convert.py"), "--hf", "--quick", "--workers", "1", "--out", str(out)]
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    print(f"quick --hf run: {wall:.0f} s")
    assert "round 1:" in proc.stdout and "INCOMPLETE" not in proc.stdout
    table = _table(proc.stdout)
    assert len(table) == 2 + len(ARMS) + 2, proc.stdout

    mode = hf_modes()["quick"]
    cache = Cache.of(mode, cycle_lora(mode.chassis), out)
    dense = cache.dense_dir
    assert {p.name for p in dense.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json"}
    assert dense.name in proc.stdout and cache.version in proc.stdout  # the same code version as the bench's
    ck = npas.read_hf_dir(dense)
    assert ck.cfg.chassis == mode.chassis
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(dense)
    assert type(hf).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in hf.parameters()) == npas.count(ck.cfg).stored_params

    read = []
    locate_and_repeat(mode, lambda a, m, s: read.append((a, m, s)) or cache.known(a, m, s))
    assert set(store.names(out)) == {cache.path(*job).name for job in read} | {cache.path("dense", 1.0, 0).name}
    assert len(read) == len(set(read)) == cache.cached_runs()
    assert all(store.load(cache.path(*job))["status"] == "ok" for job in read)

    files = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    report = subprocess.run([*cmd, "--report"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stdout[-3000:] + report.stderr[-3000:]
    assert _table(report.stdout) == table
    assert "round " not in report.stdout and "INCOMPLETE" not in report.stdout
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == files  # nothing trained, nothing written
