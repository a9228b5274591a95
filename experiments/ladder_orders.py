"""The ladder's defaults judged over sampler orders (issue #52): every rung set and eta, the noise-tie rule
on and off, each replayed under the product's promotion rule over ORDERS random orders of the 24 frozen
candidates of ``experiments/proxy_fidelity.py``. Nothing is trained: the replay reads the WSD runs' cached
rung losses at T/16, T/4 and T (T = 1,600) and the long runs' cached test losses.

    python experiments/ladder_orders.py --plan      what would be replayed, from which cache (trains nothing)
    nice -n 10 python experiments/ladder_orders.py  the table (a few minutes of one CPU core)

**The replay** (``experiments/proxy_fidelity_ladder.py``: ``npas.Ladder`` itself on an event clock, 2 workers,
a segment lasts its optimizer steps x the candidate's forward FLOPs per token at the recipe's
sequence length): target N = the number of candidates (baselines included), the product's objectives
(the rung loss and the analytic training memory, ``npas.count(cfg, batch, seq_len).train_memory_bytes``,
as ``full.yaml`` ranks), and ``Ladder.close`` bottom-up once the order is exhausted and nothing runs.
Each order puts the space's baselines first, as a search enqueues them (narrow_untied, full_tying,
cycle_tying), then the other 21 candidates shuffled by ``random.Random(SEED)`` (order k is the k-th
shuffle); every configuration sees the same ORDERS orders.

**Configurations** (18): rung sets drawn from {T/16, T/4, T} holding T and at least one lower rung
({100, 1600}, {400, 1600}, {100, 400, 1600}), eta in {2, 3, 4}, the noise-tie rule off or on. Tie on
(a bench variant; the product has no tie rule): at a rung below the top whose quota q = floor(n / eta)
is at least 1, the one trial ranked right after the quota is eligible with the top q when its rung
loss is within 2 x sqrt(2) x sigma of the q-th one's -- the product's former rule (NOISE_SIGMAS = 2
standard deviations of the difference of two one-run losses) -- never beyond the rung's cap.

**Per configuration, over the orders:** the pick (the lowest loss at T among the trials that reached
T) and its regret, truth(pick) - the best truth, mean and 10th-90th percentile, in nats and in sigma;
truth = cosine to T, test split, mean over long seeds 1000 and 1001 (the horizon report's ``long``
column); sigma = the pooled seed std of those long runs (one long run's seed noise, 0.0136 nats). The
fraction of orders in which the truth-best candidate (s14, the only one more than 1 sigma clear)
reaches T. Top-3 recall: of the ladder's 3 best (rung reached, then loss there), the share that are
"top", every candidate whose truth is within 1 sigma of the third best's; and the strict one (the
ladder's 3 best are the truth's 3 best: "found all 3"). Kendall tau between the loss at T and truth
over the candidates that reached T (orders where 3 or more did). Compute as multiples of N x T in
optimizer steps and in FLOPs (forks included; N x T in FLOPs = every candidate trained to T).
Beside them: the ceiling (every candidate to T, ranked by its WSD run's loss at T) and the cosine
proxy's pick (400 steps per candidate, ranked by its validation loss).

**The default, by a rule fixed before the replay was run:** among the 18 configurations, the one with
the lowest mean regret among those whose mean compute is <= 0.5 N x T in FLOPs; configurations within
0.001 nats of that lowest mean regret tie, and a tie goes to the cheaper (lower mean FLOPs).
ORDERS = 500 and SEED = 52 are fixed with it.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere in the checkout
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from scipy import stats as sps  # noqa: E402

import npas  # noqa: E402
from experiments.proxy_fidelity_ladder import WORKERS, replay, rung_losses_of  # noqa: E402
from npas import Recipe  # noqa: E402

ORDERS = 500  # sampler orders per configuration: fixed before the replay was run
SEED = 52  # random.Random(SEED) shuffles the non-baselines; order k is its k-th shuffle
ETAS = (2, 3, 4)
RUNG_FRACTIONS = ((16, 1), (4, 1), (16, 4, 1))  # T/16 + T, T/4 + T, T/16 + T/4 + T
NOISE_SIGMAS = 2.0  # the former product tie rule: 2 std of a difference of two one-run losses
BUDGET = 0.5  # the rule's compute bound, N x T in FLOPs
TIE_NATS = 0.001  # mean regrets this close tie; the cheaper wins
OUT = ROOT / "experiments" / "results" / "ladder_orders"


@dataclass(frozen=True)
class Cache:
    """What the replay reads, per candidate (names in the bench's order, baselines first)."""

    names: tuple[str, ...]
    baselines: tuple[str, ...]
    recipe: Recipe  # the WSD recipe to T whose forks the rung losses are
    rung_losses: dict[str, dict[int, float]]  # validation loss at every fork rung and at T
    truth: dict[str, float]  # cosine to T, test split, mean over the long seeds
    proxy: dict[str, float]  # the cosine proxy's validation loss
    proxy_steps: int
    memory: dict[str, float]  # analytic training memory (bytes): the product's other objective
    flops: dict[str, float]  # forward FLOPs per token at the recipe's sequence length
    sigma: float  # one long run's seed std (pooled)

    @property
    def T(self) -> int:
        return self.recipe.steps

    @property
    def best(self) -> str:
        return min(self.names, key=self.truth.__getitem__)

    def top(self) -> set[str]:
        """Every candidate within 1 sigma of the third best's truth: those no pair of long runs tells
        apart from the top 3."""
        third = sorted(self.truth.values())[2]
        return {n for n in self.names if self.truth[n] <= third + self.sigma}

    def top3(self) -> set[str]:
        return set(sorted(self.names, key=self.truth.__getitem__)[:3])


@dataclass(frozen=True)
class Config:
    rungs: tuple[int, ...]
    eta: int
    tie: bool

    def label(self, T: int) -> str:
        frac = "+".join("T" if r == T else f"T/{T // r}" for r in self.rungs)
        return f"{frac:<12} eta {self.eta} tie {'on ' if self.tie else 'off'}"


def configs(T: int) -> list[Config]:
    return [Config(tuple(T // f for f in fr), eta, tie) for fr in RUNG_FRACTIONS for eta in ETAS for tie in (False, True)]


def orders(cache: Cache, n: int, seed: int) -> list[list[str]]:
    """``n`` sampler orders: the baselines first, as a search enqueues them, then the rest shuffled."""
    rng = random.Random(seed)
    rest = [c for c in cache.names if c not in cache.baselines]
    out = []
    for _ in range(n):
        rng.shuffle(rest)
        out.append([*cache.baselines, *rest])
    return out


def recall(ranked: list[str], top: set[str], k: int = 3) -> float:
    return len(set(ranked[:k]) & top) / k


def tau(xs: list[float], ys: list[float]) -> float:
    return float(sps.kendalltau(xs, ys).statistic) if len(xs) >= 3 else math.nan


def evaluate(cache: Cache, config: Config, sampled: list[list[str]]) -> dict[str, Any]:
    """Replay ``config`` over every order; the per-order measures and their summary (module docstring)."""
    recipe = Recipe.from_dict({**cache.recipe.to_dict(), "rungs": list(config.rungs)})
    assert recipe.fork_rungs() == config.rungs, (recipe.fork_rungs(), config.rungs)
    T, N = cache.T, len(cache.names)
    objectives = {c: (cache.memory[c],) for c in cache.names}
    width = NOISE_SIGMAS * math.hypot(cache.sigma, cache.sigma) if config.tie else None
    best_truth, best, top, top3 = min(cache.truth.values()), cache.best, cache.top(), cache.top3()
    budget_flops = T * sum(cache.flops[c] for c in cache.names)
    per: dict[str, list[float]] = {k: [] for k in ("regret", "best_at_T", "recall", "all3", "tau", "steps", "flops",
                                                    "at_T")}
    for order in sampled:
        rep = replay(order, cache.rung_losses, recipe, cache.flops, config.eta, WORKERS, target=N,
                     objectives=objectives, tie_width=width)
        for rung in config.rungs[:-1]:  # the cap, as the product states it (a close may send one on)
            cap = rep.ladder.cap(rung)
            assert len(rep.ladder.promoted.get(rung, [])) <= max(cap, 1), (config, rung)
        pick = rep.pick()
        score = rep.score()
        ranked = sorted(score, key=score.__getitem__)
        at_T = [c for c, t in rep.reached.items() if t == T]
        per["regret"].append(cache.truth[pick] - best_truth if pick is not None else math.nan)
        per["best_at_T"].append(float(rep.reached.get(best) == T))
        per["recall"].append(recall(ranked, top))
        per["all3"].append(float(set(ranked[:3]) == top3))
        per["tau"].append(tau([rep.losses[c][T] for c in at_T], [cache.truth[c] for c in at_T]))
        per["steps"].append(rep.total_steps / (N * T))
        per["flops"].append(rep.total_flops / budget_flops)
        per["at_T"].append(len(at_T))
    return summary(per, cache.sigma)


def summary(per: dict[str, list[float]], sigma: float) -> dict[str, Any]:
    regret = np.asarray(per["regret"], float)
    taus = [t for t in per["tau"] if math.isfinite(t)]
    p10, p90 = (float(q) for q in np.percentile(regret, [10, 90]))
    return {"orders": len(regret), "regret": float(regret.mean()), "regret_p10": p10, "regret_p90": p90,
            "regret_sigma": float(regret.mean()) / sigma, "regret_p10_sigma": p10 / sigma,
            "regret_p90_sigma": p90 / sigma, "best_at_T": statistics.fmean(per["best_at_T"]),
            "recall": statistics.fmean(per["recall"]), "all3": statistics.fmean(per["all3"]),
            "tau": statistics.fmean(taus) if taus else math.nan, "tau_orders": len(taus),
            "at_T": statistics.fmean(per["at_T"]), "steps": statistics.fmean(per["steps"]),
            "flops": statistics.fmean(per["flops"])}


def fixed_rows(cache: Cache) -> dict[str, dict[str, Any]]:
    """Rows with no order: every candidate to T ranked at T (the ceiling), and the cosine proxy's pick."""
    T, best_truth, names = cache.T, min(cache.truth.values()), list(cache.names)
    out = {}
    for label, by, steps, at_T in (("ceiling: every candidate to T", {c: cache.rung_losses[c][T] for c in names},
                                    1.0, True),
                                   (f"cosine proxy's pick ({cache.proxy_steps} steps each)", cache.proxy,
                                    cache.proxy_steps / T, False)):
        ranked = sorted(names, key=by.__getitem__)
        regret = cache.truth[ranked[0]] - best_truth
        row = summary({"regret": [regret], "best_at_T": [float(at_T)], "recall": [recall(ranked, cache.top())],
                       "all3": [float(set(ranked[:3]) == cache.top3())],
                       "tau": [tau([by[c] for c in names], [cache.truth[c] for c in names])],
                       "steps": [steps], "flops": [steps], "at_T": [len(names) if at_T else 0]}, cache.sigma)
        row["pick"] = ranked[0]
        out[label] = row
    return out


def choose(rows: dict[Config, dict[str, Any]]) -> Config | None:
    """The rule of the module docstring: lowest mean regret within BUDGET N x T FLOPs; ties to the cheaper."""
    within = {c: r for c, r in rows.items() if r["flops"] <= BUDGET}
    if not within:
        return None
    low = min(r["regret"] for r in within.values())
    tied = [c for c, r in within.items() if r["regret"] <= low + TIE_NATS]
    return min(tied, key=lambda c: within[c]["flops"])


# ------------------------------------------------------------------------------------------ cache
def load_cache() -> Cache:
    """The horizon rows' cached runs (``experiments/proxy_fidelity.py``), at the bench's current code version."""
    from experiments import proxy_fidelity as pf
    from experiments.proxy_fidelity_report import DEFAULT_PAR, _loss, _pooled_sigma

    setup = pf.make_setup(False, None, None, None, 1)
    space, cands = pf.load_candidates(setup)
    res = pf.load(setup, cands, pf.code_version(setup))
    assert setup.wsd is not None
    wsd, T, seed0 = setup.wsd, setup.wsd.steps, setup.proxy.seed
    losses, truth, proxy, missing = {}, {}, {}, []
    longs = {}
    for c in cands:
        got = rung_losses_of(res.get((c.config.hash, "wsd", seed0, DEFAULT_PAR)), T)
        seeds = [_loss(r, "test_loss") for s in setup.long_seeds if (r := res.get((c.config.hash, "long", s, DEFAULT_PAR)))]
        p = res.get((c.config.hash, "proxy", seed0, DEFAULT_PAR))
        if not all(t in got for t in wsd.fork_rungs()) or len(seeds) != len(setup.long_seeds) or p is None:
            missing.append(c.name)
            continue
        losses[c.name], longs[c.name] = got, seeds
        truth[c.name], proxy[c.name] = statistics.fmean(seeds), _loss(p, "val_loss")
    if missing:
        raise SystemExit(f"ladder_orders: the cache lacks runs of {', '.join(missing)}; "
                         "run `python experiments/proxy_fidelity.py` first (`--plan` says what is missing)")
    sigma = _pooled_sigma(list(longs.values()))
    assert sigma is not None
    names = tuple(c.name for c in cands)
    acc = {c.name: npas.count(c.config, batch_size=wsd.batch_size, seq_len=wsd.seq_len) for c in cands}
    return Cache(names, tuple(n for n in space.baselines() if n in names), wsd, losses, truth, proxy,
                 setup.proxy.steps, {n: float(a.train_memory_bytes) for n, a in acc.items()},
                 {n: float(a.flops_per_token) for n, a in acc.items()}, sigma)


# ------------------------------------------------------------------------------------------ printing
HEAD = (f"{'configuration':<32}{'regret nats mean [p10, p90]':>30}{'in sigma':>20}{'best@T':>8}{'recall':>8}"
        f"{'all 3':>7}{'tau (orders)':>15}{'@T':>6}{'steps':>7}{'FLOPs':>7}")


def line(label: str, r: dict[str, Any]) -> str:
    t = f"{r['tau']:+.3f} ({r['tau_orders']})" if math.isfinite(r["tau"]) else f"n/a ({r['tau_orders']})"
    return (f"{label:<32}{r['regret']:>10.4f} [{r['regret_p10']:.4f}, {r['regret_p90']:.4f}]"
            f"{r['regret_sigma']:>8.2f} [{r['regret_p10_sigma']:.2f}, {r['regret_p90_sigma']:.2f}]"
            f"{r['best_at_T']:>8.2f}{r['recall']:>8.2f}{r['all3']:>7.2f}{t:>15}{r['at_T']:>6.1f}"
            f"{r['steps']:>7.3f}{r['flops']:>7.3f}")


def plan(cache: Cache) -> None:
    T = cache.T
    print(f"plan: trains nothing -- replays the cached WSD rung losses of {len(cache.names)} candidates "
          f"(T = {T:,}; rungs available {', '.join(map(str, cache.recipe.fork_rungs()))}) and scores against "
          f"the cached long runs; sigma {cache.sigma:.4f} nats")
    print(f"  {len(configs(T))} configurations x {ORDERS} orders (seed {SEED}; baselines first: "
          f"{', '.join(cache.baselines)}), {WORKERS} workers, target N = {len(cache.names)}, objectives "
          "(rung loss, train memory)")
    for c in configs(T):
        print(f"  {c.label(T)}  rungs {', '.join(map(str, c.rungs))}")
    print(f"  default rule: lowest mean regret with mean FLOPs <= {BUDGET} N x T; ties within {TIE_NATS} nats "
          "to the cheaper")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--plan", action="store_true", help="say what would be replayed; trains nothing, replays nothing")
    p.add_argument("--out", type=Path, default=OUT, help=f"folder for table.json (default {OUT.relative_to(ROOT)})")
    a = p.parse_args(argv)
    cache = load_cache()
    if a.plan:
        plan(cache)
        return 0
    T, sampled, t0 = cache.T, orders(cache, ORDERS, SEED), time.time()
    rows = {c: evaluate(cache, c, sampled) for c in configs(T)}
    fixed = fixed_rows(cache)
    print(f"[ladder_orders] {len(cache.names)} candidates, T = {T:,}, {ORDERS} orders (seed {SEED}), {WORKERS} workers,"
          f" target N = {len(cache.names)}, ranked on (rung loss, train memory); sigma {cache.sigma:.4f} nats; "
          f"best: {cache.best}; 'top' (within 1 sigma of the third best): {', '.join(sorted(cache.top()))}; "
          f"replayed in {time.time() - t0:.0f} s")
    print(HEAD)
    for c, r in rows.items():
        print(line(c.label(T), r))
    for label, r in fixed.items():
        print(line(label[:31], r) + f"  pick {r['pick']}")
    won = choose(rows)
    if won is None:
        print(f"default: none -- no configuration is within {BUDGET} N x T FLOPs on average")
    else:
        print(f"default: {won.label(T)} (rungs {', '.join(map(str, won.rungs))}): the lowest mean regret "
              f"({rows[won]['regret']:.4f} nats) among the configurations within {BUDGET} N x T FLOPs; ties "
              f"within {TIE_NATS} nats to the cheaper")
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "table.json").write_text(json.dumps({
        "orders": ORDERS, "seed": SEED, "T": T, "sigma": cache.sigma, "best": cache.best,
        "rows": [{"rungs": list(c.rungs), "eta": c.eta, "tie": c.tie, **r} for c, r in rows.items()],
        "fixed": fixed, "default": None if won is None else {"rungs": list(won.rungs), "eta": won.eta,
                                                              "tie": won.tie}}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
