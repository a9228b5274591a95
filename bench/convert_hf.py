"""`bench/convert.py --hf` (issue 37, item 6): a LLaMA-family model trained here and saved in Hugging Face
format, converted to cycle tying + LoRA at 0.5x its parameters and uptrained, against the same allocation
from scratch at equal uptraining and at equal total steps.

Each arm trains at its *located* rate: a learning-rate grid (multiples of the recipe's lr) on seed 0,
walked upwards by npas's own rule (`npas.lr_next_factor`: a rate clearly worse than the best so far
ends the walk up, an edge optimum extends one step, at most `MAX_EXTEND` times), then every seed at
that rate. Comparisons are paired by seed (same seed, same validation batches): the mean
difference with a 95% t-interval.

PASS: converted + uptraining beats scratch at equal uptraining on every seed. The equal-total-steps
comparison (scratch trained for the dense model's steps plus the uptraining's) is reported with its
verdict either way.
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import optuna
import torch

from bench.harness.recipes import bench_recipe  # noqa: E402
from npas import (
    ArchConfig,
    Chassis,
    Recipe,
    count,
    lr_best_factor,
    lr_next_factor,
    parse_space,
    reference_config,
)

GRID = (0.25, 0.5, 1.0, 2.0, 4.0)  # multiples of the recipe's lr tried on seed 0
MAX_EXTEND = 2  # extensions of the grid past an edge optimum (x2 or /2 each)
# training FLOP/s of one CPU thread for the plan's estimate: bench/proxy_fidelity.py --plan measured
# 20.3 GFLOP/s per worker at d_model 128 on this (shared, loaded) machine on 2026-12-02; bench/lr_transfer.py
# states 50 on a quiet one. The estimate uses the loaded figure and prints the quiet one beside it.
CPU_FLOPS, QUIET_CPU_FLOPS = 2.0e10, 5.0e10


@dataclass(frozen=True)
class HFMode:
    chassis: Chassis
    dense: Recipe
    uptrain: Recipe
    seeds: tuple[int, ...]


def hf_modes() -> dict[str, HFMode]:
    full = Chassis(vocab_size=68, context=128, d_model=128, n_layers=8, n_heads=4, d_ff=352, activation="swiglu",
                   family="llama", n_kv_heads=2, rms_norm_eps=1e-5)
    quick = Chassis(vocab_size=68, context=64, d_model=64, n_layers=4, n_heads=4, d_ff=176, activation="swiglu",
                    family="llama", n_kv_heads=2, rms_norm_eps=1e-5)
    smoke = bench_recipe("smoke")
    return {"full": HFMode(full, bench_recipe("long"), bench_recipe("proxy"), (0, 1, 2, 3, 4)),
            "quick": HFMode(quick, smoke.with_steps(300), smoke.with_steps(100), (0, 1))}


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


def with_lr(recipe: Recipe, mult: float, seed: int, steps: int | None = None) -> Recipe:
    d = recipe.to_dict()
    ratio = recipe.min_lr / recipe.lr
    d.update(lr=recipe.lr * mult, min_lr=recipe.lr * mult * ratio, seed=seed)
    out = Recipe.from_dict(d)
    return out if steps is None else out.with_steps(steps)


ARMS = ("converted", "scratch_equal_uptrain", "scratch_equal_total")


def arm_steps(mode: HFMode) -> dict[str, int]:
    """Optimizer steps of one training run of each arm."""
    u = mode.uptrain.steps
    return {"converted": u, "scratch_equal_uptrain": u, "scratch_equal_total": mode.dense.steps + u}


def plan_steps(mode: HFMode) -> dict[str, int]:
    """The run's optimizer steps: the dense model's, the seed-0 grids', the other seeds' and the total,
    with every grid point trained and no extension ("total") and with every arm extended `MAX_EXTEND`
    times ("at_most"): the most `locate_and_repeat` spends without and with extensions; a grid that
    stops going up early spends less (tests/bench/test_convert_hf_plan.py runs it on a stub)."""
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


def print_hf_plan(mode: HFMode, cfg: ArchConfig) -> None:
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
          f"{QUIET_CPU_FLOPS / 1e9:.0f}); nothing is cached: every run trains")


def locate_and_repeat(mode: HFMode, train: Callable[[str, float, int], float], t0: float | None = None
                      ) -> tuple[dict[str, tuple[float, bool]], dict[str, dict[int, float]]]:
    """Per arm: the lr grid on seed 0 by npas's rule (``npas.lr_next_factor``: upwards until a rate is
    clearly past the optimum, then past an edge optimum at most `MAX_EXTEND` times), then every other
    seed at the located rate. Returns ({arm: (lr multiple, interior)}, {arm: {seed: loss}})."""
    located, losses = {}, {}
    for arm in ARMS:
        tried: dict[float, float] = {}
        while (m := lr_next_factor(tried, GRID, 2.0, MAX_EXTEND)) is not None:
            tried[m] = train(arm, m, 0)
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


def _t95(n: int) -> float:
    from scipy import stats

    return float(stats.t.ppf(0.975, n - 1)) if n > 1 else math.nan


def run_hf(mode: HFMode, cfg: ArchConfig, device: str | None) -> int:
    from npas import (
        calibration_ids,
        convert_model,
        eval_batches,
        evaluate,
        load_corpus,
        read_hf_dir,
        train_model,
        write_hf,
    )

    corpus = load_corpus(None, mode.dense.val_fraction, mode.dense.test_fraction)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    evals = eval_batches(corpus, mode.uptrain)
    t0 = time.perf_counter()
    dense, _ = train_model(reference_config(mode.chassis), mode.dense, corpus, device=dev)
    with tempfile.TemporaryDirectory() as tmp:
        write_hf(dense.to("cpu"), reference_config(mode.chassis), Path(tmp) / "llama-hf", corpus.tokenizer)
        ck = read_hf_dir(Path(tmp) / "llama-hf")
    dense_val = evaluate(ck.model.to(dev), evals, dev, mode.uptrain)
    ck.model.to("cpu")
    print(f"dense (read back from HF format): val {dense_val:.4f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    calibration = calibration_ids(corpus, mode.uptrain.seq_len)
    total = mode.dense.steps + mode.uptrain.steps

    def train(arm: str, mult: float, seed: int) -> float:
        steps = total if arm == "scratch_equal_total" else mode.uptrain.steps
        recipe = with_lr(mode.uptrain, mult, seed, steps)
        init = None
        if arm == "converted":
            init = {k: v.clone() for k, v in convert_model(ck.model, cfg, seed=seed,
                                                           calibration=calibration).model.state_dict().items()}
        return train_model(cfg, recipe, corpus, device=dev, init_state=init)[1].val_loss

    located, losses = locate_and_repeat(mode, train, t0)
    print("\n| arm | lr | rate | " + " | ".join(f"seed {s}" for s in mode.seeds) + " | mean |")
    print("|---|---|---|" + "---|" * len(mode.seeds) + "---|")
    for arm in ARMS:
        vals = [losses[arm][s] for s in mode.seeds]
        print(f"| {arm} | {mode.uptrain.lr * located[arm][0]:.2e} | {'interior' if located[arm][1] else 'edge'} | "
              + " | ".join(f"{v:.4f}" for v in vals) + f" | {statistics.mean(vals):.4f} |")
    for other, label in (("scratch_equal_uptrain", "equal uptraining"), ("scratch_equal_total", "equal total steps")):
        diff = [losses["converted"][s] - losses[other][s] for s in mode.seeds]
        mean = statistics.mean(diff)
        half = _t95(len(diff)) * statistics.stdev(diff) / math.sqrt(len(diff)) if len(diff) > 1 else math.nan
        wins = sum(d < 0 for d in diff)
        verdict = "PASS" if wins == len(diff) else "MISS"
        if other == "scratch_equal_total":
            verdict = f"converted {'better' if mean < 0 else 'worse'} (reported, no target)"
        print(f"converted vs scratch at {label}: paired diff {mean:+.4f} ± {half:.4f} nats (95% t), converted better "
              f"on {wins}/{len(diff)} seeds -> {verdict}")
    return 0
