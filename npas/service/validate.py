"""`npas validate`: retrain a study's front and a sample of its trials longer, on fresh seeds, and
score them on the held-out test split, so the study carries evidence of whether its ranking holds.

What is retrained (the plan, deterministic for a given study and options):
- the K front points with the lowest loss (the loss objective found by name), the point `--pick`
  chooses, and M other completed full-fidelity trials spread over the proxy-loss range (one per
  equal-count stratum, the one nearest the stratum's middle); the hand-crafted baselines are always
  among them;
- two matched baselines for the picked point: the dense untied model with equal stored parameters
  (the space's `narrow_untied` baseline is exactly that) and the dense untied model whose FLOPs per
  token come as close to the pick's as a uniform MLP width allows (the exact ratio is reported).

Each retraining is one trial of a linked Optuna study, ``"{study}:validate"``, in the same storage:
value = test loss, user attrs = source trial, seed, recipe, allocation hash and the job key. A job
whose key already has a COMPLETE trial never runs again, so a killed `npas validate` resumes where it
stopped, and plain ``optuna.load_study`` reads every number. The certificate (see
``npas.service.certificate``) goes into the source study's user attr ``fidelity_certificate``.

Seeds are fresh: ``10_000 + s``, never the proxy recipe's seed (training a pick again on the seed that
selected it would keep the luck that put it on the front: the winner's curse).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import logging
import os
import signal
import socket
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import optuna
from optuna.trial import FrozenTrial, TrialState

from npas.allocation.budget import count
from npas.allocation.config import ArchConfig
from npas.allocation.space import LOSS_OBJECTIVES
from npas.errors import StudyError
from npas.service import study as S
from npas.service.storage import open_storage, redact, resolve_url
from npas.training.recipe import Recipe

log = logging.getLogger(__name__)

LINKED_SUFFIX = ":validate"
SEED_BASE = 10_000  # fresh seeds are SEED_BASE + s: far from the small seeds recipes use
# linked-study trial attributes (readable by plain Optuna)
V_SOURCE, V_SEED, V_RECIPE, V_TEST_LOSS, V_HASH = "source_trial", "seed", "recipe", "test_loss", "allocation_hash"
V_KEY, V_ROLES, V_SPLIT, V_ALLOC, V_DRIVER, V_REASON = ("job_key", "roles", "split", "allocation", "driver",
                                                      "failure_reason")
V_SOURCE_STUDY = "source_study"  # linked study attr

Retrain = Callable[[ArchConfig, Recipe], float]  # (allocation, recipe with the fresh seed) -> test loss


class Interrupted(StudyError):
    """Stopped by SIGINT/SIGTERM; completed retrainings are kept and a rerun continues from them."""

    exit_code = 130


# ---- the one place that knows whether the corpus has a test split ------------------------------
def scoring_split() -> str:
    """'test' once `eval_batches` takes a split (the text-level train/validation/test split); until
    that lands, this build scores on the validation split and every certificate records so."""
    from npas.training.proxy import eval_batches

    return "test" if "split" in inspect.signature(eval_batches).parameters else "val"


def score_batches(corpus, recipe: Recipe):
    """The fixed scoring windows, drawn with the *long recipe's* own seed so every allocation and
    every fresh training seed is scored on the same text."""
    from npas.training.proxy import eval_batches

    split = scoring_split()
    return eval_batches(corpus, recipe, split=split) if split == "test" else eval_batches(corpus, recipe)


@functools.lru_cache(maxsize=2)
def _corpus(source: str | None, val_fraction: float, fingerprint: str):
    from npas.training.data import load_corpus

    corpus = load_corpus(source, val_fraction=val_fraction)
    if corpus.fingerprint != fingerprint:
        raise StudyError(f"the corpus at {source or 'bundled'} differs from the one the study ran on "
                         f"(fingerprint {corpus.fingerprint} != {fingerprint})")
    return corpus


def train_and_test(cfg: ArchConfig, recipe: Recipe, *, source: str | None, fingerprint: str,
                   score_recipe: dict) -> float:
    """The real retraining: train under ``recipe`` (fresh seed) and return the test-split loss."""
    from npas.training.proxy import evaluate, pick_device, train_model

    corpus = _corpus(source, recipe.val_fraction, fingerprint)
    model, result = train_model(cfg, recipe, corpus)
    if result.status != "ok":
        raise RuntimeError(f"retraining {result.status}: {result.failure_reason}")
    score = Recipe.from_dict(score_recipe)
    return evaluate(model, score_batches(corpus, score), pick_device(), score)


# ---- the plan --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Options:
    """What `npas validate` retrains and how; defaults fit about two hours on 2 CPU cores."""

    pick: str = "knee"
    top: int = 4  # front points with the lowest loss
    sample: int = 4  # other completed trials, baselines included (all baselines even if more)
    recipe: str = "long"
    seeds: int = 2  # fresh seeds per allocation; >= 2 so seed noise and SNR exist
    workers: int = 2  # concurrent retrainings on Ray; 0 runs them one by one in this process
    ray_address: str | None = None
    on_progress: Callable[[int, int], None] | None = field(default=None, compare=False)  # (done, total)

    def problems(self) -> list[str]:
        out = []
        if self.top < 1:
            out.append(f"--top must be >= 1, got {self.top}")
        if self.sample < 0:
            out.append(f"--sample must be >= 0, got {self.sample}")
        if self.seeds < 2:
            out.append(f"--seeds must be >= 2 (seed noise and signal-to-noise need two), got {self.seeds}")
        if self.workers < 0:
            out.append(f"--workers must be >= 0 (0 = in this process), got {self.workers}")
        how = self.pick
        ok = how in ("knee", "min-loss") or (how.startswith("trial=") and how[6:].isdigit()) or (
            how.startswith("max-memory=") and _is_number(how[11:]))
        if not ok:
            out.append(f"--pick {how!r} is not one of knee, min-loss, max-memory=BYTES, trial=N")
        return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Target:
    """One allocation to retrain on every seed."""

    cfg: ArchConfig
    roles: tuple[str, ...]  # front | sample | baseline | pick | memory_matched | flops_matched
    source: int | None  # trial number in the source study; None for the constructed FLOPs match
    proxy_loss: float | None
    label: str = ""  # baseline name or how the allocation was constructed


@dataclass(frozen=True)
class Plan:
    study: str
    targets: tuple[Target, ...]
    seeds: tuple[int, ...]
    recipe: Recipe
    pick: int  # source trial number of the picked point
    memory_matched: str | None  # allocation hashes of the matched baselines
    flops_matched: str | None
    flops_ratio: float | None  # matched FLOPs / picked FLOPs
    split: str
    fingerprint: str

    def key(self, target: Target, seed: int) -> str:
        """Same allocation, recipe, seed and data -> same retraining, whatever role it plays."""
        blob = json.dumps({"a": target.cfg.hash, "r": self.recipe.to_dict(), "s": seed, "d": self.fingerprint,
                           "split": self.split}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def jobs(self) -> list[tuple[Target, int, str]]:
        return [(t, s, self.key(t, s)) for t in self.targets for s in self.seeds]


def fresh_seeds(n: int, avoid: set[int]) -> tuple[int, ...]:
    seeds, s = [], SEED_BASE
    while len(seeds) < n:
        if s not in avoid:
            seeds.append(s)
        s += 1
    assert not set(seeds) & avoid, "a validation seed equals a recipe's seed"
    return tuple(seeds)


def loss_index(study: optuna.Study) -> int:
    names = list(study.metric_names or study.user_attrs.get(S.S_OBJECTIVES, []))
    for i, n in enumerate(names):
        if n in LOSS_OBJECTIVES:
            return i
    raise StudyError(f"study {study.study_name!r} has no loss objective (objectives: {names}); "
                     f"validation ranks by one of {', '.join(LOSS_OBJECTIVES)}")


def _cfg(t: FrozenTrial) -> ArchConfig:
    return ArchConfig.from_dict(t.user_attrs[S.T_ALLOC])


def flops_matched(cfg: ArchConfig, seq_len: int) -> tuple[ArchConfig, float]:
    """The dense untied uniform model on ``cfg``'s chassis whose FLOPs per token are nearest ``cfg``'s
    (FLOPs grow monotonically with the MLP width, so a bisection over the width finds it)."""
    c, L = cfg.chassis, cfg.chassis.n_layers
    target = count(cfg, seq_len=seq_len).flops_per_token

    def dense(w: int) -> ArchConfig:
        return ArchConfig(chassis=c, mlp_widths=(w,) * L, block_of_layer=tuple(range(L)), dtype=cfg.dtype)

    def flops(w: int) -> int:
        return count(dense(w), seq_len=seq_len).flops_per_token

    lo, hi = 1, max(2, 16 * c.d_ff)
    while lo < hi:  # smallest width with flops >= target
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if flops(mid) < target else (lo, mid)
    best = min({max(1, lo - 1), lo}, key=lambda w: (abs(flops(w) - target), w))
    return dense(best), flops(best) / target


def make_plan(study: optuna.Study, opts: Options, recipe: Recipe) -> Plan:
    li = loss_index(study)
    front = [t for t in S.front_trials(study) if S.T_ALLOC in t.user_attrs]
    front.sort(key=lambda t: t.values[li])
    picked = S.pick(study, opts.pick)
    targets: dict[str, dict] = {}  # allocation hash -> Target fields, in plan order

    def add(t: FrozenTrial | None, role: str, cfg: ArchConfig | None = None, label: str = "") -> str:
        cfg = cfg or _cfg(t)
        entry = targets.setdefault(cfg.hash, {"cfg": cfg, "roles": [], "source": t.number if t else None,
                                              "proxy_loss": t.values[li] if t else None, "label": label})
        if role not in entry["roles"]:
            entry["roles"].append(role)
        entry["label"] = entry["label"] or label
        return cfg.hash

    for t in front[:opts.top]:
        add(t, "front")
    add(picked, "pick")
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if S.is_full_fidelity(t) and S.T_ALLOC in t.user_attrs]
    baselines = sorted((t for t in done if t.user_attrs.get(S.T_BASELINE)), key=lambda t: t.number)
    for t in baselines:
        add(t, "baseline", label=str(t.user_attrs[S.T_BASELINE]))
    rest = sorted((t for t in done if _cfg_hash(t) not in targets), key=lambda t: (t.values[li], t.number))
    m = min(len(rest), max(0, opts.sample - len(baselines)))
    for k in range(m):  # the middle of each of m equal-count strata of the proxy-loss order
        add(rest[int((k + 0.5) * len(rest) / m)], "sample")
    narrow = next((t for t in baselines if t.user_attrs[S.T_BASELINE] == "narrow_untied"), None)
    mem = add(narrow, "memory_matched", label="narrow_untied") if narrow is not None else None
    seq_len = recipe.seq_len
    dense, ratio = flops_matched(_cfg(picked), seq_len)
    flo = add(None, "flops_matched", cfg=dense, label=f"dense untied d_ff={dense.mlp_widths[0]}")
    proxy_seed = int((study.user_attrs.get(S.S_RECIPE) or {}).get("seed", 0))
    seeds = fresh_seeds(opts.seeds, {proxy_seed, recipe.seed})
    return Plan(study=study.study_name,
                targets=tuple(Target(e["cfg"], tuple(e["roles"]), e["source"], e["proxy_loss"], e["label"])
                              for e in targets.values()),
                seeds=seeds, recipe=recipe, pick=picked.number, memory_matched=mem, flops_matched=flo,
                flops_ratio=ratio, split=scoring_split(), fingerprint=str(study.user_attrs.get(S.S_FINGERPRINT, "")))


def _cfg_hash(t: FrozenTrial) -> str:
    return str(t.user_attrs.get(S.T_HASH) or _cfg(t).hash)


# ---- the linked study ------------------------------------------------------------------------
def linked_name(name: str) -> str:
    return name + LINKED_SUFFIX


def open_linked(storage, source: optuna.Study) -> optuna.Study:
    linked = optuna.create_study(study_name=linked_name(source.study_name), storage=storage,
                                 directions=["minimize"], load_if_exists=True)
    if not linked.metric_names:
        linked.set_metric_names(["test_loss"])
        linked.set_user_attr(V_SOURCE_STUDY, source.study_name)
    return linked


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def recover(linked: optuna.Study) -> list[int]:
    """Fail the RUNNING retrainings of a validate process that died (killed, machine reset); refuse
    while another live process on this host still runs them."""
    here, failed = socket.gethostname(), []
    for t in linked.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        drv = t.user_attrs.get(V_DRIVER) or {}
        if drv.get("host") == here and drv.get("pid") and _alive(int(drv["pid"])) and drv["pid"] != os.getpid():
            raise StudyError(f"`npas validate {linked.user_attrs.get(V_SOURCE_STUDY)}` is already running "
                             f"(pid {drv['pid']}); wait for it or stop it first")
        linked._storage.set_trial_user_attr(t._trial_id, V_REASON, "orphaned: its validate process stopped")
        linked._storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
        failed.append(t.number)
    return failed


def completed_keys(linked: optuna.Study) -> set[str]:
    return {str(t.user_attrs.get(V_KEY)) for t in linked.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))}


# ---- running ---------------------------------------------------------------------------------
def validate(name: str, opts: Options | None = None, *, storage: str | None = None,
             retrain: Retrain | None = None) -> dict:
    """Run (or finish) the validation of study ``name`` and return its fidelity certificate."""
    from npas.service.certificate import CERTIFICATE_ATTR, build_certificate
    from npas.training.recipe import load_recipe

    opts = opts or Options()
    problems = opts.problems()
    if problems:
        raise StudyError("; ".join(problems))
    recipe = load_recipe(opts.recipe)
    url = resolve_url(storage)
    st = open_storage(url)
    source = S.load(name, st, url)
    plan = make_plan(source, opts, recipe)
    linked = open_linked(st, source)
    orphans = recover(linked)
    if orphans:
        log.warning("failed orphaned retrainings %s of a stopped validate run", orphans)
    done = completed_keys(linked)
    jobs, seen = [], set(done)
    for target, seed, key in plan.jobs():
        if key not in seen:
            seen.add(key)
            jobs.append((target, seed, key))
    total = len({k for _, _, k in plan.jobs()})
    if retrain is None:
        ua = source.user_attrs
        retrain = functools.partial(train_and_test, source=ua.get(S.S_DATA), fingerprint=plan.fingerprint,
                                    score_recipe=recipe.to_dict())
    log.info("validate %s: %d retrainings planned, %d already done", name, total, total - len(jobs))
    if jobs:
        _execute(linked, plan, jobs, retrain, opts, total - len(jobs), total, url)
    cert = build_certificate(source, linked, plan)
    source.set_user_attr(CERTIFICATE_ATTR, cert)
    return cert


def _execute(linked: optuna.Study, plan: Plan, jobs: list, retrain: Retrain, opts: Options, done: int,
             total: int, url: str) -> None:
    live: dict = {}  # handle -> (trial, target, seed, key)

    def start(target: Target, seed: int, key: str) -> optuna.Trial:
        trial = linked.ask()
        for k, v in ((V_SOURCE, target.source), (V_SEED, seed), (V_RECIPE, plan.recipe.name), (V_KEY, key),
                     (V_HASH, target.cfg.hash), (V_ROLES, list(target.roles)), (V_SPLIT, plan.split),
                     (V_ALLOC, target.cfg.to_dict()),
                     (V_DRIVER, {"host": socket.gethostname(), "pid": os.getpid()})):
            trial.set_user_attr(k, v)
        return trial

    def finish(trial: optuna.Trial, loss: float | None, error: str | None) -> None:
        nonlocal done
        if error is None and loss is not None and loss == loss and loss != float("inf"):
            trial.set_user_attr(V_TEST_LOSS, float(loss))
            linked.tell(trial, float(loss))
            done += 1
        else:
            trial.set_user_attr(V_REASON, error or f"non-finite test loss {loss}")
            linked.tell(trial, state=TrialState.FAIL)
            log.warning("retraining trial %d failed: %s", trial.number, error)
        if opts.on_progress:
            opts.on_progress(done, total)

    def recipe_for(seed: int) -> Recipe:
        r = Recipe.from_dict({**plan.recipe.to_dict(), "seed": seed})
        assert r.seed != plan.recipe.seed, "a retraining reused the recipe's own seed"
        return r

    # the storage beats for trials of `study.optimize`; these retrainings are asked and told here,
    # and a killed run's trials are recovered by `recover` from the recorded driver instead
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
    previous = signal.getsignal(signal.SIGTERM)

    def _term(signum, frame):  # SIGTERM behaves like Ctrl-C: running retrainings are recorded as stopped
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)
    try:
        if opts.workers == 0:
            for target, seed, key in jobs:
                trial = start(target, seed, key)
                live[0] = (trial,)
                try:
                    loss, err = retrain(target.cfg, recipe_for(seed)), None
                except Exception as e:  # one failed retraining is recorded; the others go on
                    loss, err = None, f"{type(e).__name__}: {e}"
                live.clear()
                finish(trial, loss, err)
        else:
            _execute_ray(jobs, retrain, opts, plan, start, finish, recipe_for, live)
    except KeyboardInterrupt:
        for entry in live.values():
            with contextlib.suppress(Exception):
                entry[0].set_user_attr(V_REASON, "interrupted")
                linked.tell(entry[0], state=TrialState.FAIL)
        raise Interrupted(f"validation interrupted after {done} of {total} retrainings; run the same "
                          f"`npas validate {plan.study} --storage {redact(url)}` to continue") from None
    finally:
        signal.signal(signal.SIGTERM, previous)


def _call(retrain: Retrain, cfg: dict, recipe: dict) -> float:
    """Runs inside a Ray worker."""
    return float(retrain(ArchConfig.from_dict(cfg), Recipe.from_dict(recipe)))


def _execute_ray(jobs, retrain, opts, plan, start, finish, recipe_for, live) -> None:
    """Plain Ray tasks rather than Ray Tune: no scheduler decisions are needed (every retraining runs
    to the end), and the Optuna ask/tell stays in this process, the only writer of the database."""
    import ray

    from npas.service.runner import check_resources, init_ray

    init_ray(opts.ray_address, num_cpus=None)
    cpus = float(max(1, plan.recipe.threads))
    check_resources(max(1, opts.workers), cpus, 0.0)
    remote = ray.remote(num_cpus=cpus, max_retries=1)(_call)
    pending = list(jobs)
    while pending or live:
        while pending and len(live) < opts.workers:
            target, seed, key = pending.pop(0)
            trial = start(target, seed, key)
            ref = remote.remote(retrain, target.cfg.to_dict(), recipe_for(seed).to_dict())
            live[ref] = (trial,)
        ready, _ = ray.wait(list(live), num_returns=1)
        for ref in ready:
            (trial,) = live.pop(ref)
            try:
                finish(trial, ray.get(ref), None)
            except ray.exceptions.RayError as e:
                last = [ln for ln in str(e).strip().splitlines() if ln.strip()]
                finish(trial, None, "worker error: " + (last[-1] if last else type(e).__name__))
