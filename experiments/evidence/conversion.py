"""Conversion from a trained model: does a recursive model converted from a trained dense one beat the
same model trained from scratch?

    python experiments/evidence/conversion.py --plan     # runs x tokens -> CPU-hours, what is cached; trains nothing
    python experiments/evidence/conversion.py            # report: d_model 64, 8 layers, 5 seeds
    python experiments/evidence/conversion.py --quick    # smoke run
    python experiments/evidence/conversion.py --best-rates   # each recursive arm at its checked optimum (5 seeds)

Claim (Relaxed Recursive Transformers): a recursive model initialised from a pretrained dense one (each
tied block from the layers it replaces, per-position LoRA from a truncated SVD of what tying lost) and
then uptrained recovers most of the dense model's quality, and that initialisation beats random init.
The paper converts a pretrained Gemma; here the dense model is the evidence chassis's untied reference
trained with the evidence recipe on each seed, and `npas.conversion` (what `npas convert` runs) maps it.

Arms, per seed s:
  dense            the untied reference, the evidence recipe (1,000 steps), seed s; its weights are saved
  converted        dense s converted into cycle tying U = L/2 with LoRA r = 16 on attention and MLP
                   (alpha / r), then uptrained for a quarter of the recipe's steps on seed s
  scratch_uptrain  the same allocation from random init, trained for the same uptraining steps
  scratch_lineage  the same allocation from random init for dense + uptraining steps: as many optimizer
                   steps as the converted model's whole lineage saw

Held equal (printed): the three recursive arms are one allocation (stored params, FLOPs per token), data
and seeds. The dense model's FLOPs per token equal the recursive model's (tying keeps every shape and
npas merges each LoRA delta into its weight once per step, the merge cost printed), so
scratch_lineage also matches the converted lineage's training FLOPs up to that merge cost. Not equal:
stored params of dense vs recursive (printed). The learning-rate check (x0.5, x1, x2 on seed 99) covers
the three recursive arms; the converted arm's check converts the seed-99 dense model once and uptrains
it at each rate. The dense arm is the untied reference, whose check the other experiments report.

`--best-rates` is the second rate the issue asks for when an arm's optimum moved. `--lr-factor` cannot
give it here: it scales every arm, the dense parent too, so the converted model would start from a
different parent. Instead each recursive arm trains its reported seeds at its own optimum from the
cached check (seed 99), the dense parent stays as trained, and the report is `conversion_best.json`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import common
import report
import runs
import stats

from experiments.harness import jobs as harness_jobs  # runs put the checkout on sys.path
from experiments.harness import store
from npas import ArchConfig, Recipe, reference_config
from npas.allocation.layer_maps import tying_map

RANK = 16
UPTRAIN_FRACTION = 4  # uptraining = a quarter of the recipe's steps
DENSE, CONVERTED, SCRATCH_UP, SCRATCH_LINEAGE = "dense", "converted", "scratch_uptrain", "scratch_lineage"
ARMS = (DENSE, CONVERTED, SCRATCH_UP, SCRATCH_LINEAGE)
# (arm, reference, kind, words): the paired claims
CLAIMS = (
    (CONVERTED, SCRATCH_UP, "better",
     "the paper's: converting a trained model beats random init at equal uptraining steps"),
    (CONVERTED, SCRATCH_LINEAGE, "better",
     "our test: converted + uptraining beats random init at equal optimizer steps of the whole lineage"),
    (CONVERTED, DENSE, "parity", "the paper's: the converted model reaches its dense parent (as trained, lr x1)"),
)
# The dense parent's twin in the other experiments: their `untied` arm is the same config and recipe (each
# dense run reproduces it bit for bit), and relaxed.py / atoms.py ran its learning-rate check and its seeds at
# --lr-factor 2, so the parent's own best checked rate is read from those cached runs (nothing trains).
DENSE_TWIN = "untied"


def relaxed_config(ch) -> ArchConfig:
    L = ch.n_layers
    r = min(RANK, ch.d_model // 2)
    return ArchConfig(chassis=ch, mlp_widths=(ch.d_ff,) * L, block_of_layer=tying_map("cycle", L, max(1, L // 2)),
                      lora_attn=(r,) * L, lora_mlp=(r,) * L)


def recipes(recipe: Recipe) -> tuple[Recipe, Recipe]:
    """(uptraining: a quarter of the recipe's steps and warmup; lineage: dense + uptraining steps)."""
    steps = max(2, recipe.steps // UPTRAIN_FRACTION)
    up = Recipe.from_dict({**recipe.to_dict(), "name": f"{recipe.name}-uptrain", "steps": steps,
                           "warmup_steps": max(1, recipe.warmup_steps // UPTRAIN_FRACTION),
                           "eval_every": max(1, steps // 2)})
    lineage = Recipe.from_dict({**recipe.to_dict(), "name": f"{recipe.name}-lineage",
                                "steps": recipe.steps + steps})
    return up, lineage


def weights_dir(setup: common.Setup) -> Path:
    """Trained dense and freshly converted weights (safetensors; ignored by git: a later session whose
    converted runs are not all cached retrains the dense model, which is deterministic per seed)."""
    return (setup.cache / "conversion_weights") if setup.cache else setup.out_dir / "conversion_weights"


def version() -> str:
    """The experiment's code version (``runs.code_version``), one for every phase (dense, converted,
    scratch, the learning-rate check) and for ``--best-rates``, whose runs are the same kind."""
    return runs.code_version("conversion")


def stem(job: dict[str, Any]) -> str:
    return Path(runs.cache_path(job, Path("."), "w", version())).stem


def before_uptraining_file(setup: common.Setup, cfg: ArchConfig, dense_job: dict[str, Any]) -> Path:
    """The converted model's score before uptraining: a small record kept with the cached runs (the
    weights it came from are not kept)."""
    folder = setup.cache if setup.cache else setup.out_dir
    return folder / f"conversion-before-uptraining-{cfg.hash[:12]}-from-{stem(dense_job)}.json"


def dense_jobs(setup: common.Setup, cfg: ArchConfig, seeds: list[int]) -> list[dict[str, Any]]:
    jobs = runs.make_jobs({DENSE: cfg}, setup, seeds=seeds)
    for j in jobs:
        j["save_weights"] = str(weights_dir(setup) / f"{stem(j)}.safetensors")
    return jobs


def convert(setup: common.Setup, dense_job: dict[str, Any], cfg: ArchConfig, up: Recipe) -> tuple[str, float]:
    """Convert the seed's trained dense model into `cfg` (what `npas convert` does), save the weights the
    uptraining starts from, and score the converted model before any uptraining (cached beside them)."""
    import torch
    from safetensors.torch import load_file, save_file

    from npas import build_model, convert_model
    from npas.allocation.transformer import export_state
    from npas.conversion.calibration import calibration_ids
    from npas.training.proxy import eval_batches, evaluate

    seed = dense_job["recipe"]["seed"]
    dest = weights_dir(setup) / f"converted-{cfg.hash[:12]}-from-{stem(dense_job)}.safetensors"
    at0_file = before_uptraining_file(setup, cfg, dense_job)
    if dest.exists() and store.exists(at0_file):
        return str(dest), store.load(at0_file)["val_loss"]
    if store.exists(at0_file) and not Path(dense_job["save_weights"]).exists():  # every uptraining run is cached
        return "", store.load(at0_file)["val_loss"]
    dense = build_model(ArchConfig.from_dict(dense_job["config"])).float()
    dense.load_state_dict(load_file(dense_job["save_weights"]))
    corpus = harness_jobs.corpus(up)
    conv = convert_model(dense, cfg, seed=seed, calibration=calibration_ids(corpus, up.seq_len))
    with torch.no_grad():
        at0 = evaluate(conv.model.float(), eval_batches(corpus, up), torch.device("cpu"), up)
    save_file(export_state(conv.model), str(dest))
    store.save(at0_file, {"seed": seed, "val_loss": at0})
    return str(dest), float(at0)


def best_factors(check: dict[str, dict[float, float | None]]) -> dict[str, float]:
    """Each arm's learning-rate factor with the lowest check loss; every cell must be there (a partial
    check could name a wrong optimum)."""
    missing = sorted(f"{arm} x{f:g}" for arm, cells in check.items() for f, v in cells.items() if v is None)
    if missing:
        raise SystemExit(f"--best-rates: the learning-rate check is not cached ({', '.join(missing)} missing); "
                         "run conversion.py without --best-rates first")
    return {arm: min(cells, key=lambda f: cells[f]) for arm, cells in check.items()}


def _cached_loss(setup: common.Setup, job: dict[str, Any]) -> float | None:
    rec = runs.cached([job], setup.cache, version()).get(0)
    return rec.get("val_loss") if rec is not None and rec.get("status") == "ok" else None


def dense_at_its_best(setup: common.Setup, dense_cfg: ArchConfig) -> tuple[float | None, dict[float, float | None],
                                                                             list[dict[str, Any]]]:
    """The dense parent at its own best checked rate, from the cache only: (the factor, or None while the
    twin's check is incomplete; the check's seed-99 losses; the reported seeds' records at that factor,
    named ``dense xF``). The parent the converted model came from trained at x1, so "reaches the dense
    model" at x1 compares with a parent below its best; this is the comparison at the parent's best."""
    if setup.cache is None:
        return None, {}, []
    check = {f: _cached_loss(setup, runs.make_jobs({DENSE_TWIN: dense_cfg}, setup, setup.recipe.with_lr_factor(f),
                                                   seeds=[common.LR_CHECK_SEED])[0])
             for f in common.LR_CHECK_FACTORS}
    if any(v is None for v in check.values()):
        return None, check, []
    best = min(check, key=lambda f: check[f])
    jobs = runs.make_jobs({DENSE_TWIN: dense_cfg}, setup, setup.recipe.with_lr_factor(best))
    return best, check, [{**rec, "name": f"{DENSE} x{best:g}"} for rec in runs.cached(jobs, setup.cache, version()).values()
                         if rec.get("status") == "ok"]


def main() -> None:
    parser = common.arg_parser(__doc__)
    parser.add_argument("--best-rates", action="store_true",
                        help="train each recursive arm's reported seeds at its optimum from the cached learning-rate "
                             "check (the dense parent as trained); report conversion_best.json")
    args = parser.parse_args()
    if args.arms:
        raise SystemExit("--arms: conversion.py trains its arms in dependent phases (dense, then converted); "
                         "run it whole, it resumes from its cache")
    if args.best_rates and (args.quick or args.lr_factor != 1.0):
        raise SystemExit("--best-rates reads the full run's learning-rate check: drop --quick and --lr-factor")
    setup = common.setup_from(args, "conversion_best" if args.best_rates else "conversion")
    ch = setup.chassis
    dense_cfg, cfg = reference_config(ch), relaxed_config(ch)
    up, lineage = recipes(setup.recipe)
    acc = {DENSE: common.accounting_row(DENSE, dense_cfg, dense_cfg)}
    for name in (CONVERTED, SCRATCH_UP, SCRATCH_LINEAGE):
        acc[name] = common.accounting_row(name, cfg, dense_cfg)
    common.print_accounting(list(acc.values()))
    tok = setup.recipe.tokens_per_step
    fpt = acc[CONVERTED]["flops_per_token"]
    merge = acc[CONVERTED]["generation_flops_per_step"]
    steps = {DENSE: setup.recipe.steps, CONVERTED: setup.recipe.steps + up.steps, SCRATCH_UP: up.steps,
             SCRATCH_LINEAGE: lineage.steps}
    print(f"optimizer steps x {tok:,} tokens per arm's lineage: {steps}; LoRA merge {merge:,} FLOPs/step = "
          f"{merge / (fpt * tok):.1%} of a step's forward FLOPs; tokens per stored param (dense, 1 run): "
          f"{setup.recipe.steps * tok / acc[DENSE]['stored_params']:.1f}")
    arm_recipe = {CONVERTED: up, SCRATCH_UP: up, SCRATCH_LINEAGE: lineage}
    factor = dict.fromkeys(ARMS, 1.0)
    # the learning-rate check's runs (seed 99, each recursive arm): a plain run trains them, --best-rates reads them
    checks = {arm: [_job(setup, arm, cfg, rec, common.LR_CHECK_SEED, f) for f in common.LR_CHECK_FACTORS]
              for arm, rec in arm_recipe.items()} if not setup.quick and setup.lr_factor == 1.0 else {}
    if args.best_rates:
        factor.update(best_factors({arm: {f: _cached_loss(setup, j) for f, j in zip(common.LR_CHECK_FACTORS, jobs,
                                                                                    strict=True)}
                                    for arm, jobs in checks.items()}))
        print("each arm at its learning-rate check's optimum (x the recipe's rate): "
              + ", ".join(f"{a} x{f:g}" for a, f in factor.items()))
        edges = [f"{a} x{f:g}" for a, f in factor.items()
                 if a != DENSE and not stats.optimum_located(f, common.LR_CHECK_FACTORS)]
        if edges:
            print("at a grid edge, so the optimum is not located (the loss may fall further past it): "
                  + ", ".join(edges))
        checks = {}  # no check around a moved rate (as with --lr-factor)
    check = bool(checks)
    dseeds = list(setup.seeds) + ([common.LR_CHECK_SEED] if check else [])
    djobs = dense_jobs(setup, dense_cfg, dseeds)
    cjobs = [_job(setup, CONVERTED, cfg, up, s, factor[CONVERTED]) for s in setup.seeds] + checks.get(CONVERTED, [])
    scratch_jobs = {arm: [_job(setup, arm, cfg, arm_recipe[arm], s, factor[arm]) for s in setup.seeds]
                    + checks.get(arm, []) for arm in (SCRATCH_UP, SCRATCH_LINEAGE)}
    if setup.plan_only:  # every phase's runs in one plan, from the cache; nothing trains, nothing is written
        scratch = [j for jobs in scratch_jobs.values() for j in jobs]
        runs.run_jobs(djobs + cjobs + scratch, setup.workers, version(), setup.cache, plan_only=True)
        again = _forget_dense_without_weights(setup, djobs, cjobs, cfg, dry=True)
        if again:
            print(f"plus {len(again)} dense run(s) cached but retrained first, their weights being gone (seeds "
                  f"{sorted(again)}): {len(again) * setup.recipe.steps * setup.recipe.tokens_per_step / 1e6:.1f}M "
                  "tokens more")
        raise SystemExit(0)
    _forget_dense_without_weights(setup, djobs, cjobs, cfg)
    dense = runs.run_jobs(djobs, setup.workers, version(), setup.cache)
    ok = {r["seed"] for r in dense if r.get("status") == "ok"}
    missing = [s for s in dseeds if s not in ok]
    if missing:
        raise SystemExit(f"dense runs failed on seeds {missing}; see their records in {setup.cache}")
    at0: dict[int, float] = {}
    weights: dict[int, str] = {}
    for j in djobs:  # one conversion per dense model, shared by its seed's uptraining runs
        weights[j["recipe"]["seed"]], at0[j["recipe"]["seed"]] = convert(setup, j, cfg, up)
    for j in cjobs:
        j["init_weights"] = weights[j["recipe"]["seed"]]
    converted = runs.run_jobs(cjobs, setup.workers, version(), setup.cache)
    scratch = {arm: runs.run_jobs(jobs, setup.workers, version(), setup.cache)
               for arm, jobs in scratch_jobs.items()}
    main_seeds = set(setup.seeds)
    results = [r for r in dense + converted + scratch[SCRATCH_UP] + scratch[SCRATCH_LINEAGE]
               if r["seed"] in main_seeds]
    if check:
        rows = [r for r in converted if r["seed"] == common.LR_CHECK_SEED]
        print("converted arm's " + runs.lr_check_table(rows, [CONVERTED], up.lr))
        for arm, rec in ((SCRATCH_UP, up), (SCRATCH_LINEAGE, lineage)):
            rows = [r for r in scratch[arm] if r["seed"] == common.LR_CHECK_SEED]
            print(f"{arm}'s " + runs.lr_check_table(rows, [arm], rec.lr))
    report_results(setup, results, acc, at0, steps, factor, dense_at_its_best(setup, dense_cfg))


def _job(setup: common.Setup, arm: str, cfg: ArchConfig, recipe: Recipe, seed: int, factor: float) -> dict[str, Any]:
    """One recursive arm's run on ``seed`` at ``factor`` x the recipe's rate (the check's jobs are these too)."""
    job = runs.make_jobs({arm: cfg}, setup, recipe.with_lr_factor(factor), seeds=[seed])[0]
    if arm == CONVERTED:
        job["init_weights"] = ""  # set once the dense model exists (the cache key does not depend on it)
    return job


def _forget_dense_without_weights(setup: common.Setup, djobs, cjobs, cfg: ArchConfig, dry: bool = False) -> set[int]:
    """A cached dense record whose weights are gone (a new checkout) is retrained when a converted run
    of its seed still has to train or its before-uptraining score is missing; otherwise the records
    alone are all the report needs. Returns those seeds; ``dry`` (the plan) deletes nothing."""
    if setup.cache is None:
        return set()
    ver, kind = version(), runs.device_kind()
    todo = {j["recipe"]["seed"] for j in cjobs if not store.exists(runs.cache_path(j, setup.cache, kind, ver))}
    todo |= {j["recipe"]["seed"] for j in djobs if not store.exists(before_uptraining_file(setup, cfg, j))}
    again = set()
    for j in djobs:
        path = runs.cache_path(j, setup.cache, kind, ver)
        if j["recipe"]["seed"] in todo and store.exists(path) and not Path(j["save_weights"]).exists():
            again.add(j["recipe"]["seed"])
            if not dry:
                store.forget(path)
    return again


def report_results(setup: common.Setup, results: list[dict[str, Any]], acc: dict[str, dict], at0: dict[int, float],
                   steps: dict[str, int], factor: dict[str, float],
                   dense_best: tuple[float | None, dict[float, float | None], list[dict[str, Any]]]) -> None:
    summary = stats.summarize(results, list(ARMS), DENSE)
    print(f"\nresults: val loss, mean ± std over {len(setup.seeds)} seed(s); Δ is the paired same-seed difference "
          f"to {DENSE} (negative = better)")
    extra = {n: {"lineage steps": f"{s:,}", "lr x": f"{factor[n]:g}"} for n, s in steps.items()}
    print(report.result_table(summary, acc, DENSE, extra))
    seeds = sorted(s for s in at0 if s in set(setup.seeds))
    m0, s0 = stats.mean_std([at0[s] for s in seeds])
    dense = {r["seed"]: r["val_loss"] for r in results if r["name"] == DENSE}
    conv = {r["seed"]: r["val_loss"] for r in results if r["name"] == CONVERTED}
    scr = {r["seed"]: r["val_loss"] for r in results if r["name"] == SCRATCH_UP}
    gap0 = stats.mean_std([at0[s] - dense[s] for s in seeds if s in dense])
    print(f"right after conversion (no uptraining): val loss {report.fmt_pm(m0, s0)}; converted - dense "
          f"{report.fmt_pm(*gap0)} nats")
    shared = [s for s in seeds if s in dense and s in conv and s in scr and scr[s] != dense[s]]
    recovered = [(scr[s] - conv[s]) / (scr[s] - dense[s]) for s in shared]
    rec = stats.mean_std(recovered)
    print(f"recovered: (scratch_uptrain - converted) / (scratch_uptrain - dense) = {report.fmt_pm(*rec)} "
          f"over {len(shared)} seed(s) (1 = the dense model's loss)")
    print("\nclaims: paired Δ = loss(arm) - loss(reference), mean [95% t-interval] over shared seeds "
          "(negative = the arm is better)")
    claims = []
    for arm, ref, kind, words in CLAIMS:
        iv = stats.paired_interval(results, arm, ref)
        verdict = stats.split_verdict(results, arm, ref, kind)
        claims.append({"arm": arm, "reference": ref, "kind": kind, "claim": words, "interval": iv.to_dict(),
                       "verdict": verdict})
        print(f"claim {words}: {arm} - {ref} {report.fmt_interval(iv)} over {iv.n} seed(s): {verdict}")
    iv = stats.paired_interval(results, CONVERTED, DENSE)
    best, check, twin = dense_best
    if best is not None and best != 1.0:
        name, grid = f"{DENSE} x{best:g}", common.LR_CHECK_FACTORS
        both = results + twin
        biv = stats.paired_interval(both, CONVERTED, name)
        verdict = stats.split_verdict(both, CONVERTED, name, "parity")
        words = (f"the converted model reaches the dense model at the dense model's own best checked rate "
                 f"({stats.optimum_words(best, grid)}; seed-99 check " + ", ".join(
                     f"x{f:g} {v:.4f}" for f, v in check.items()) + f"; the cached `{DENSE_TWIN}` runs)")
        claims.append({"arm": CONVERTED, "reference": name, "kind": "parity", "claim": words,
                       "interval": biv.to_dict(), "verdict": verdict, "dense_factor": best,
                       "dense_optimum_located": stats.optimum_located(best, grid)})
        print(f"claim {words}: {CONVERTED} - {name} {report.fmt_interval(biv)} over {biv.n} seed(s): {verdict}")
    elif best is None and setup.cache is not None:
        print(f"(the dense model at its own best rate: the `{DENSE_TWIN}` arm's learning-rate check is not cached)")
    report.save_json(setup, {"accounting": acc, "results": results, "summary": summary, "claims": claims,
                             "converted_before_uptraining": {str(s): at0[s] for s in seeds},
                             "recovered_fraction": {"mean": rec[0], "std": rec[1], "per_seed": recovered},
                             "converted_minus_dense": iv.to_dict(), "lineage_steps": steps, "rank": RANK,
                             "uptrain_fraction": 1 / UPTRAIN_FRACTION,
                             "lr_factor_per_arm": factor})
    plot(setup, summary, claims, m0)
    report.finish(setup)


def plot(setup: common.Setup, summary: list[dict], claims: list[dict], at0: float) -> None:
    plt = report.pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    report.loss_bars(a, setup, summary)
    a.axhline(at0, color="k", ls=":", label=f"converted, before uptraining ({at0:.3f})")
    a.legend(fontsize=7)
    report.claim_bars(b, claims, [c["verdict"] == "reproduced" for c in claims],
                      [f"{c['arm']} - {c['reference']}" for c in claims], margin=stats.PARITY_MARGIN)
    b.legend(fontsize=7)
    report.save_figure(setup, fig)


if __name__ == "__main__":
    main()
