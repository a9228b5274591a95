"""What the sampler is told about trials the ladder stops below T, and what the ladder does to a search:
hypervolume of the front at T after N started candidates, then after a second driver extends the
study to 2N (as `npas resume --trials 2N` does).

    python experiments/ladder_sampler.py            # N=40, 8 seeds, experiments/spaces/full_frozen.yaml (~3 min)
    python experiments/ladder_sampler.py --quick    # N=12, 2 seeds: a smoke run

Nothing is trained. As in ``benchmarks/search_efficiency.py`` each candidate's loss at T is the SYNTHETIC,
deterministic ``surrogate_loss`` of its fitted allocation (so the bench measures the search, not the
proxy's noise); train_memory_bytes is exact (``npas.count``). A rung r < T reports a finished-at-r
loss, also synthetic:

    L(r) = L(T) + A * m(cfg) * ((T / r) ** ALPHA - 1) + SIGMA * z(cfg, r)

with A = 0.25, ALPHA = 0.5 (0.75 nats above L(T) at T/16, 0.25 at T/4), m(cfg) in [0.5, 1.5] and
z(cfg, r) ~ N(0, 1), both fixed per allocation by its hash: allocations learn at different speeds, so
rung order and order at T disagree (SIGMA = 0.023 nats, the proxy's residual against the long run
measured on experiments/proxy_fidelity.py's cache, issue #33).

Each search runs npas's own ``NpasSearcher`` (asks, infeasible and duplicate handling, baselines,
telling) and npas's own ``Ladder`` (rungs T/16, T/4, T; eta 4; asynchronous promotion with the tie
rule) in-process, one worker: a promoted paused trial resumes before a new one starts, a trial not
promoted pauses, and when the searcher has started N candidates every trial still paused is stopped
and told -- the moment `npas search` tells them. Arms, on the same seeds:

- ``constraint``: stopped trials told COMPLETE with their last rung loss and a violated fidelity
  constraint (what npas does; TPE models them as infeasible);
- ``fail``: told FAIL (every sampler ignores them);
- ``plain``: told COMPLETE with their last rung loss as if at T, no constraint;
- ``all-to-T``: no ladder, every candidate trains to T (`--no-early-stop`).

While a search runs, paused trials are RUNNING: TPE's constant liar counts them as worst, whatever
they will be told. So the telling matters when a study is extended: the second driver's sampler
learns from the first driver's stopped trials as they were told. Both drivers' ladders hold every
trial with rung losses (``Ladder.rebuild`` on all of them, so the arms differ only in what the
sampler saw).

Compute is counted in steps as the ladder counts ``trained_steps``: the top rung reached plus each
passed rung's cooldown fork (DECAY x rung); all-to-T trains T per candidate. Prints mean HV per arm
at N and 2N with paired 95% intervals of each arm's HV minus ``constraint``'s (t over seeds), and the
compute. Exits 0.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import optuna

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.search_efficiency import SPACE, SharedHV, surrogate_loss  # noqa: E402
from npas import ArchConfig, TrialAttr, open_storage  # noqa: E402
from npas.service.search.admission import objective_config as ladder_objective_config  # noqa: E402
from npas.service.search.recorder import STOPPED_AS  # noqa: E402
from npas.service.search.samplers import enqueue_baselines, make_sampler  # noqa: E402
from npas.service.search.searcher import NpasSearcher  # noqa: E402
from npas.service.study.fidelity import mean_interval  # noqa: E402
from npas.service.study.ladder import Ladder, RungResult  # noqa: E402

T = 1600  # the top rung (steps); rungs at T/16 and T/4 below it
RUNGS = (T // 16, T // 4, T)
DECAY = 0.2  # the cooldown fork's share of a rung (the shipped wsd recipes' decay fraction)
A, ALPHA, SIGMA = 0.25, 0.5, 0.023
OBJECTIVES = ["val_loss", "train_memory_bytes"]
ARMS = (*STOPPED_AS, "all-to-T")


def _unit(key: str) -> float:
    """A fixed number in [0, 1) from a string (the allocation's hash and a salt)."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:12], 16) / 16 ** 12


def rung_loss(cfg: ArchConfig, rung: int) -> float:
    """The synthetic finished-at-``rung`` loss (module docstring)."""
    at_t = surrogate_loss(cfg)
    if rung >= T:
        return at_t
    m = 0.5 + _unit(cfg.hash + "speed")
    u1, u2 = max(_unit(f"{cfg.hash}z{rung}a"), 1e-12), _unit(f"{cfg.hash}z{rung}b")
    z = math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)  # Box-Muller
    return at_t + A * m * ((T / rung) ** ALPHA - 1) + SIGMA * z


def _ladder_of(study: optuna.Study) -> Ladder:
    """Every trial with rung losses, whatever it was told (the arms differ only in what the sampler saw)."""
    losses, objs = {}, {}
    for t in study.get_trials(deepcopy=False):
        rungs = t.user_attrs.get(TrialAttr.RUNG_LOSSES)
        mem = (t.user_attrs.get("bench_objectives") or None)
        if rungs and mem is not None:
            losses[f"study:{t.number}"] = {int(k): float(v) for k, v in rungs.items()}
            objs[f"study:{t.number}"] = tuple(mem)
    return Ladder.rebuild(RUNGS, losses, objectives=objs)


def drive(study: optuna.Study, space, arm: str, started_target: int, batch: int, seq: int) -> int:
    """One driver: start candidates until the study holds ``started_target`` of them, climbing each
    under the ladder (or straight to T for all-to-T); returns the steps it trained."""
    from ray.tune.search import Searcher

    recipe = {"batch_size": batch, "seq_len": seq, "steps": T, "schedule": "wsd"}
    searcher = NpasSearcher(study, space, recipe, "synthetic", 10 ** 6)
    if arm in STOPPED_AS:
        searcher.recorder.stopped_as = arm
    ladder = _ladder_of(study)
    started = sum(1 for t in study.get_trials(deepcopy=False) if TrialAttr.RUNG_LOSSES in t.user_attrs)
    climbing: dict[str, tuple[ArchConfig, tuple, bool]] = {}  # tid -> (allocation, objectives, baseline)
    passed: dict[str, dict[int, float]] = {}  # tid -> its loss at every rung it reported
    trained: dict[str, int] = {}  # tid -> steps trained: the top rung so far + a fork per rung below T
    paused: dict[str, int] = {}  # tid -> the rung it waits at
    i = 0

    def climb(tid: str, from_rung: int | None) -> None:
        cfg, objs, baseline = climbing[tid]
        todo = [T] if arm == "all-to-T" else [r for r in RUNGS if from_rung is None or r > from_rung]
        for r in todo:
            loss = rung_loss(cfg, r)
            losses = passed.setdefault(tid, {})
            losses[r] = loss
            trained[tid] = r + int(sum(DECAY * x for x in losses if x < T))
            proxy = {"status": "ok", "val_loss": loss, "steps_done": r, "rung_losses": dict(losses),
                     "steps_trained": trained[tid], "curve": [[r, loss]]}
            result = {"rung": r, "val_loss": loss, "step": r, "proxy": json.dumps(proxy)}
            searcher.on_trial_result(tid, result)
            searcher.live_trial(tid).set_user_attr(TrialAttr.RUNG_LOSSES,
                                                   {str(k): v for k, v in sorted(losses.items())})
            if arm != "all-to-T":
                ladder.report(r, RungResult(tid, loss, objs))
            if r == T:
                searcher.on_trial_complete(tid, {**result, "final": True})
                return
            if not (baseline or ladder.is_promoted(tid, r)):
                paused[tid] = r
                return

    while True:
        promoted = next((t for t, r in paused.items() if ladder.is_promoted(t, r)), None)
        if promoted is not None:
            climb(promoted, paused.pop(promoted))
            continue
        if started >= started_target:
            break
        tid = f"t{i}"
        i += 1
        config = searcher.suggest(tid)
        if config is Searcher.FINISHED:
            break
        if config is None:
            continue
        started += 1
        cfg = ArchConfig.from_dict(config["allocation"])
        trial = searcher._live[tid]
        objs = tuple(ladder_objective_config(OBJECTIVES, searcher.accounting_of(trial.number)).values())
        trial.set_user_attr("bench_objectives", list(objs))
        climbing[tid] = (cfg, objs, bool(config.get("baseline")))
        climb(tid, None)
    for tid in list(paused):  # the driver ends: trials no result can promote any more are stopped and told
        searcher.on_trial_complete(tid, None)
    return sum(trained.values())


def search(space, arm: str, seed: int, n: int, batch: int, seq: int) -> dict:
    tmp = tempfile.mkdtemp(prefix="npas-ls-")
    url = f"sqlite:///{tmp}/s.db"
    storage = open_storage(url).storage
    study = optuna.create_study(storage=storage, directions=["minimize"] * 2, sampler=make_sampler("tpe", seed, 2))
    enqueue_baselines(study, space, TrialAttr.BASELINE)
    out: dict = {"study": study.study_name, "storage": url}
    steps = 0
    for label, target in (("N", n), ("2N", 2 * n)):
        # the second driver is a new searcher on the same study (a fresh sampler of the same seed, as
        # `npas resume` builds): it learns from the first one's told trials
        study = optuna.load_study(study_name=study.study_name, storage=storage, sampler=make_sampler("tpe", seed + 1000 * (label == "2N"), 2))
        steps += drive(study, space, arm, target, batch, seq)
        at_t = [list(t.values) for t in study.get_trials(deepcopy=False)
                if t.state == optuna.trial.TrialState.COMPLETE and t.user_attrs.get(TrialAttr.FIDELITY) == T]
        out[label] = {"points": at_t, "steps": steps,
                      "started": sum(1 for t in study.get_trials(deepcopy=False) if TrialAttr.RUNG_LOSSES in t.user_attrs)}
    return out


def paired(xs: list[float]) -> str:
    """Mean with its 95% t interval over seeds (``npas.mean_interval``)."""
    iv = mean_interval(xs)
    return f"{iv.value:+.4f}" if iv.low is None else f"{iv.value:+.4f} [{iv.low:+.4f}, {iv.high:+.4f}]"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="N=12, 2 seeds")
    ap.add_argument("--trials", type=int, default=None, help="N, candidates started by the first driver (default 40)")
    ap.add_argument("--seeds", type=int, default=None, help="seeds 0..K-1 (default 8)")
    args = ap.parse_args(argv)
    n = args.trials or (12 if args.quick else 40)
    seeds = list(range(args.seeds or (2 if args.quick else 8)))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", message="Heartbeat of storage")

    from npas import load_recipe, load_space

    space = load_space(SPACE)
    rec = load_recipe(ROOT / "trials" / "proxy.yaml")
    print(f"npas bench: ladder vs the sampler; space {SPACE.relative_to(ROOT)}, tpe, N={n} then 2N, seeds "
          f"{seeds[0]}..{seeds[-1]}; SYNTHETIC losses (docstring): rungs {RUNGS}, A={A}, alpha={ALPHA}, "
          f"sigma={SIGMA}")
    t0 = time.perf_counter()
    runs = {(arm, s): search(space, arm, s, n, rec.batch_size, rec.seq_len) for s in seeds for arm in ARMS}
    hv = SharedHV([p for r in runs.values() for k in ("N", "2N") for p in r[k]["points"]])
    print(f"{len(runs)} searches in {time.perf_counter() - t0:.0f} s; HV: shared reference point, scaled as "
          "benchmarks/search_efficiency.py")
    print(f"\n{'arm':<11}{'HV@N':>9}{'HV@2N':>9}{'at T@2N':>9}{'steps@2N / (2N x T)':>22}   HV@2N - constraint's (paired, 95% t)")
    base = {s: hv(runs["constraint", s]["2N"]["points"]) for s in seeds}
    base_n = {s: hv(runs["constraint", s]["N"]["points"]) for s in seeds}
    for arm in ARMS:
        hn = [hv(runs[arm, s]["N"]["points"]) for s in seeds]
        h2 = [hv(runs[arm, s]["2N"]["points"]) for s in seeds]
        at_t = statistics.mean(len(runs[arm, s]["2N"]["points"]) for s in seeds)
        frac = statistics.mean(runs[arm, s]["2N"]["steps"] / (runs[arm, s]["2N"]["started"] * T) for s in seeds)
        diff = "" if arm == "constraint" else paired([h - base[s] for h, s in zip(h2, seeds, strict=True)])
        diff_n = "" if arm == "constraint" else "  (at N: " + paired(
            [h - base_n[s] for h, s in zip(hn, seeds, strict=True)]) + ")"
        print(f"{arm:<11}{statistics.mean(hn):>9.4f}{statistics.mean(h2):>9.4f}{at_t:>9.1f}{frac:>22.3f}   {diff}{diff_n}")
    # equal compute: all-to-T stopped after as many steps as the default ladder spent (its first k trials)
    eq = []
    for s_ in seeds:
        k = round(runs["constraint", s_]["2N"]["steps"] / T)
        eq.append((hv(runs["all-to-T", s_]["2N"]["points"][:k]), k))
    label = "all-to-T at the ladder's compute"
    print(f"{label:<34}HV@2N {statistics.mean(h for h, _ in eq):.4f} "
          f"(its first {statistics.mean(k for _, k in eq):.1f} candidates); ladder (constraint) minus it: "
          + paired([base[s_] - h for s_, (h, _) in zip(seeds, eq, strict=True)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
