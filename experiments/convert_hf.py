"""`experiments/convert.py --hf` (issue 37, item 6): a LLaMA-family model trained here and saved in Hugging Face
format, converted to cycle tying + LoRA at 0.5x its parameters and uptrained, against the same allocation
from scratch at equal uptraining and at equal total steps.

    nice -n 19 python experiments/convert.py --hf --plan                 # the plan, what is cached, what is due now
    nice -n 19 python experiments/convert.py --hf --max-minutes 150      # train what is due (rounds), then the table
    nice -n 19 python experiments/convert.py --hf --report               # the table from the cache alone; trains nothing
    nice -n 19 python experiments/convert.py --hf --quick --workers 1    # tiny chassis in a temporary folder (--out keeps it)

Each arm trains at its *located* rate: a learning-rate grid (multiples of the recipe's lr) on seed 0,
walked upwards by npas's own rule (`npas.lr_next_factor`: a rate clearly worse than the best so far
ends the walk up, an edge optimum extends one step, at most `MAX_EXTEND` times), then every seed at
that rate. Comparisons are paired by seed (same seed, same validation batches): the mean
difference with a 95% t-interval.

PASS: converted + uptraining beats scratch at equal uptraining on every seed. The equal-total-steps
comparison (scratch trained for the dense model's steps plus the uptraining's) is reported with its
verdict either way.

Sizes (full mode), and why: a d_model 64 x 8-layer LLaMA (SwiGLU d_ff 176, 4 query and 2 K/V heads,
RMSNorm; 374,080 parameters), the dense model trained with the `long` recipe cut to 2,000 steps (its
lr 4e-3, warmup and 10x cosine floor, the cosine ending at 2,000; one thread, as every pool worker),
uptraining with `proxy` (400 steps), 5 seeds. The first plan (d_model 128, the whole `long` recipe)
was ~17.7 CPU core-hours: not runnable on a 2-core machine in 3-hour sessions. This one is ~2.5
(`--plan`), and d_model 64 x 8 is the size of the existing conversion evidence in docs/RESULTS.md
(the Relaxed Recursive Transformers row: a d_model 64 x 8 dense reference, 1,000 steps, converted to
cycle U=4 + LoRA), so the two read side by side. Quick mode is a smoke test of the machinery only.

Cache, so the run spans sessions: every finished run is one record in `experiments/results/convert_hf/`
(`experiments/harness/store.py`), keyed ``<arm>-x<lr multiple>-s<seed>-<steps>-<code version>.json``; the
code version is that of the training numerics (`npas.conversion.numerics`, whose golden runs train a
llama model and convert it) and the settings every run shares (`code_version`). The dense
model is cached too, as the Hugging Face directory `write_hf` wrote (`dense-<version>/`; its ~1.5 MB
of fp32 weights stay out of git, its config and tokenizer are committed) plus its record
`dense-<version>.json` (what the report reads): trained once, only when a converted run is due, and read back with `read_hf_dir` by every converted run after it. Training
goes in rounds on a process pool (`due_jobs`: per arm the next grid point the rule asks for, or
once the grid is walked, the missing seeds at the located rate), each record saved the moment its
run finishes; `--max-minutes` stops starting runs, and a later invocation picks up from the cache.
The table is `locate_and_repeat` over the cache (`--report` prints it without training).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import optuna

from experiments.convert_hf_train import train_job
from experiments.harness import store
from experiments.harness.pool import run_pool
from experiments.harness.recipes import bench_recipe  # noqa: E402
from experiments.harness.version import ROOT, recipe_settings
from experiments.harness.version import code_version as harness_version
from npas import ArchConfig, Chassis, Recipe, count, reference_config
from npas.allocation.space_parser import parse_space
from npas.service.study.fidelity import paired_delta
from npas.training.located_rate import best_factor as lr_best_factor
from npas.training.located_rate import next_factor as lr_next_factor

GRID = (0.25, 0.5, 1.0, 2.0, 4.0)  # multiples of the recipe's lr tried on seed 0
MAX_EXTEND = 2  # extensions of the grid past an edge optimum (x2 or /2 each)
# training FLOP/s of one CPU thread for the plan's estimate: experiments/proxy_fidelity.py --plan measured
# 20.3 GFLOP/s per worker at d_model 128 on this (shared, loaded) machine on 2026-12-02; experiments/lr_transfer.py
# states 50 on a quiet one. The estimate uses the loaded figure and prints the quiet one beside it.
CPU_FLOPS, QUIET_CPU_FLOPS = 2.0e10, 5.0e10
OUT = ROOT / "experiments" / "results" / "convert_hf"  # the full run's cache (quick: a temporary folder or --out)
DENSE = ("dense", 1.0, 0)  # the dense model's job: trained once, by the pool like any run

Job = tuple[str, float, int]  # (arm, lr multiple, seed)


@dataclass(frozen=True)
class HFMode:
    chassis: Chassis
    dense: Recipe
    uptrain: Recipe
    seeds: tuple[int, ...]


def hf_modes() -> dict[str, HFMode]:
    """Full: d_model 64 x 8, dense `long` cut to 2,000 steps, `proxy` uptraining, 5 seeds (the module
    docstring says why). Quick: a smoke test of the machinery, small enough for a minute or two on one core."""
    full = Chassis(vocab_size=68, context=128, d_model=64, n_layers=8, n_heads=4, d_ff=176, activation="swiglu",
                   family="llama", n_kv_heads=2, rms_norm_eps=1e-5)
    quick = Chassis(vocab_size=68, context=64, d_model=64, n_layers=4, n_heads=4, d_ff=176, activation="swiglu",
                    family="llama", n_kv_heads=2, rms_norm_eps=1e-5)
    smoke = bench_recipe("smoke")
    # `long` trains on 2 threads; here the dense model is one pool worker beside the others (1 thread each)
    dense = replace(bench_recipe("long").with_steps(2000), threads=1)
    return {"full": HFMode(full, dense, bench_recipe("proxy"), (0, 1, 2, 3, 4)),
            "quick": HFMode(quick, smoke.with_steps(150), smoke.with_steps(40), (0, 1))}


def cycle_lora(ch: Chassis) -> ArchConfig:
    """Cycle tying (L/2 unique blocks) + LoRA rank 8 on attention and MLP, fitted to 0.5x by the search's fit."""
    import yaml

    chassis = yaml.safe_dump(ch.to_dict(), default_flow_style=True, width=1 << 16).strip()
    text = (f"name: convert-hf-bench\nchassis: {chassis}\nbudget: 0.5x\nobjectives: [val_loss, train_memory_bytes]\n"
            f"recipe: proxy\nfit: {{width: mlp, max_width_scale: 8.0}}\nknobs:\n"
            f"  tying: {{mode: [cycle], unique_blocks: [{ch.n_layers // 2}]}}\n"
            f"  relaxation: {{rank: [8], targets: [both]}}\n")
    cand = parse_space(text, "convert-hf bench").sample(optuna.create_study().ask())
    if not cand.feasible:
        raise SystemExit(f"cycle+lora8 at 0.5x: {cand.fit.reason}")
    return cand.config


ARMS = ("converted", "scratch_equal_uptrain", "scratch_equal_total")


def arm_steps(mode: HFMode) -> dict[str, int]:
    """Optimizer steps of one training run of each arm."""
    u = mode.uptrain.steps
    return {"converted": u, "scratch_equal_uptrain": u, "scratch_equal_total": mode.dense.steps + u}


def plan_steps(mode: HFMode) -> dict[str, int]:
    """The run's optimizer steps: the dense model's, the seed-0 grids', the other seeds' and the total,
    with every grid point trained and no extension ("total") and with every arm extended `MAX_EXTEND`
    times ("at_most"): the most `locate_and_repeat` spends without and with extensions; a grid that
    stops going up early spends less (tests/experiments/test_convert_hf_plan.py runs it on a stub)."""
    steps = arm_steps(mode)
    grids = sum(len(GRID) * s for s in steps.values())
    seeds = sum((len(mode.seeds) - 1) * s for s in steps.values())  # seed 0 is in the grid
    total = mode.dense.steps + grids + seeds
    return {"dense": mode.dense.steps, "grids": grids, "seeds": seeds, "total": total,
            "at_most": total + MAX_EXTEND * sum(steps.values())}


def plan_cost(mode: HFMode, cfg: ArchConfig) -> dict[str, float]:
    """Runs and training FLOPs of the plan without extensions ("runs", "flops") and with every arm
    extended `MAX_EXTEND` times ("runs_at_most", "flops_at_most"): 3x the forward FLOPs per token
    (`count(...).flops_per_token`, evaluation excluded) x the tokens of each run."""
    per_run = len(GRID) + len(mode.seeds) - 1  # seed 0's grid point is the located rate's first seed
    dense = mode.dense.steps * mode.dense.tokens_per_step * 3 * count(reference_config(mode.chassis)).flops_per_token
    arm = {a: s * mode.uptrain.tokens_per_step * 3 * count(cfg).flops_per_token for a, s in arm_steps(mode).items()}
    return {"runs": 1 + per_run * len(ARMS), "runs_at_most": 1 + (per_run + MAX_EXTEND) * len(ARMS),
            "flops": dense + per_run * sum(arm.values()),
            "flops_at_most": dense + (per_run + MAX_EXTEND) * sum(arm.values())}


def print_hf_plan(mode: HFMode, cfg: ArchConfig, cache: Cache | None = None) -> None:
    """The plan: sizes, arms, rate location, steps and cost; with ``cache``, what it holds and what is due now."""
    d, u = mode.dense, mode.uptrain
    ref = count(reference_config(mode.chassis)).stored_params
    total = d.steps + u.steps
    p = plan_steps(mode)
    print(f"plan (--hf): dense {mode.chassis.family} reference {ref:,} params, {d.name} {d.steps} steps x "
          f"{d.tokens_per_step:,} tokens, saved as a stock LlamaForCausalLM and read back with npas convert's reader")
    print(f"  allocation cycle+lora8@0.5x: {count(cfg).stored_params:,} params ({count(cfg).stored_params / ref:.3f}x) "
          f"{cfg.summary()}")
    print(f"  arms: converted + uptraining ({u.name}, {u.steps} steps); scratch at equal uptraining ({u.steps}); "
          f"scratch at equal total steps ({total})")
    print(f"  rate location per arm on seed 0: lr x {list(GRID)} of {u.lr:g} walked upwards until a rate is clearly "
          f"worse (npas's rule), extended up to {MAX_EXTEND} times past an edge optimum; then seeds {list(mode.seeds)} at the located rate; paired 95% t-intervals")
    print(f"  optimizer steps: dense {p['dense']:,} + grids {p['grids']:,} + seeds {p['seeds']:,} = "
          f"{p['total']:,} (at most {p['at_most']:,} with extensions; less where a grid stops early)")
    c = plan_cost(mode, cfg)
    hours = {k: c[k] / rate / 3600 for k, rate in (("flops", CPU_FLOPS), ("flops_at_most", CPU_FLOPS))}
    print(f"  runs: {c['runs']} (at most {c['runs_at_most']}); training {c['flops'] / 1e12:,.0f} TFLOP (3x forward, "
          f"evaluation excluded) -> ~{hours['flops']:.2f} CPU core-hours at {CPU_FLOPS / 1e9:.0f} GFLOP/s per thread "
          f"(at most {hours['flops_at_most']:.2f}; ~{c['flops'] / QUIET_CPU_FLOPS / 3600:.2f} on a quiet machine at "
          f"{QUIET_CPU_FLOPS / 1e9:.0f})")
    if cache is None:
        return
    due = due_jobs(mode, cache.known)
    dense_due = cache.dense_due(due)
    left = sum(cache.steps(arm) for arm, _, _ in due) + (mode.dense.steps if dense_due else 0)
    print(f"  cache {cache.where()} (code version {cache.version}): {cache.cached_runs()} runs cached, the dense "
          f"model {'cached' if cache.dense_ready() else 'not cached'}; due now: "
          + (f"{len(due)} runs{' and the dense model (trained first: the converted run waits for it)' if dense_due else ''}"
             f", {left:,} steps: {describe(due)}" if due else "nothing, the table is complete (--report prints it)"))


def describe(jobs: list[Job]) -> str:
    """``converted x0.25 s0, ...``: a list of runs, for the plan and an incomplete report."""
    return ", ".join(f"{arm} x{mult:g} s{seed}" for arm, mult, seed in jobs)


def walk_grid(arm: str, loss_of: Callable[[str, float, int], float | None]) -> tuple[dict[float, float], float | None]:
    """npas's rate rule on seed 0 for one arm (``npas.lr_next_factor``: upwards until a rate is clearly
    past the optimum, then past an edge optimum at most `MAX_EXTEND` times), asking ``loss_of(arm,
    factor, 0)`` for each factor it wants. Returns (the factors walked with their losses, the first
    factor ``loss_of`` had no loss for -- None once the walk ended). One walk for training it
    (`locate_and_repeat`) and for reading what is due from the cache (`due_jobs`)."""
    tried: dict[float, float] = {}
    while (m := lr_next_factor(tried, GRID, 2.0, MAX_EXTEND)) is not None:
        loss = loss_of(arm, m, 0)
        if loss is None:
            return tried, m
        tried[m] = loss
    return tried, None


def locate_and_repeat(mode: HFMode, train: Callable[[str, float, int], float], t0: float | None = None
                      ) -> tuple[dict[str, tuple[float, bool]], dict[str, dict[int, float]]]:
    """Per arm: the lr grid on seed 0 by npas's rule (``npas.lr_next_factor``: upwards until a rate is
    clearly past the optimum, then past an edge optimum at most `MAX_EXTEND` times), then every other
    seed at the located rate. Returns ({arm: (lr multiple, interior)}, {arm: {seed: loss}})."""
    located, losses = {}, {}
    for arm in ARMS:
        tried, _ = walk_grid(arm, train)
        best = lr_best_factor(tried)
        interior = min(tried) < best < max(tried)
        located[arm] = (best, interior)
        losses[arm] = {0: tried[best]} | {s: train(arm, best, s) for s in mode.seeds if s != 0}
        if t0 is not None:
            print(f"  {arm}: lr x{best:g} ({'interior' if interior else 'EDGE'}) "
                  + " ".join(f"{m:g}:{v:.4f}" for m, v in sorted(tried.items()))
                  + f"; seeds {[round(losses[arm][s], 4) for s in mode.seeds]} [{time.perf_counter() - t0:.0f} s]",
                  flush=True)
    return located, losses


def code_version(mode: HFMode, cfg: ArchConfig) -> str:
    """The cache's code version (``experiments/harness/version.py``): the numerics and the settings every run
    shares (chassis, recipes, the allocation, the grid and its extensions), so changing any of them starts
    a fresh cache. The seeds are not in it: a run is keyed by its own seed, so adding seeds keeps the
    cached ones."""
    settings = {"chassis": mode.chassis.to_dict(), "dense": recipe_settings(mode.dense),
                "uptrain": recipe_settings(mode.uptrain), "allocation": cfg.hash, "grid": list(GRID),
                "max_extend": MAX_EXTEND}
    return harness_version("convert_hf", settings)


def run_key(arm: str, mult: float, seed: int, steps: int, version: str) -> str:
    """A run's record name in the store (its legacy file name): arm, lr multiple, seed, steps, code version."""
    return f"{arm}-x{mult:g}-s{seed}-{steps}-{version}.json"


@dataclass(frozen=True)
class Cache:
    """The run's cache folder at one code version: the runs' records, the dense model's Hugging Face
    directory and its record."""

    mode: HFMode
    cfg: ArchConfig
    out: Path
    version: str

    @classmethod
    def of(cls, mode: HFMode, cfg: ArchConfig, out: Path) -> Cache:
        return cls(mode, cfg, Path(out), code_version(mode, cfg))

    def steps(self, arm: str) -> int:
        return self.mode.dense.steps if arm == "dense" else arm_steps(self.mode)[arm]

    def path(self, arm: str, mult: float, seed: int) -> Path:
        if arm == "dense":
            return self.out / f"dense-{self.version}.json"
        return self.out / run_key(arm, mult, seed, self.steps(arm), self.version)

    @property
    def dense_dir(self) -> Path:
        return self.out / f"dense-{self.version}"

    def where(self) -> str:
        try:
            return str(self.out.resolve().relative_to(ROOT))
        except ValueError:
            return str(self.out)

    def known(self, arm: str, mult: float, seed: int) -> float | None:
        """A cached run's validation loss (NaN: it ran and failed, e.g. diverged), None when not cached."""
        p = self.path(arm, mult, seed)
        if not store.exists(p):
            return None
        val = store.load(p).get("val_loss")
        return math.nan if val is None else float(val)

    def dense_record(self) -> dict[str, Any] | None:
        p = self.path(*DENSE)
        return store.load(p) if store.exists(p) else None

    def dense_ready(self) -> bool:
        """The dense model trained and its Hugging Face directory in place, weights included (its record is
        committed, its ~1.5 MB of weights are not: a checkout without them retrains the dense model before a
        converted run, and its report still reads the record)."""
        rec = self.dense_record()
        return rec is not None and rec.get("status") == "ok" and all(
            (self.dense_dir / f).is_file() for f in ("config.json", "model.safetensors"))

    def dense_due(self, due: list[Job]) -> bool:
        """The dense model trains only when missing and a converted run is due."""
        return any(arm == "converted" for arm, _, _ in due) and not self.dense_ready()

    def cached_runs(self) -> int:
        """Records of the arms' runs at this version (the dense model's not counted)."""
        tail = f"-{self.version}.json"
        return sum(n.endswith(tail) and n.split("-", 1)[0] in ARMS for n in store.names(self.out))

    def spec(self, job: Job, device: str | None) -> dict[str, Any]:
        """What a pool worker needs to train ``job``, as plain data (spawned processes rebuild the rest)."""
        arm, mult, seed = job
        return {"arm": arm, "mult": mult, "seed": seed, "steps": self.steps(arm), "config": self.cfg.to_json(),
                "dense": self.mode.dense.to_dict(), "uptrain": self.mode.uptrain.to_dict(),
                "dense_dir": str(self.dense_dir), "device": device, "code_version": self.version}


def due_jobs(mode: HFMode, known: Callable[[str, float, int], float | None]) -> list[Job]:
    """The runs due now, given ``known(arm, mult, seed)`` (a cached loss, or None): per arm, the first
    factor npas's rule asks for on seed 0 that is not cached (one per arm: the rule's next step
    depends on its loss), or, once the arm's grid is walked, every missing seed at the located factor.
    The same walk as `locate_and_repeat`, so when nothing is due it can read its table from the cache."""
    due: list[Job] = []
    for arm in ARMS:
        tried, nxt = walk_grid(arm, known)
        if nxt is not None:
            due.append((arm, nxt, 0))
        else:
            best = lr_best_factor(tried)
            due += [(arm, best, s) for s in mode.seeds if s != 0 and known(arm, best, s) is None]
    return due


def run_hf(mode: HFMode, cfg: ArchConfig, device: str | None, out: Path = OUT, workers: int = 2,
           max_minutes: float | None = None) -> int:
    """Train what is due in rounds (`due_jobs`) on `workers` processes, each record cached the moment
    its run finishes, until nothing is due or `max_minutes` is spent (no run starts after it; runs in
    flight finish); then `report_hf`. A round's runs go longest first, so the long scratch runs do not
    end up last on one worker. Returns 1 when a run raised (not cached), else 0, complete or not."""
    cache = Cache.of(mode, cfg, out)
    t0 = time.perf_counter()
    print(f"cache {cache.where()} (code version {cache.version}): {cache.cached_runs()} runs cached; "
          f"{workers} worker(s)" + (f", time box {max_minutes:g} min" if max_minutes is not None else ""), flush=True)
    errors: list[dict[str, Any]] = []

    def save(job: Job, rec: dict[str, Any]) -> None:
        arm, mult, seed = job
        if rec["status"] == "error":
            errors.append(rec)
            print(f"  {arm} x{mult:g} s{seed}: ERROR (not cached) {rec['failure_reason']}", flush=True)
            return
        store.save(cache.path(*job), rec)
        val = "-" if rec["val_loss"] is None else f"{rec['val_loss']:.4f}"
        if arm == "dense":
            print(f"dense (read back from HF format): val {val} ({rec['wall_s']:.0f} s)", flush=True)
        else:
            print(f"  {arm:<21} x{mult:<6g} s{seed}: {rec['status']} val {val} ({rec['wall_s']:.0f} s) "
                  f"[{time.perf_counter() - t0:.0f} s]", flush=True)

    def fits(_job: Job) -> bool:
        return max_minutes is None or time.perf_counter() - t0 < max_minutes * 60

    rnd = 0
    while due := due_jobs(mode, cache.known):
        rnd += 1
        if not fits(due[0]):
            print(f"time box of {max_minutes:g} min spent: {len(due)} runs due now, not started", flush=True)
            break
        todo = list(due)
        if cache.dense_due(due):
            rec = cache.dense_record()
            if rec is not None and rec.get("status") != "ok":
                print(f"the dense model's cached run {rec.get('status')} ({rec.get('failure_reason')}): converted runs "
                      f"cannot start; forget {cache.path(*DENSE).name} (experiments/harness/store.py) to retrain it")
                return 1
            todo = [DENSE] + [j for j in todo if j[0] != "converted"]  # converted: next round, from its weights
        todo.sort(key=lambda j: -cache.steps(j[0]))
        print(f"round {rnd}: {describe(todo)}", flush=True)
        ran = run_pool(todo, train_job, lambda j: (cache.spec(j, device),), save, workers, fits)
        if errors:
            print(f"{len(errors)} run(s) raised; fix and rerun (finished runs are cached)")
            return 1
        if ran == 0:
            break
    report_hf(mode, cfg, out)
    return 0


def report_hf(mode: HFMode, cfg: ArchConfig, out: Path = OUT) -> int:
    """The table from the cache alone (trains nothing): `locate_and_repeat` with a `train` that only
    reads. Returns 0 when every run is cached; else says INCOMPLETE and what is due, and returns 1."""
    cache = Cache.of(mode, cfg, out)
    rec = cache.dense_record()
    if rec is not None:
        val = "-" if rec.get("val_loss") is None else f"{rec['val_loss']:.4f}"
        print(f"dense (read back from HF format): val {val} ({rec['wall_s']:.0f} s to train, {cache.where()}/"
              f"{cache.dense_dir.name})")
    due = due_jobs(mode, cache.known)
    if due:
        print(f"INCOMPLETE: {cache.cached_runs()} runs cached in {cache.where()} (code version {cache.version}); "
              f"due now: {describe(due)}{' (and the dense model first)' if cache.dense_due(due) else ''}; "
              f"the rate walk decides what follows them")
        return 1
    tried: dict[str, dict[float, float]] = {arm: {} for arm in ARMS}

    def read(arm: str, mult: float, seed: int) -> float:
        loss = cache.known(arm, mult, seed)
        if loss is None:  # due_jobs found nothing due: the same walk reads only cached runs
            raise AssertionError(f"{arm} x{mult:g} s{seed} is not cached")
        if seed == 0:
            tried[arm][mult] = loss
        return loss

    located, losses = locate_and_repeat(mode, read)
    for arm in ARMS:
        best, interior = located[arm]
        print(f"  {arm}: lr x{best:g} ({'interior' if interior else 'EDGE'}) "
              + " ".join(f"{m:g}:{v:.4f}" for m, v in sorted(tried[arm].items()))
              + f"; seeds {[round(losses[arm][s], 4) for s in mode.seeds]}")
    print_table(mode, located, losses)
    return 0


def print_table(mode: HFMode, located: dict[str, tuple[float, bool]], losses: dict[str, dict[int, float]]) -> None:
    """The arms' table and the two paired verdicts."""
    print("\n| arm | lr | rate | " + " | ".join(f"seed {s}" for s in mode.seeds) + " | mean |")
    print("|---|---|---|" + "---|" * len(mode.seeds) + "---|")
    for arm in ARMS:
        vals = [losses[arm][s] for s in mode.seeds]
        print(f"| {arm} | {mode.uptrain.lr * located[arm][0]:.2e} | {'interior' if located[arm][1] else 'edge'} | "
              + " | ".join(f"{v:.4f}" for v in vals) + f" | {statistics.mean(vals):.4f} |")
    for other, label in (("scratch_equal_uptrain", "equal uptraining"), ("scratch_equal_total", "equal total steps")):
        diff = [losses["converted"][s] - losses[other][s] for s in mode.seeds]
        ci = paired_delta([losses["converted"][s] for s in mode.seeds], [losses[other][s] for s in mode.seeds])
        mean, half = ci.value, (math.nan if ci.high is None else ci.high - ci.value)
        wins = sum(d < 0 for d in diff)
        verdict = "PASS" if wins == len(diff) else "MISS"
        if other == "scratch_equal_total":
            verdict = f"converted {'better' if mean < 0 else 'worse'} (reported, no target)"
        print(f"converted vs scratch at {label}: paired diff {mean:+.4f} ± {half:.4f} nats (95% t), converted better "
              f"on {wins}/{len(diff)} seeds -> {verdict}")
