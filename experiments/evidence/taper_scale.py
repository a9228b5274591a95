"""Tapered MLP widths at 16x the CPU scale: does the taper conclusion survive d_model 256 x 8 layers?

The CPU evidence (``taper.py``) trains d_model 64 x 8 layers (0.4M parameters). This experiment
repeats its four arms -- uniform, front-heavy cosine, reverse and hourglass MLP-width tapers (ratio 3,
i.e. 1.5x -> 0.5x of d_ff), each fitted to the uniform model's stored parameters with
``fit.width: mlp`` -- on the d_model 256 x 8-layer chassis (6.3M parameters, 16x the CPU chassis'
non-embedding parameters), each arm on 5 seeds for ~20M tokens (1,220 steps x 64 x 256 tokens,
~3 tokens per parameter), on a lent H200 in bf16 autocast (``experiments/device.py``).

Held equal: stored parameters (to within one width step) and FLOPs per token (linear in the summed
MLP width, so equal with them) -- both printed. Validation windows are fixed and independent of the
seed; seeds pair the arms (same init stream, same batches). Per arm it also runs a 3-point learning
rate check (x0.5, x1, x2 of the base rate) on seed 99, which is not among the reported ones, and
one fp32 run of the uniform arm calibrates bf16 against fp32.

Verdicts (paired Δ to uniform, 95% t-interval over the 5 seeds): "reproduced" when the interval
excludes 0 in the paper's direction (cosine below uniform; reverse above it), "contradicted" when
it excludes 0 the other way, otherwise "unresolved at this scale". The CPU-scale result from
``results/taper.json`` is put through the same rule beside it.

    python experiments/evidence/taper_scale.py --plan      the runs, tokens and estimated GPU time
    python experiments/device.py export --groups taper_scale    (then run on the device, then collect)
    python experiments/evidence/taper_scale.py             the report from the cached runs
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
from typing import Any

import common  # noqa: E402  (experiments/evidence is on sys.path when run as a script)
import stats  # noqa: E402
from report import format_table, json_safe  # noqa: E402

from experiments.harness.jobs import Runs  # noqa: E402  (common put the checkout on sys.path)
from experiments.harness.version import code_version, recipe_settings  # noqa: E402
from npas import ArchConfig, Chassis, Recipe

ROOT = common.ROOT
RUNS = ROOT / "experiments" / "evidence" / "results" / "taper_scale_runs"
SUMMARY = ROOT / "experiments" / "evidence" / "results" / "taper_scale.json"
CHASSIS = Chassis(vocab_size=common.VOCAB, context=256, d_model=256, n_layers=8, n_heads=4, d_ff=1024)
RECIPE = Recipe(name="taper-scale", seq_len=256, batch_size=64, steps=1220, lr=3e-3, min_lr=3e-4, warmup_steps=100,
                eval_every=305, eval_batches=16, threads=1, dtype="bfloat16")
SEEDS = (0, 1, 2, 3, 4)
LR_SEED, LR_FACTORS = 99, (0.5, 1.0, 2.0)
ARMS = {"uniform": {"taper": "uniform"}, "cosine": {"taper": "cosine", "taper_ratio": 3.0},
        "reverse": {"taper": "reverse", "taper_ratio": 3.0}, "hourglass": {"taper": "hourglass", "taper_ratio": 3.0}}
REF = "uniform"
CLAIMS = {"cosine": -1, "reverse": +1}  # the paper's direction of (arm - uniform)


@functools.cache
def configs() -> dict[str, ArchConfig]:
    return {name: common.fit(CHASSIS, "1x", width_fit="mlp", **knobs).config for name, knobs in ARMS.items()}


def version() -> str:
    """The runs' code version (``experiments/harness/version.py``): the numerics, the recipe and the chassis."""
    return code_version("taper_scale", [recipe_settings(RECIPE), CHASSIS.__dict__])


def runs() -> list[dict[str, Any]]:
    """(arm, seed, lr, dtype, role) of every run; the reported seeds first, then calibration and lr checks."""
    out = [{"arm": a, "seed": s, "lr": RECIPE.lr, "dtype": "bfloat16", "role": "report"} for s in SEEDS for a in ARMS]
    out.append({"arm": REF, "seed": SEEDS[0], "lr": RECIPE.lr, "dtype": "float32", "role": "fp32"})
    out += [{"arm": a, "seed": LR_SEED, "lr": RECIPE.lr * f, "dtype": "bfloat16", "role": "lr_check"}
            for f in LR_FACTORS for a in ARMS]
    return out


def key(r: dict[str, Any], v: str) -> str:
    return f"{r['arm']}-s{r['seed']}-lr{r['lr']:.4g}-{r['dtype']}-{v}"


def recipe_of(r: dict[str, Any]) -> Recipe:
    return Recipe.from_dict({**RECIPE.to_dict(), "seed": r["seed"], "lr": r["lr"], "min_lr": r["lr"] / 10,
                             "dtype": r["dtype"]})


def runs_of(v: str) -> Runs:
    """The experiment's runs as the harness reads and exports them (``experiments/harness/jobs.py``)."""
    return Runs(runs(), lambda r: RUNS / f"{key(r, v)}.json", lambda r: (configs()[r["arm"]], recipe_of(r), CHASSIS),
                lambda r: {**r, "code_version": v})


def device_specs() -> list[dict]:
    return runs_of(version()).device_specs(
        test=True, est_s=lambda r: RECIPE.steps * (0.012 if r["dtype"] == "float32" else 0.006))


def t_interval(d: list[float]) -> tuple[float, float, float]:
    """Mean and 95% t-interval of paired differences (npas.service.study.fidelity's, as `npas validate` uses)."""
    from npas.service.study.fidelity import mean_interval

    iv = mean_interval(d)
    return (iv.value,) + tuple(math.nan if x is None else x for x in (iv.low, iv.high))


def verdict(lo: float, hi: float, direction: int) -> str:
    if math.isnan(lo):
        return "unresolved (too few seeds)"
    if (direction < 0 and hi < 0) or (direction > 0 and lo > 0):
        return "reproduced"
    if (direction < 0 and lo > 0) or (direction > 0 and hi < 0):
        return "contradicted"
    return f"unresolved at this scale (interval width {hi - lo:.3f})"


def survives(cpu: tuple, d256: tuple[float, float, float], direction: int, margin: float = stats.PARITY_MARGIN) -> str:
    """Does a conclusion reproduced at CPU scale survive at d256? "survives" when d256 reproduces it too;
    "does not survive" only when the d256 interval lies inside +-margin (the effect shown absent, at the
    parity margin the evidence uses for "on par"); otherwise unresolved, with the end that is outside."""
    if verdict(cpu[1], cpu[2], direction) != "reproduced":
        return "-"  # no CPU conclusion to carry over
    m, lo, hi = d256
    if math.isnan(lo):
        return "unresolved (too few seeds)"
    if verdict(lo, hi, direction) == "reproduced":
        return "survives"
    if -margin < lo and hi < margin:
        return f"does not survive: the d256 interval lies inside ±{margin:.2f}"
    ends = [f"{name} end {e:+.4f}" for name, e in (("lower", lo), ("upper", hi)) if abs(e) >= margin]
    return (f"unresolved at the ±{margin:.2f} margin: the effect shrank from {cpu[0]:+.3f} to {m:+.4f}, but the d256 "
            f"interval [{lo:+.4f}, {hi:+.4f}] is not inside ±{margin:.2f} ({', '.join(ends)} outside), so it is "
            "not shown to be gone")


def load(v: str) -> dict[tuple, dict]:
    return {(r["arm"], r["seed"], round(r["lr"], 10), r["dtype"]): rec for r, rec in runs_of(v).cached()
            if rec.get("status") == "ok"}


def cpu_scale() -> dict[str, tuple]:
    """The CPU-scale taper result (results/taper.json) through the same paired rule."""
    p = common.RESULTS_DIR / "taper.json"
    if not p.exists():
        return {}
    summ = {r["name"]: r["per_seed"] for r in json.loads(p.read_text())["summary"]}
    out = {}
    for arm in ARMS:
        if arm == REF or arm not in summ:
            continue
        seeds = sorted(set(summ[arm]) & set(summ[REF]))
        out[arm] = t_interval([summ[arm][s] - summ[REF][s] for s in seeds]) + (len(seeds),)
    return out


def report(v: str) -> dict[str, Any]:
    res, cfgs = load(v), configs()
    base = round(RECIPE.lr, 10)
    print(f"[taper_scale] chassis d_model {CHASSIS.d_model} x {CHASSIS.n_layers} layers, {RECIPE.steps} steps x "
          f"{RECIPE.tokens_per_step} tokens = {RECIPE.steps * RECIPE.tokens_per_step / 1e6:.1f}M tokens a run, "
          f"lr {RECIPE.lr:g}, seeds {list(SEEDS)} | code {v} | {len(res)}/{len(runs())} runs cached")
    ref_cfg = cfgs[REF]
    acc = {a: common.accounting_row(a, c, ref_cfg) for a, c in cfgs.items()}
    common.print_accounting(list(acc.values()))
    tpp = RECIPE.steps * RECIPE.tokens_per_step / acc[REF]["stored_params"]
    print(f"tokens per stored parameter: {tpp:.1f}")
    rows, summary = [], {"chassis": CHASSIS.__dict__, "recipe": RECIPE.to_dict(), "code_version": v,
                         "tokens_per_param": tpp, "arms": {}, "cpu_scale": {}}
    cpu = cpu_scale()
    for arm in ARMS:
        vals = {s: res[arm, s, base, "bfloat16"]["test_loss"] for s in SEEDS if (arm, s, base, "bfloat16") in res}
        ref = {s: res[REF, s, base, "bfloat16"]["test_loss"] for s in SEEDS if (REF, s, base, "bfloat16") in res}
        paired = [vals[s] - ref[s] for s in sorted(set(vals) & set(ref))]
        m, lo, hi = t_interval(paired) if paired else (math.nan,) * 3
        lrs = {f: res[arm, LR_SEED, round(RECIPE.lr * f, 10), "bfloat16"]["test_loss"] for f in LR_FACTORS
               if (arm, LR_SEED, round(RECIPE.lr * f, 10), "bfloat16") in res}
        best_f = min(lrs, key=lrs.get) if len(lrs) == len(LR_FACTORS) else None
        verd = verdict(lo, hi, CLAIMS[arm]) if arm in CLAIMS and paired else "-"
        cpu_v = verdict(cpu[arm][1], cpu[arm][2], CLAIMS[arm]) if arm in CLAIMS and arm in cpu else "-"
        summary["arms"][arm] = {"test_loss_per_seed": vals, "paired_delta": paired, "delta_mean": m,
                                "ci95": [lo, hi], "verdict": verd, "lr_check": lrs, "lr_best_factor": best_f,
                                "wall_s": [res[arm, s, base, "bfloat16"]["wall_s"] for s in vals]}
        if arm in cpu:
            summary["cpu_scale"][arm] = {"delta_mean": cpu[arm][0], "ci95": [cpu[arm][1], cpu[arm][2]],
                                         "n": cpu[arm][3], "verdict": cpu_v}
        mean = statistics.fmean(vals.values()) if vals else math.nan
        sd = statistics.stdev(vals.values()) if len(vals) > 1 else math.nan
        rows.append([arm, f"{mean:.4f} ± {sd:.4f}", len(vals), "-" if arm == REF else f"{m:+.4f} [{lo:+.4f}, {hi:+.4f}]",
                     verd, "-" if arm not in cpu else f"{cpu[arm][0]:+.3f} [{cpu[arm][1]:+.3f}, {cpu[arm][2]:+.3f}] {cpu_v}",
                     "-" if best_f is None else stats.optimum_words(best_f, LR_FACTORS)])
    print(format_table(["arm", "test loss (nats)", "seeds", f"paired Δ vs {REF}, 95% CI", "verdict (d256)",
                               "CPU d64: Δ, 95% CI, verdict", "lr optimum (seed 99)"], rows))
    for arm, a in summary["arms"].items():
        if arm in CLAIMS and arm in cpu:
            a["cpu_conclusion_at_d256"] = survives(cpu[arm], (a["delta_mean"], *a["ci95"]), CLAIMS[arm])
            if a["cpu_conclusion_at_d256"] != "-":
                print(f"does the CPU conclusion ({arm} {'above' if CLAIMS[arm] > 0 else 'below'} {REF}) survive at "
                      f"d{CHASSIS.d_model}? {a['cpu_conclusion_at_d256']}")
    fp32 = res.get((REF, SEEDS[0], base, "float32"))
    bf16 = res.get((REF, SEEDS[0], base, "bfloat16"))
    if fp32 and bf16:
        summary["fp32_calibration"] = {"fp32": fp32["test_loss"], "bf16": bf16["test_loss"],
                                       "delta": bf16["test_loss"] - fp32["test_loss"]}
        print(f"fp32 calibration ({REF}, seed {SEEDS[0]}): fp32 {fp32['test_loss']:.4f}, bf16 {bf16['test_loss']:.4f}, "
              f"bf16 - fp32 = {bf16['test_loss'] - fp32['test_loss']:+.4f} nats")
    walls = [r["wall_s"] for r in res.values()]
    if walls:
        print(f"runs: {len(walls)}, wall per run {statistics.fmean(walls):.0f} s mean (several at once on one GPU), "
              f"device {next(iter(res.values())).get('device_name', '?')}")
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--plan", action="store_true")
    p.add_argument("--code-version", default=None, help="report the cached runs of this code version")
    a = p.parse_args(argv)
    v = a.code_version or version()
    if a.plan:
        tok = sum(recipe_of(r).steps * RECIPE.tokens_per_step for r in runs())
        print(f"{len(runs())} runs, {tok / 1e6:.0f}M tokens in all; code {v}")
        return 0
    summary = report(v)
    SUMMARY.write_text(json.dumps(json_safe(summary), indent=1, default=str))
    print(f"wrote {SUMMARY.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
