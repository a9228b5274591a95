"""Proxy fidelity: does the search's ranking survive training that is four times longer?

A search ranks allocations by the validation loss of a short proxy run. That ranking is only worth
something if it predicts which allocation is better after real training. This bench takes 12+
candidates from a frozen copy of ``full.yaml`` (the space's hand-crafted baselines plus feasible
samples of a seeded random Optuna sampler, deduplicated by allocation hash), trains each with the
proxy recipe on the proxy's seed (score: validation loss, the search's selection split) and with a
run 4x longer at the same base learning rate on fresh seeds (score: test-split loss, text the search
never reads), under both the ``fair`` parameterization and the old ``uniform`` one, and prints
Kendall's tau between the two rankings with a 95% bootstrap interval over candidates, tau among the
5 best proxy candidates beside it, and the long runs' seed noise.

Where a miss comes from, three rows beside the verdict: the *ceiling*, tau between the rankings of
two long seeds (no proxy can be expected to predict the long ranking better than another long seed
does); for the default parameterization, the proxy repeated on the seeds ``npas search --repeats R``
trains (``--proxy-repeats``, default 2) and scored by their mean, as such a study scores (if it
passes where one seed misses, the miss was seed noise that repeats buy off); and the proxy at 2x its
steps on its own seed (if tau grows with the horizon, the miss is learning curves that cross after
the proxy ends, and only a longer proxy or ``npas validate`` sees past it).

Target: tau >= 0.7 with the lower 95% bound above 0.3 over all candidates (PASS/MISS; INCOMPLETE
while runs are missing).

That table runs over the first 12 candidates. The *horizon rows* (issue #33) run over 24 (the same
seeded sampler's next 12 feasible samples, at the space's budget), all under ``fair``: the cosine
proxy as above; one warmup-stable-decay run to T = the long length per candidate (seed 0, its
recipe's ``schedule: wsd``, ``npas.training.forks``), whose cooldown forks give a finished-at-t loss
at T/16 and T/4 and whose own end gives WSD at T; and the ceiling. Each row: Kendall tau with its
bootstrap interval, tau over the pairs the long runs resolve (gap > 2 sigma), top-3 recall. Their
target: the paired bootstrap interval of tau(fork at T/4) - tau(proxy) lies above 0. A WSD run's
cache key adds a second version, of the WSD recipe, so the cosine runs keep their keys.

Every finished run is cached in ``experiments/results/proxy_fidelity/`` (``experiments/harness/store.py``) keyed by (candidate
hash, recipe name, steps, seed, parameterization, code version), so sessions resume and a cached run
never reruns. The code version is that of the training numerics (``npas.conversion.numerics``) and the
base recipe (``experiments/harness/version.py``), so a change to either starts afresh; the frozen space keeps
later edits of the shipped one from moving the candidates.

    python experiments/proxy_fidelity.py --plan              runs x tokens -> estimated CPU-hours (measures tokens/s)
    nice -n 10 python experiments/proxy_fidelity.py --max-minutes 40   train what is missing, cheapest first
    python experiments/proxy_fidelity.py --report            the table from the cache only
    python experiments/proxy_fidelity.py --report --out experiments/results/proxy_fidelity_h200   the GPU runs (experiments/device.py)
    python experiments/proxy_fidelity.py --quick             4 candidates, smoke recipe, tiny steps, temp dir
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere in the checkout
    sys.path.insert(0, str(ROOT))

import optuna  # noqa: E402

import npas  # noqa: E402
from experiments.harness import jobs as jobs_lib  # noqa: E402
from experiments.harness import store  # noqa: E402
from experiments.harness.cli import bench_parser, version_to_read  # noqa: E402
from experiments.harness.recipes import bench_recipe  # noqa: E402
from experiments.harness.report import Columns, cost_table  # noqa: E402
from experiments.harness.version import code_version as harness_version  # noqa: E402
from experiments.harness.version import recipe_settings  # noqa: E402
from experiments.proxy_fidelity_report import DEFAULT_PAR, horizon_report, report  # noqa: E402
from npas import ArchConfig, NpasError, Recipe, Space, load_space  # noqa: E402
from npas.service.execution.outcome import repeat_seeds  # noqa: E402
from npas.training.recipe import PARAMETERIZATIONS  # noqa: E402

SPACE = ROOT / "experiments" / "spaces" / "full_frozen.yaml"
FROZEN_CANDIDATES = ROOT / "experiments" / "spaces" / "full_frozen_candidates.json"  # see frozen_candidates
RESULTS = ROOT / "experiments" / "results" / "proxy_fidelity"
RESULTS_GPU = ROOT / "experiments" / "results" / "proxy_fidelity_h200"  # runs made on the lent H200 (experiments/device.py)
LONG_FACTOR = 4  # long run = proxy steps x 4, same base lr
MID_FACTOR = 2  # the horizon row: the proxy at 2x its steps, same lr and seed (does fidelity grow with length?)
LONG_SEED_BASE = 1000  # long seeds are 1000, 1001, ...: never a proxy seed
SAMPLER_SEED = 0
N_FULL = 12  # the first 12 candidates carry the original table (both parameterizations, repeats, 2x row)
N_CANDIDATES = 24  # the horizon rows (fair only) run over 24: 12 more samples of the same seeded sampler


@dataclass(frozen=True)
class Setup:
    proxy: Recipe  # the search's recipe, on its own seed
    long: Recipe  # LONG_FACTOR x the steps, same base lr; the seed is set per run
    mid: Recipe  # MID_FACTOR x the steps, same base lr, on the proxy's seed: the horizon row
    n_candidates: int
    long_seeds: tuple[int, ...]
    out: Path
    workers: int
    proxy_seeds: tuple[int, ...]  # the seeds `npas search --repeats R` trains: the proxy's own first
    wsd: Recipe | None = None  # the horizon rows' WSD run to the long length T, forked at T/16 and T/4
    n_full: int = N_FULL  # candidates (the first ones) that also get the original table's runs


@dataclass(frozen=True)
class Candidate:
    name: str  # baseline name, or "s<trial number>" for a random sample
    config: ArchConfig
    values: dict[str, Any]
    flops: int  # forward FLOPs per token: what orders runs cheapest-first


@dataclass(frozen=True)
class Job:
    cand: Candidate
    kind: str  # "proxy" | "mid" | "long" | "wsd"
    seed: int
    parameterization: str

    def recipe(self, setup: Setup) -> Recipe:
        base = {"proxy": setup.proxy, "mid": setup.mid, "long": setup.long, "wsd": setup.wsd}[self.kind]
        return Recipe.from_dict({**base.to_dict(), "seed": self.seed, "parameterization": self.parameterization})

    def key(self, setup: Setup, version: str) -> str:
        r = self.recipe(setup)
        if self.kind == "wsd":  # also keyed on the WSD recipe (a cosine run's key is as it was)
            version = f"{version}-{wsd_version(setup)}"
        return f"{self.cand.config.hash}-{r.name}-{r.steps}-s{self.seed}-{self.parameterization}-{version}"

    def tokens(self, setup: Setup) -> int:
        """Training tokens of the run: a WSD run's forks decay on top of its own ``steps``."""
        r = self.recipe(setup)
        steps = r.steps
        if r.schedule == "wsd":
            steps += sum(t - r.decay_start(t) for t in r.fork_rungs()[:-1])
        return steps * r.tokens_per_step


# ------------------------------------------------------------------------------------------ candidates
def frozen_candidates(n: int) -> list[Candidate]:
    """The first ``n`` candidates as the cached runs were made: their allocations are frozen in
    ``FROZEN_CANDIDATES`` (made by ``candidates`` below under the fit of the time, fit version 1) so a
    later change to how a space fits its samples (the budget fill of fit version 2 grows s12) leaves
    this bench's candidates, and the cache keyed on their hashes, as they were."""
    data = json.loads(FROZEN_CANDIDATES.read_text())
    out = []
    for c in data["candidates"][:n]:
        cfg = ArchConfig.from_dict(c["config"])
        if cfg.hash != c["hash"]:
            raise SystemExit(f"{FROZEN_CANDIDATES.name}: {c['name']} reads back as {cfg.hash}, stored {c['hash']}")
        out.append(Candidate(c["name"], cfg, dict(c["values"]), npas.count(cfg).flops_per_token))
    return out


def candidates(space: Space, n: int) -> list[Candidate]:
    """The space's baselines, then feasible samples of a seeded random sampler, one per allocation hash.
    For the frozen space, the frozen allocations first (``frozen_candidates``); samples beyond them are
    fitted by today's fit."""
    out: list[Candidate] = frozen_candidates(n)  # every caller samples SPACE
    seen: set[str] = {c.config.hash for c in out}
    names = {c.name for c in out}

    def add(name: str, cand: Any) -> None:
        if cand.feasible and cand.config.hash not in seen and name not in names:
            seen.add(cand.config.hash)
            out.append(Candidate(name, cand.config, dict(cand.values), npas.count(cand.config).flops_per_token))

    defaults = {k: kn.default for k, kn in space.chassis.items()}
    for name, vals in space.baselines().items():
        add(name, space.candidate({**defaults, **vals}))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=SAMPLER_SEED))
    for _ in range(50 * n):  # infeasible and duplicate samples are skipped; the space has plenty
        if len(out) >= n:
            break
        trial = study.ask()
        try:
            add(f"s{trial.number}", space.sample(trial))
        except NpasError:
            continue
    return out[:n]


def jobs_of(setup: Setup, cands: list[Candidate]) -> list[Job]:
    """Every run: the original table's over the first ``n_full`` candidates (``_table_jobs``, in its
    order and with its cache keys), then the horizon rows' (``_horizon_jobs``), then the original
    table's mid-length diagnostic (part of no verdict, so a time-boxed session spends its hours on
    the rows that decide something first)."""
    table = _table_jobs(setup, cands[:setup.n_full])
    return ([j for j in table if j.kind != "mid"] + _horizon_jobs(setup, cands)
            + [j for j in table if j.kind == "mid"])


def _horizon_jobs(setup: Setup, cands: list[Candidate]) -> list[Job]:
    """The horizon rows, all under the default parameterization: first one WSD run to T per candidate
    of the original table (its forks give the T/16 and T/4 rows, its end the WSD-at-T row; with the
    table's cached proxy and long runs they make an interim Delta-tau over ``n_full`` candidates
    after the fewest runs), then the candidates past ``n_full`` one at a time, cheapest first, each
    whole: its proxy, its long seeds and its WSD run -- a time-boxed session adds complete
    candidates to every row, where rows filled kind by kind would leave each of them partial."""
    if setup.wsd is None:
        return []
    by_cost = lambda cs: sorted(cs, key=lambda c: (c.flops, c.config.hash))  # noqa: E731
    out = [Job(c, "wsd", setup.proxy.seed, DEFAULT_PAR) for c in by_cost(cands[:setup.n_full])]
    for c in by_cost(cands[setup.n_full:]):
        out += [Job(c, "proxy", setup.proxy.seed, DEFAULT_PAR), Job(c, "long", setup.long_seeds[0], DEFAULT_PAR),
                Job(c, "wsd", setup.proxy.seed, DEFAULT_PAR)]
        out += [Job(c, "long", seed, DEFAULT_PAR) for seed in setup.long_seeds[1:]]
    return out


def _table_jobs(setup: Setup, cands: list[Candidate]) -> list[Job]:
    """The original table's runs, ordered so a time-boxed session completes whole tables: per long seed, per
    parameterization (the default, fair, first), the candidates cheapest first (FLOPs per token), each
    with its proxy run (first pass only) and long run. tau needs every candidate, so one complete
    fair table on one long seed says more than both parameterizations on two thirds of the candidates.
    The default parameterization's diagnostics come last: the proxy's repeats, then the proxy at
    MID_FACTOR x its steps (neither is part of the verdict)."""
    out: list[Job] = []
    by_cost = sorted(cands, key=lambda c: (c.flops, c.config.hash))
    for i, seed in enumerate(setup.long_seeds):
        for par in PARAMETERIZATIONS:
            for c in by_cost:
                if i == 0:
                    out.append(Job(c, "proxy", setup.proxy.seed, par))
                out.append(Job(c, "long", seed, par))
    for seed in setup.proxy_seeds[1:]:
        out.extend(Job(c, "proxy", seed, DEFAULT_PAR) for c in by_cost)
    out.extend(Job(c, "mid", setup.proxy.seed, DEFAULT_PAR) for c in by_cost)
    return out


def version_settings(setup: Setup) -> dict[str, Any]:
    """What every run shares: the base recipe, less what varies per run."""
    return recipe_settings(setup.proxy, leave_out=("seed", "parameterization"))


def code_version(setup: Setup) -> str:
    """The cosine runs' code version (``experiments/harness/version.py``): the numerics and the base recipe."""
    return harness_version("proxy_fidelity", version_settings(setup))


def wsd_version(setup: Setup) -> str:
    """A WSD run's second version, after ``code_version``: its recipe's (the schedule, decay and rungs)."""
    assert setup.wsd is not None
    return harness_version("proxy_fidelity/wsd", recipe_settings(setup.wsd, leave_out=("seed", "parameterization")))


# ------------------------------------------------------------------------------------------ runs
def runs_of(setup: Setup, cands: list[Candidate], version: str) -> jobs_lib.Runs:
    """The bench's runs as the harness trains, plans, reads and exports them (``experiments/harness/jobs.py``)."""
    return jobs_lib.Runs(jobs_of(setup, cands), lambda j: setup.out / f"{j.key(setup, version)}.json",
                         lambda j: (j.cand.config, j.recipe(setup), REFERENCE[0]),
                         lambda j: {"candidate": j.cand.name, "values": j.cand.values, "kind": j.kind, "seed": j.seed,
                                    "parameterization": j.parameterization, "code_version": version})


def run_missing(setup: Setup, cands: list[Candidate], version: str, max_minutes: float | None) -> tuple[int, int]:
    """Train every uncached job in order on the harness's pool (``experiments/harness/jobs.py``). After
    ``max_minutes`` no new run starts (runs in flight finish and are cached). Returns (ran, cached)."""
    setup.out.mkdir(parents=True, exist_ok=True)
    work = [0.0, 0.0]  # training FLOPs and wall seconds of this session's finished runs

    def fits(j: Job, now: float) -> bool:
        """Not past the box, nor (once a run has finished) would this run end more than 10% past it at
        this session's observed pace: a box is a promise about wall time, not only about starts."""
        if max_minutes is None:
            return True
        if now >= max_minutes * 60:
            return False
        if not work[0]:
            return True
        eta = j.tokens(setup) * 3 * j.cand.flops * work[1] / work[0]  # each run has its own worker
        return now + eta <= max_minutes * 60 * 1.1

    def progress(_i: int, _n: int, j: Job, rec: dict, elapsed: float) -> None:
        work[0] += rec["tokens"] * 3 * j.cand.flops
        work[1] += rec["wall_s"]
        print(f"  {j.kind:<5} {j.cand.name:<14} {j.parameterization:<8} seed {j.seed:<5} {rec['status']:<7} "
              f"val {_fmt(rec['val_loss'])} test {_fmt(rec['test_loss'])} {rec['wall_s']:.0f} s "
              f"({elapsed:.0f} s elapsed)", flush=True)

    # a long run that would overrun the box gives way to a cheaper proxy run behind it
    ran, cached, todo = jobs_lib.run_missing(runs_of(setup, cands, version), setup.workers,
                                             f" (code version {version}) in {setup.out}", progress, fits)
    stop = f"; time box of {max_minutes:g} min: {todo - ran} runs not started" if todo - ran else ""
    print(f"ran {ran}, cached {cached}{stop}", flush=True)
    return ran, cached


def _fmt(v: float | None) -> str:
    return f"{v:.4f}" if v is not None else "-"


# ------------------------------------------------------------------------------------------ plan
def measure_rate(setup: Setup, cands: list[Candidate], steps: int = 20) -> float:
    """Training FLOP/s of one worker, from a short proxy-shaped run of the median-cost candidate."""
    from npas.training.forks import train_model

    c = sorted(cands, key=lambda c: c.flops)[len(cands) // 2]
    r = Recipe.from_dict({**setup.proxy.to_dict(), "steps": steps, "warmup_steps": 1, "eval_every": steps,
                          "eval_batches": 1})
    _, res = train_model(c.config, r, jobs_lib.corpus(r))
    return res.tokens_per_s * 3 * c.flops


PLAN_COLUMNS = Columns((("candidate", "<14"), ("hash", "<18"), ("fwd FLOPs/tok", ">14,"), ("runs", ">6"),
                        ("tokens", ">14,"), ("est CPU-h", ">11.2f")))


def plan(setup: Setup, cands: list[Candidate], version: str) -> None:
    rate, runs = measure_rate(setup, cands), runs_of(setup, cands, version)
    jobs = runs.jobs
    print(f"measured: {rate / 1e9:.1f} GFLOP/s training per worker (20 proxy-shaped steps, this machine, now)")
    tokens, flops = (lambda j: j.tokens(setup)), (lambda j: j.cand.flops)
    total, left = cost_table(runs, [(c, [j for j in jobs if j.cand is c]) for c in cands], PLAN_COLUMNS,
                             lambda c, cost: (c.name, c.config.hash, c.flops, cost.runs, cost.tokens, cost.secs / 3600),
                             tokens, flops, rate)
    for kind in ("proxy", "long", "mid", "wsd"):
        js = [j for j in jobs if j.kind == kind]
        cost = runs.cost(js, tokens, flops, rate)
        print(f"  {kind:<6}{cost.runs:>4} runs, {cost.cached:>4} cached, {cost.tokens / 1e6:>8.1f}M tokens"
              f" ({', '.join(sorted({j.parameterization for j in js}))}; seeds {sorted({j.seed for j in js})})")
    print(f"plan: {len(jobs)} runs, {sum(map(tokens, jobs)) / 1e6:.0f}M training tokens -> ~{total / 3600:.1f} "
          f"CPU-hours (3x forward FLOPs, evaluation excluded); ~{left / 3600 / setup.workers:.1f} h wall left on "
          f"{setup.workers} workers ({1 - left / max(total, 1e-9):.0%} cached)")


# ------------------------------------------------------------------------------------------ report
def print_cache(setup: Setup, cands: list[Candidate], version: str) -> dict[str, Any]:
    """What the report reads: runs cached at `version` out of the bench's jobs (the verdict rows' and the
    diagnostics' apart), and the files of other code versions in the same folder, which it does not read."""
    runs = runs_of(setup, cands, version)
    jobs = runs.jobs
    have = [store.exists(runs.path(j)) for j in jobs]
    is_verdict = [j.kind == "long" or (j.kind == "proxy" and j.seed == setup.proxy.seed) for j in jobs]
    known = {j.key(setup, version) for j in jobs}
    others: dict[str, int] = {}
    for name in store.names(setup.out):
        stem = name.removesuffix(".json")
        if stem in known:
            continue
        head, v = stem.rsplit("-", 1)
        if head.endswith(f"-{version}"):  # a WSD run at this code version but other fork/schedule code
            v = f"{version}+wsd {v}"
        if v != version:
            others[v] = others.get(v, 0) + 1
    other = ", ".join(f"{n} of code version {v}" for v, n in sorted(others.items())) or "none"
    n_v = sum(is_verdict)
    h_v = sum(h for h, v in zip(have, is_verdict, strict=True) if v)
    where = setup.out.resolve()
    where = where.relative_to(ROOT) if where.is_relative_to(ROOT) else where
    print(f"cache {where}: {sum(have)} of {len(jobs)} runs at code version {version} ({h_v} of {n_v} for the "
          f"verdict rows, {sum(have) - h_v} of {len(jobs) - n_v} diagnostics); other files in the folder, not read: "
          f"{other}")
    return {"version": version, "cached": sum(have), "jobs": len(jobs), "other_versions": others}


def load(setup: Setup, cands: list[Candidate], version: str) -> dict[tuple, dict]:
    return {(j.cand.config.hash, j.kind, j.seed, j.parameterization): rec
            for j, rec in runs_of(setup, cands, version).cached()}


# ------------------------------------------------------------------------------------------ main
def make_setup(quick: bool, n_candidates: int | None, long_seeds: int | None, out: Path | None,
               workers: int, proxy_repeats: int | None = None) -> Setup:
    if quick:
        smoke = bench_recipe("smoke")
        proxy = Recipe.from_dict({**smoke.to_dict(), "name": "smoke-quick", "steps": 6, "warmup_steps": 2,
                                  "eval_every": 6, "eval_batches": 1, "batch_size": 4, "seq_len": 32})
        n, seeds, repeats, workers = n_candidates or 4, long_seeds or 1, proxy_repeats or 1, 1
        n_full = min(n, N_FULL)
        out = out or Path(tempfile.mkdtemp(prefix="npas-proxy-fidelity-"))
    else:
        proxy = bench_recipe("proxy")
        n, seeds, repeats, out = n_candidates or N_CANDIDATES, long_seeds or 2, proxy_repeats or 2, out or RESULTS
        n_full = min(n, N_FULL)
    long, mid = (Recipe.from_dict({**proxy.to_dict(), "name": f"{proxy.name}-x{f}", "steps": proxy.steps * f,
                                   "eval_every": proxy.steps * f}) for f in (LONG_FACTOR, MID_FACTOR))
    seeds_t = tuple(LONG_SEED_BASE + i for i in range(seeds))
    proxy_seeds = repeat_seeds(proxy.seed, repeats)
    assert not set(proxy_seeds) & set(seeds_t), "a long run must never reuse a proxy seed"
    return Setup(proxy, long, mid, n, seeds_t, out, max(1, workers), proxy_seeds, wsd_recipe(proxy, long), n_full)


def wsd_recipe(proxy: Recipe, long: Recipe) -> Recipe:
    """The proxy's recipe as a WSD run to the long length T at its horizon, rungs T/16, T/4 and T (a
    rung must clear the warmup): one run per candidate gives the two fork rows and the WSD-at-T row."""
    T = long.steps
    rungs = sorted({max(proxy.warmup_steps + 1, T // 16), T // 4, T})
    return Recipe.from_dict({**proxy.to_dict(), "name": f"{proxy.name}-wsd", "steps": T, "horizon": T,
                             "eval_every": T, "schedule": "wsd", "rungs": rungs})


REFERENCE: list[Any] = []  # the space's reference chassis, set where the space is loaded


def load_candidates(setup: Setup) -> tuple[Space, list[Candidate]]:
    from npas import load_corpus

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = load_space(SPACE).bind(vocab_size=load_corpus(setup.proxy.data).vocab_size)
    REFERENCE[:] = [space.reference_chassis]
    return space, candidates(space, setup.n_candidates)


def device_specs() -> list[dict]:
    """Every run of the full bench as a spec for experiments/device.py (GPU cache: RESULTS_GPU)."""
    setup = make_setup(False, None, None, RESULTS_GPU, 1)
    _, cands = load_candidates(setup)
    return runs_of(setup, cands, code_version(setup)).device_specs(test=True)


def main(argv: list[str] | None = None) -> int:
    p = bench_parser(__doc__.split("\n\n")[0], "4 candidates, smoke recipe at 6 steps, temp dir", RESULTS)
    p.add_argument("--candidates", type=int, default=None,
                   help=f"candidates (default {N_CANDIDATES}: the first {N_FULL} with the full table; 4 quick)")
    p.add_argument("--long-seeds", type=int, default=None, help="fresh seeds per long run (default 2; 1 quick)")
    p.add_argument("--proxy-repeats", type=int, default=None,
                   help=f"proxy seeds per candidate under {DEFAULT_PAR}, those `npas search --repeats R` trains, "
                        "for the repeats row (default 2; 1 quick)")
    p.add_argument("--max-minutes", type=float, default=None, help="start no new run after this many minutes")
    a = p.parse_args(argv)
    if a.candidates is not None and a.candidates < 3:
        p.error("--candidates must be at least 3 (a rank correlation needs them); try 12")
    if a.long_seeds is not None and a.long_seeds < 1:
        p.error("--long-seeds must be at least 1")
    if a.proxy_repeats is not None and not 1 <= a.proxy_repeats <= 10:
        p.error("--proxy-repeats must be from 1 to 10 (1: no repeats row); try 2")
    if a.max_minutes is not None and a.max_minutes < 0:
        p.error("--max-minutes must be >= 0")
    setup = make_setup(a.quick, a.candidates, a.long_seeds, a.out, a.workers, a.proxy_repeats)
    space, cands = load_candidates(setup)
    version = version_to_read(p, a, code_version(setup))
    print(f"[proxy_fidelity] space {SPACE.relative_to(ROOT)} (frozen copy of full.yaml), {len(cands)} candidates "
          f"({sum(c.name in space.baselines() for c in cands)} baselines) | proxy {setup.proxy.name}: "
          f"{setup.proxy.steps} steps x {setup.proxy.tokens_per_step} tokens, seed {setup.proxy.seed} | long: "
          f"{setup.long.steps} steps, seeds {list(setup.long_seeds)} | parameterizations {list(PARAMETERIZATIONS)} | "
          f"proxy repeats ({DEFAULT_PAR}): seeds {list(setup.proxy_seeds)}",
          flush=True)
    if a.plan:
        plan(setup, cands, version)
        return 0
    if not a.report:
        run_missing(setup, cands, version, a.max_minutes)
    print_cache(setup, cands, version)
    res = load(setup, cands, version)
    report(setup, cands[:setup.n_full], res)
    horizon_report(setup, cands, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
