"""Search efficiency: hypervolume after N trials of the default sampler (TPE) vs random search at N and 3N.

    python benchmarks/search_efficiency.py                  # N=40, 16 seeds, experiments/spaces/full_frozen.yaml
    python benchmarks/search_efficiency.py --quick          # N=12, 3 seeds: a smoke run
    python benchmarks/search_efficiency.py --real           # also a tiny real-training search per sampler (Ray, ~2 min)
    python benchmarks/search_efficiency.py --infeasible-as fail  # before: infeasible asks told FAIL (TPE ignores them)

No model is trained by default. Each candidate is scored by a cheap, deterministic SYNTHETIC objective
computed from its fitted allocation, so the bench measures the samplers, not the proxy's noise:
  objective 1 (stands in for val_loss, nats/char):
      surrogate = 1.35 + 30 * N_eff^-0.30 + taper_term
      N_eff     = non-embedding stored params + beta * (materialised - stored params)
      beta      = 0.25 + 0.20 * min(1, max LoRA rank / 8) + 0.05 if tied layers keep their own norms
                  + 0.10 template_mix / 0.05 slice / 0.00 tile pools     (credit for reused weights)
      taper_term: front = width-weighted depth position of the MLP widths in [-1, 1] (> 0 front-heavy);
                  -0.06 front + 0.08 front^2 when front-heavy (best near front = 0.375),
                  +0.10 |front| when back-heavy (taper `reverse` is penalised)
  objective 2: train_memory_bytes, exact, from `npas.count` with the `proxy` recipe's batch and seq_len
      (the value a real search records for that objective).
Trials are asked and told in-process the way `npas.service.search.searcher.NpasSearcher` does (without Ray): the
space's baselines are enqueued first; infeasible candidates are told COMPLETE with a violated `fit`
constraint when the sampler learns from constraints (TPE: `npas.service.search.samplers.learns_from_infeasible`),
FAIL otherwise (`--infeasible-as fail` forces FAIL, the behaviour before); duplicates of an evaluated
allocation are told FAIL; neither counts; each counted trial gets the budget and fidelity constraints.
The space is a frozen copy of search_spaces/full.yaml (experiments/spaces/full_frozen.yaml), so the baseline
does not move when the shipped space grows. The fraction of asks that were infeasible is printed per sampler. Samplers
come from `npas.service.search.samplers.make_sampler` (tpe is the default of `npas search`), one worker, sequential.

Hypervolume: Optuna's exact hypervolume (through `npas.service.study.optuna_adapter`) (what npas/dashboard/info.py
uses), on objectives scaled as there (best value seen -> 0, reference point -> 1), with ONE ideal and
reference point for every run (best and worst x 1.1 over all points of all runs), so all numbers are
comparable. random@N is the first N counted trials of the random run that goes to 3N (a random
sampler's first N draws do not depend on how many follow).

Target: mean HV of tpe@N >= mean HV of random@3N (ratio >= 1.00x). Prints PASS/MISS; exits 0.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import optuna
from optuna.trial import TrialState

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # a checkout run without the editable install still finds npas

from npas import ArchConfig, TrialAttr, count  # noqa: E402
from npas.service.search.samplers import enqueue_baselines, make_sampler  # noqa: E402
from npas.service.search.searcher import MAX_SKIPPED_IN_A_ROW  # noqa: E402
from npas.service.study.studies import (  # noqa: E402
    is_full_fidelity,
    status,
    was_evaluated,
)

TARGET = 1.00
SPACE = ROOT / "experiments" / "spaces" / "full_frozen.yaml"  # frozen: the shipped full.yaml grows, the baseline must not


# ---- the synthetic objective --------------------------------------------------------------------
def front_weight(widths: tuple[int, ...]) -> float:
    """Width-weighted mean depth position mapped to [-1, 1]: > 0 when the MLP widths sit early."""
    L = len(widths)
    if L < 2:
        return 0.0
    pos = [1.0 - 2.0 * i / (L - 1) for i in range(L)]
    mean = sum(widths) / L
    return sum((w - mean) * p for w, p in zip(widths, pos, strict=True)) / (mean * sum(abs(p) for p in pos))


def surrogate_loss(cfg: ArchConfig) -> float:
    """Deterministic stand-in for the proxy's validation loss (see the module docstring)."""
    acc = count(cfg)
    stored = acc.stored_params - acc.embedding_params
    reuse = max(0, acc.materialised_params - acc.stored_params)
    shared = any(cfg.block_is_shared(b) for b in range(cfg.n_blocks))
    lora = max((*cfg.lora_attn, *cfg.lora_mlp, 0))
    beta = 0.25 + 0.20 * min(1.0, lora / 8)
    if shared and cfg.untied_norms:
        beta += 0.05
    gens = {b.generator for b in cfg.banks}
    beta += 0.10 if "template_mix" in gens else 0.05 if "slice" in gens else 0.0
    n_eff = max(1.0, stored + beta * reuse)
    front = front_weight(cfg.mlp_widths)
    taper = -0.06 * front + 0.08 * front**2 if front >= 0 else 0.10 * -front
    return 1.35 + 30.0 * n_eff**-0.30 + taper


# ---- one search, in-process -------------------------------------------------------------------
def run_search(space, sampler: str, seed: int, n: int, batch: int, seq: int,
               infeasible_as: str = "learn") -> tuple[list[list[float]], dict]:
    """Drive npas's own NpasSearcher through Ray Tune's Searcher protocol (suggest, then
    on_trial_complete) with the surrogate in place of training, until n trials count. Baselines,
    infeasible/duplicate handling, constraints and the random ask after repeated skips are all the
    searcher's own. Returns the counted trials' values in order and the skip counts.

    `infeasible_as`: "learn" lets the searcher decide (COMPLETE + violated constraint for TPE), "fail"
    tells every infeasible ask FAIL."""
    import json
    import tempfile

    from ray.tune.search import Searcher

    from npas import open_storage
    from npas.service.search.searcher import NpasSearcher

    tmp = tempfile.mkdtemp(prefix="npas-se-")
    storage = open_storage(f"sqlite:///{tmp}/s.db").storage
    study = optuna.create_study(storage=storage, directions=["minimize"] * 2,
                                sampler=make_sampler(sampler, seed, 2))
    enqueue_baselines(study, space, TrialAttr.BASELINE)  # as the driver does: with their knob values as params
    recipe = {"batch_size": batch, "seq_len": seq, "steps": 1}
    searcher = NpasSearcher(study, space, recipe, "synthetic", n,
                            learn_infeasible=False if infeasible_as == "fail" else None)
    values: list[list[float]] = []
    i = 0
    while True:
        config = searcher.suggest(f"t{i}")
        if config is Searcher.FINISHED or config is None:
            break
        loss = surrogate_loss(ArchConfig.from_dict(config["allocation"]))
        proxy = {"status": "ok", "val_loss": loss, "steps_done": 1, "curve": [[1, loss]]}
        searcher.on_trial_complete(f"t{i}", {"val_loss": loss, "step": 1, "final": True,
                                             "proxy": json.dumps(proxy)})
        i += 1
    for t in study.get_trials(deepcopy=False):
        if was_evaluated(t):
            values.append(list(t.values))
    stats = {"infeasible": searcher.progress.infeasible, "duplicate": searcher.progress.duplicates,
             "asks": len(study.get_trials(deepcopy=False)), "exhausted": searcher.error is not None}
    return values, stats


# ---- hypervolume with one reference point -----------------------------------------------------
class SharedHV:
    """Objectives scaled as npas/dashboard/info.py does, with one ideal/reference point for all runs."""

    def __init__(self, all_points: list[list[float]], margin: float = 0.0) -> None:
        """margin > 0 puts the ideal point that share of the range below the best value seen, so a front
        of one point that is best in every objective does not fill the whole box (HV ratios between runs
        do not depend on the ideal point, only on the reference point)."""
        vals = np.asarray(all_points, dtype=float)
        worst, best = vals.max(axis=0), vals.min(axis=0)
        self.best = best - margin * (worst - best)
        self.ref = np.where(worst > 0, worst * 1.1, worst * 0.9)
        self.span = np.where(self.ref - self.best > 0, self.ref - self.best, 1.0)

    def __call__(self, points: list[list[float]]) -> float:
        from npas.service.study.optuna_adapter import hypervolume

        p = (np.asarray(points, dtype=float) - self.best) / self.span
        p = p[(p < 1.0).all(axis=1)]
        return hypervolume(p, np.ones(p.shape[1]))


def mean_std(xs: list[float]) -> str:
    return f"{statistics.mean(xs):.4f} ± {statistics.stdev(xs) if len(xs) > 1 else 0.0:.4f}"


# ---- optional: a tiny real search per sampler ---------------------------------------------------
def real_mode(trials: int, seed: int) -> None:
    """Real training on tests/data/tiny.yaml with the fast test recipe: a smoke comparison only."""
    import tempfile

    import ray

    import npas
    from npas import Launch, NpasError, search

    print(f"\nreal mode: tests/data/tiny.yaml, recipe tests/data/fast.yaml, {trials} trials per sampler, seed {seed}, "
          f"2 workers, no early stop (1 seed, few trials: a smoke comparison, no verdict; ideal point 10% of the "
          f"range below the best seen)")
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="npas-seff-") as d:
        os.chdir(d)  # Tune's scratch directory (trials/runs) goes to the temporary folder
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
        try:
            studies = {}
            for sampler in ("tpe", "random"):
                t = time.perf_counter()
                url = f"sqlite:///{d}/real.db"
                try:
                    search(npas.load_space(ROOT / "tests" / "data" / "tiny.yaml"), trials=trials,
                           study=f"real-{sampler}", storage=url, recipe=str(ROOT / "tests" / "data" / "fast.yaml"),
                           sampler=sampler, seed=seed, launch=Launch(workers=2, early_stop=False))
                    note = ""
                except NpasError as e:  # e.g. the searcher's "N candidates in a row were ..." stop
                    note = f"; the search STOPPED with: {e}"
                studies[sampler] = optuna.load_study(study_name=f"real-{sampler}", storage=url)
                skipped = sum(1 for t_ in studies[sampler].get_trials(deepcopy=False)
                              if status(t_) in ("infeasible", "duplicate"))
                print(f"  {sampler}: search took {time.perf_counter() - t:.1f} s, {skipped} infeasible/duplicate "
                      f"asks{note}")
        finally:
            ray.shutdown()
            os.chdir(cwd)
        points = {k: [list(t.values) for t in st.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                      if is_full_fidelity(t)] for k, st in studies.items()}
        hv = SharedHV([p for ps in points.values() for p in ps], margin=0.1)
        for k, ps in points.items():
            print(f"  real {k}@{trials}: HV {hv(ps):.4f} ({len(ps)} complete full-fidelity trials, "
                  f"front {len(studies[k].best_trials)})")
        distinct = len({t.user_attrs.get(TrialAttr.HASH) for st in studies.values() for t in st.get_trials(deepcopy=False)
                        if t.state == TrialState.COMPLETE})
        print(f"  distinct allocations evaluated by the two runs together: {distinct}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="N=12, 3 seeds: a smoke run")
    ap.add_argument("--trials", type=int, default=None, help="N, counted trials of the default sampler (default 40)")
    ap.add_argument("--seeds", type=int, default=None, help="seeds 0..K-1 (default 8, quick 3)")
    ap.add_argument("--real", action="store_true", help="also run a tiny real-training search per sampler")
    ap.add_argument("--real-trials", type=int, default=16,
                    help="trials per sampler in --real (tpe samples at random for its first 8)")
    ap.add_argument("--infeasible-as", choices=("learn", "fail"), default="learn",
                    help="learn: what npas's searcher does (TPE learns from infeasible asks); fail: the old FAIL")
    args = ap.parse_args(argv)
    n = args.trials or (12 if args.quick else 40)
    seeds = list(range(args.seeds or (3 if args.quick else 16)))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", message="Heartbeat of storage")  # npas beats heartbeats itself

    from npas import load_recipe, load_space

    space = load_space(SPACE)
    rec = load_recipe(ROOT / "trials" / "proxy.yaml")
    print("npas bench: search efficiency, hypervolume of the default sampler (tpe) vs random search")
    print(f"space {SPACE.relative_to(ROOT)} (budget {space.budget_params:,} params), objectives "
          f"[val_loss, train_memory_bytes]; N={n}, seeds {seeds[0]}..{seeds[-1]}")
    print("objective: SYNTHETIC, nothing is trained: val_loss := 1.35 + 30 * N_eff^-0.30 + taper term "
          "(N_eff = stored + beta * reused params; see the docstring); train_memory_bytes: exact npas.count "
          f"at the proxy recipe's batch {rec.batch_size} x seq {rec.seq_len}")

    t0 = time.perf_counter()
    runs: dict[tuple[str, int], list[list[float]]] = {}
    stats: dict[tuple[str, int], dict] = {}
    for seed in seeds:
        runs["tpe", seed], stats["tpe", seed] = run_search(space, "tpe", seed, n, rec.batch_size, rec.seq_len,
                                                             args.infeasible_as)
        runs["random", seed], stats["random", seed] = run_search(space, "random", seed, 3 * n, rec.batch_size,
                                                                 rec.seq_len, args.infeasible_as)
    elapsed = time.perf_counter() - t0
    hv = SharedHV([p for ps in runs.values() for p in ps])
    tpe_n = [hv(runs["tpe", s][:n]) for s in seeds]
    rnd_n = [hv(runs["random", s][:n]) for s in seeds]
    rnd_3n = [hv(runs["random", s][:3 * n]) for s in seeds]
    # how many random trials reach the default's mean HV at N (on the mean curve)
    rnd_curve = [statistics.mean(hv(runs["random", s][:k]) for s in seeds) for k in range(1, 3 * n + 1)]
    reach = next((k for k, v in enumerate(rnd_curve, 1) if v >= statistics.mean(tpe_n)), None)

    ref = hv.ref
    print(f"hypervolume: Optuna's exact WFG on scaled objectives; shared ideal point "
          f"[{hv.best[0]:.4f}, {hv.best[1]:,.0f}] -> 0 and reference point [{ref[0]:.4f}, {ref[1]:,.0f}] -> 1 "
          f"for every run ({elapsed:.1f} s for {len(runs)} searches)")
    print(f"\n{'seed':>4}{'tpe@N':>10}{'random@N':>10}{'random@3N':>11}{'tpe/rnd3N':>11}"
          f"{'tpe counted':>13}{'infeas/dup':>12}{'rnd counted':>13}{'infeas/dup':>12}")
    for i, s in enumerate(seeds):
        st, sr = stats["tpe", s], stats["random", s]
        print(f"{s:>4}{tpe_n[i]:>10.4f}{rnd_n[i]:>10.4f}{rnd_3n[i]:>11.4f}{tpe_n[i] / rnd_3n[i]:>10.3f}x"
              f"{len(runs['tpe', s]):>12}{'!' if st['exhausted'] else ' '}"
              f"{st['infeasible']:>6}/{st['duplicate']:<5}"
              f"{len(runs['random', s]):>12}{'!' if sr['exhausted'] else ' '}{sr['infeasible']:>6}/{sr['duplicate']:<5}")
    how = ("FAIL (--infeasible-as fail)" if args.infeasible_as == "fail"
           else "as npas's searcher tells them: infeasible COMPLETE with a violated constraint for tpe, FAIL for "
                "random; duplicates FAIL")
    print(f"(infeas/dup: asks told {how}; they do not count. '!': the run stopped early after "
          f"{MAX_SKIPPED_IN_A_ROW} such asks in a row, as `npas search` would, with fewer than its target trials)")
    for label, xs in ((f"tpe@{n}", tpe_n), (f"random@{n}", rnd_n), (f"random@{3 * n}", rnd_3n)):
        print(f"{label + ':':<12} HV {mean_std(xs)}")
    for arm in ("tpe", "random"):
        infeasible = sum(stats[arm, s]["infeasible"] for s in seeds)
        asks = sum(stats[arm, s]["asks"] for s in seeds)
        print(f"infeasible asks: {arm} {infeasible}/{asks} = {infeasible / max(asks, 1):.1%} of all asks "
              f"(infeasible told as: {'FAIL' if args.infeasible_as == 'fail' or arm == 'random' else 'COMPLETE + fit constraint'})")
    ratio = statistics.mean(tpe_n) / statistics.mean(rnd_3n)
    paired = statistics.median(a / b for a, b in zip(tpe_n, rnd_3n, strict=True))
    wins = sum(a >= b for a, b in zip(tpe_n, rnd_3n, strict=True))
    verdict = "PASS" if ratio >= TARGET else "MISS"
    print(f"ratio: tpe@{n} / random@{3 * n} = {ratio:.3f}x (mean HV; paired median {paired:.3f}x, tpe ahead on "
          f"{wins}/{len(seeds)} seeds) (target >= {TARGET:.2f}x) {verdict}")
    print(f"ratio: tpe@{n} / random@{n} = {statistics.mean(tpe_n) / statistics.mean(rnd_n):.3f}x (mean HV)")
    print("random search reaches tpe's mean HV at N after "
          + (f"{reach} trials ({reach / n:.2f}x N)" if reach else f"more than {3 * n} trials (> 3x N)"))
    stuck = sorted(f"{k[0]} seed {k[1]} ({len(runs[k])} trials)" for k, st in stats.items() if st["exhausted"])
    if stuck:
        print(f"stuck runs: {len(stuck)} stopped after {MAX_SKIPPED_IN_A_ROW} infeasible/duplicate asks in a row: "
              + ", ".join(stuck) + "; their HV is at the trials they reached")
    if args.real:
        real_mode(args.real_trials, seeds[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
