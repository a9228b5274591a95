"""`npas validate`: retrain a study's front and a sample of its trials longer, on fresh seeds, and
score them on the held-out test split, so the study carries evidence of whether its ranking holds.

What is retrained is the plan (`npas.service.certify.targets`). Each retraining is one trial of a
linked Optuna study, ``"{study}:validate"``, in the same storage: value = test loss, user attrs =
source trial, seed, recipe, allocation hash and the job key. A job whose key already has a COMPLETE
trial never runs again, so a killed `npas validate` resumes where it stopped, and plain
``optuna.load_study`` reads every number. The certificate (``npas.service.certify.certificate``) is built
from the linked study alone and goes into the source study's user attr ``fidelity_certificate``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import warnings
from collections.abc import Callable

import optuna
from optuna.trial import TrialState

from npas.allocation.config import ArchConfig
from npas.allocation.space_parser import parse_space
from npas.errors import Interrupted, StudyError
from npas.service.certify.certificate import CERTIFICATE_ATTR, build_certificate
from npas.service.certify.targets import Options, Plan, Target, make_plan, score_batches
from npas.service.execution import session
from npas.service.execution.session import sigterm_as_interrupt
from npas.service.execution.worker import WorkerSpec
from npas.service.study import faults, studies
from npas.service.study.optuna_adapter import storage_of, trial_id
from npas.service.study.record import RetrainAttr
from npas.service.study.storage import open_storage
from npas.service.study.urls import redact, resolve_url
from npas.training.forks import train_model
from npas.training.lr_factor import at_lr_factor
from npas.training.proxy import eval_tokens_per_byte, evaluate, pick_device
from npas.training.recipe import Recipe, load_recipe

log = logging.getLogger(__name__)

LINKED_SUFFIX = ":validate"

Retrain = Callable[[ArchConfig, Recipe], float]  # (allocation, recipe with the fresh seed) -> test loss


class ClusterLost(StudyError):
    """Ray itself stopped running tasks (its raylet or every worker died): stop instead of failing
    every remaining retraining in turn."""

    exit_code = 1


def train_and_test(cfg: ArchConfig, recipe: Recipe, *, spec: WorkerSpec, searched: Recipe,
                   score_recipe: dict) -> float:
    """The real retraining: train under ``recipe`` (fresh seed) and return the test-split loss.

    The corpus is split as the study's search split it (the `searched` recipe's ``val_fraction`` and
    ``test_fraction``), so the held-out text is the text the search never read, whatever the long
    recipe says; `spec` is what the search's workers got (corpus, tokenizer, reference chassis)."""
    corpus = spec.load_corpus(searched)
    model, result = train_model(cfg, recipe, corpus, reference=spec.reference)
    if result.status != "ok":
        raise RuntimeError(f"retraining {result.status}: {result.failure_reason}")
    score = Recipe.from_dict(score_recipe)
    return evaluate(model, score_batches(corpus, score), pick_device(), score)


_REAL_RETRAIN = train_and_test  # bits per byte come from the corpus this function trains on


# ---- the linked study ------------------------------------------------------------------------
def linked_name(name: str) -> str:
    return name + LINKED_SUFFIX


def open_linked(storage, source: optuna.Study) -> optuna.Study:
    linked = optuna.create_study(study_name=linked_name(source.study_name), storage=storage,
                                 directions=["minimize"], load_if_exists=True)
    if not linked.metric_names:
        linked.set_metric_names(["test_loss"])
        linked.set_user_attr(RetrainAttr.SOURCE_STUDY, source.study_name)
    return linked


def recover(linked: optuna.Study) -> list[int]:
    """Fail the RUNNING retrainings of a validate process that died (killed, machine reset); refuse
    while another live process on this host still runs them."""
    failed = []
    for t in linked.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        drv = t.user_attrs.get(RetrainAttr.DRIVER) or {}
        if faults.runs_elsewhere_here(drv):  # the search's check: host, PID namespace, boot, a live pid
            raise StudyError(f"`npas validate {linked.user_attrs.get(RetrainAttr.SOURCE_STUDY)}` is already running "
                             f"(pid {drv['pid']}); wait for it or stop it first")
        storage_of(linked).set_trial_user_attr(trial_id(t), RetrainAttr.REASON, "orphaned: its validate process stopped")
        storage_of(linked).set_trial_state_values(trial_id(t), state=TrialState.FAIL)
        failed.append(t.number)
    return failed


def completed_keys(linked: optuna.Study) -> set[str]:
    return {str(t.user_attrs.get(RetrainAttr.KEY)) for t in linked.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))}


# ---- running ---------------------------------------------------------------------------------
def certify(name: str, opts: Options | None = None, *, storage: str | None = None,
            retrain: Retrain | None = None, bits_per_nat: float | None = None) -> dict:
    """Run (or finish) the validation of study ``name`` and return its fidelity certificate.
    ``bits_per_nat`` converts its test losses to bits per byte; the real retraining computes it
    from the study's corpus and tokenizer (a custom ``retrain`` may pass it, else it stays None)."""
    opts = opts or Options()
    problems = opts.problems()
    if problems:
        raise StudyError("; ".join(problems))
    recipe = load_recipe(opts.recipe)
    if opts.threads is not None:
        recipe = Recipe.from_dict({**recipe.to_dict(), "threads": opts.threads})
    url = resolve_url(storage)
    handle = open_storage(url)
    st = handle.storage
    source = studies.load(name, handle)
    plan = make_plan(source, opts, recipe)
    if plan.note:  # located factors of another recipe's rate: retrained at x1 (or anyway), said once
        (opts.on_note or log.warning)(plan.note)
    short = sorted({t.cfg.chassis.context for t in plan.targets if t.cfg.chassis.context < recipe.seq_len})
    if short:
        raise StudyError(f"recipe {recipe.name!r} trains at seq_len={recipe.seq_len} but study {name!r} has "
                         f"allocations with context {short[0]}; pick a recipe with seq_len <= {short[0]}")
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
        record = studies.read_record(source)
        searched = Recipe.from_dict(dict(record.recipe))
        space = parse_space(record.space_text, record.space_source).rebind(record.overrides)
        retrain = functools.partial(train_and_test, spec=WorkerSpec.of_record(record, space.reference_chassis),
                                    searched=searched, score_recipe=recipe.to_dict())
    log.info("validate %s: %d retrainings planned, %d already done", name, total, total - len(jobs))
    if jobs:
        _execute(linked, plan, jobs, retrain, opts, total - len(jobs), total, url)
    cert = build_certificate(source, linked, plan)
    if cert["complete"] == 0:  # a certificate without one scored allocation would certify nothing
        why = _nothing_scored(name, linked, cert["planned"])
        if not linked.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            # failures alone: nothing a rerun could use, so the storage is left as before the run
            optuna.delete_study(study_name=linked.study_name, storage=st)
        raise StudyError(why)
    if bits_per_nat is None and isinstance(retrain, functools.partial) and retrain.func is _REAL_RETRAIN:
        bits_per_nat = _bits_per_nat(retrain.keywords, recipe)  # the study's own corpus and tokenizer
    cert["bits_per_byte_per_nat"] = bits_per_nat
    if bits_per_nat is not None:  # every test loss also in bits per byte, comparable across tokenizers
        for row in cert["allocations"]:
            row["test_mean_bpb"] = None if row.get("test_mean") is None else row["test_mean"] * bits_per_nat
    source.set_user_attr(CERTIFICATE_ATTR, cert)
    return cert


def _nothing_scored(name: str, linked: optuna.Study, planned: int) -> str:
    """Why no certificate is stored: every planned allocation has a retraining that failed or diverged.
    A linked study of failures alone is deleted (`certify`); completed retrainings stay for a rerun."""
    failed = linked.get_trials(deepcopy=False, states=(TrialState.FAIL,))
    reasons = sorted({str(t.user_attrs.get(RetrainAttr.REASON, "failed")).splitlines()[0][:160] for t in failed})
    why = f"; e.g. {reasons[0]}" if reasons else ""
    kept = len(linked.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    stored = (f"no certificate was stored, and the {kept} completed retraining(s) are kept in study "
              f"{linked.study_name!r} (a rerun skips them)") if kept else "nothing was stored"
    return (f"no certificate for study {name!r}: none of its {planned} allocations finished all its retrainings "
            f"({len(failed)} failed or diverged{why}); {stored}. Check the recipe (a lower lr, --recipe) and rerun")


def _bits_per_nat(kw: dict, score: Recipe) -> float:
    """Bits per byte of one nat per token on the test windows this certificate scores: the scored
    tokens per UTF-8 byte of those windows over ln 2 (a char model on ASCII text: 1 / ln 2)."""
    corpus = kw["spec"].load_corpus(kw["searched"])
    return eval_tokens_per_byte(corpus, score, "test") / math.log(2)


def _execute(linked: optuna.Study, plan: Plan, jobs: list, retrain: Retrain, opts: Options, done: int,
             total: int, url: str) -> None:
    live: dict = {}  # handle -> (trial, target, seed, key)

    def start(target: Target, seed: int, key: str) -> optuna.Trial:
        trial = linked.ask()
        for k, v in ((RetrainAttr.SOURCE, target.source), (RetrainAttr.SEED, seed), (RetrainAttr.RECIPE, plan.recipe.name), (RetrainAttr.KEY, key),
                     (RetrainAttr.HASH, target.cfg.hash), (RetrainAttr.ROLES, list(target.roles)), (RetrainAttr.SPLIT, plan.split),
                     (RetrainAttr.ALLOC, target.cfg.to_dict()),
                     (RetrainAttr.DRIVER, faults.driver_id())):
            trial.set_user_attr(k, v)
        if target.lr_factor != 1.0:  # the rate it is retrained at: the source trial's located factor
            trial.set_user_attr(RetrainAttr.LR_FACTOR, target.lr_factor)
        return trial

    def finish(trial: optuna.Trial, loss: float | None, error: str | None) -> None:
        nonlocal done
        if error is None and loss is not None and loss == loss and loss != float("inf"):
            trial.set_user_attr(RetrainAttr.TEST_LOSS, float(loss))
            linked.tell(trial, float(loss))
            done += 1
        else:
            trial.set_user_attr(RetrainAttr.REASON, error or f"non-finite test loss {loss}")
            linked.tell(trial, state=TrialState.FAIL)
            log.warning("retraining trial %d failed: %s", trial.number, error)
        if opts.on_progress:
            opts.on_progress(done, total)

    def recipe_for(seed: int, target: Target) -> Recipe:
        """The long recipe on a fresh seed, at the target's located learning-rate factor."""
        r = plan.recipe.with_seed(seed)
        assert r.seed != plan.recipe.seed, "a retraining reused the recipe's own seed"
        return at_lr_factor(r, target.lr_factor)

    # the storage beats for trials of `study.optimize`; these retrainings are asked and told here,
    # and a killed run's trials are recovered by `recover` from the recorded driver instead
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
    remote = _start_ray(opts, plan) if opts.workers > 0 else None  # before our handler: ray.init sets its own
    try:
        with sigterm_as_interrupt():  # running retrainings are recorded as stopped
            _run_jobs(jobs, retrain, opts, plan, start, finish, recipe_for, live, remote)
    except ClusterLost:
        _abandon(linked, live, "abandoned: Ray stopped running retrainings")
        raise
    except KeyboardInterrupt:
        _abandon(linked, live, "interrupted")
        raise Interrupted(f"validation interrupted after {done} of {total} retrainings; run the same "
                          f"`npas validate {plan.study} --storage {redact(url)}` to continue") from None


def _run_jobs(jobs, retrain, opts, plan, start, finish, recipe_for, live, remote) -> None:
    """The retrainings, one after another here (`--workers 0`) or as Ray tasks."""
    if opts.workers == 0:
        for target, seed, key in jobs:
            trial = start(target, seed, key)
            live[0] = (trial,)
            try:
                loss, err = retrain(target.cfg, recipe_for(seed, target)), None
            except Exception as e:  # one failed retraining is recorded; the others go on
                loss, err = None, f"{type(e).__name__}: {e}"
            live.clear()
            finish(trial, loss, err)
    else:
        _execute_ray(remote, jobs, retrain, opts, plan, start, finish, recipe_for, live)


def _abandon(linked: optuna.Study, live: dict, reason: str) -> None:
    for entry in live.values():
        with contextlib.suppress(Exception):
            entry[0].set_user_attr(RetrainAttr.REASON, reason)
            linked.tell(entry[0], state=TrialState.FAIL)
    live.clear()


def _call(retrain: Retrain, cfg: dict, recipe: dict) -> float:
    """Runs inside a Ray worker."""
    return float(retrain(ArchConfig.from_dict(cfg), Recipe.from_dict(recipe)))


def _start_ray(opts: Options, plan: Plan):
    """Plain Ray tasks rather than Ray Tune: no scheduler decisions are needed (every retraining runs
    to the end), and the Optuna ask/tell stays in this process, the only writer of the database."""
    import ray

    session.init_ray(opts.ray_address, num_cpus=None)
    cpus = float(max(1, plan.recipe.threads))
    session.check_resources(max(1, opts.workers), cpus, 0.0)
    return ray.remote(num_cpus=cpus, max_retries=1)(_call)


def _execute_ray(remote, jobs, retrain, opts, plan, start, finish, recipe_for, live) -> None:
    import ray

    pending = list(jobs)
    lost = 0  # retrainings lost in a row to Ray itself (a dead worker, node or raylet), not to training
    while pending or live:
        while pending and len(live) < opts.workers:
            target, seed, key = pending.pop(0)
            trial = start(target, seed, key)
            ref = remote.remote(retrain, target.cfg.to_dict(), recipe_for(seed, target).to_dict())
            live[ref] = (trial,)
        ready, _ = ray.wait(list(live), num_returns=1)
        for ref in ready:
            (trial,) = live.pop(ref)
            try:
                finish(trial, ray.get(ref), None)
                lost = 0
            except ray.exceptions.RayTaskError as e:  # the retraining itself raised: record it, go on
                last = [ln for ln in str(e).strip().splitlines() if ln.strip()]
                finish(trial, None, "retraining error: " + (last[-1] if last else type(e).__name__))
                lost = 0
            except ray.exceptions.RayError as e:  # Ray lost the task (after its own retry)
                finish(trial, None, f"worker error: {' '.join(str(e).split())[:200]}")
                lost += 1
                if lost > opts.workers:  # not one unlucky worker: the cluster is gone
                    raise ClusterLost(f"Ray stopped running retrainings ({' '.join(str(e).split())[:120]}); "
                                      f"completed ones are kept: rerun the same `npas validate {plan.study}` "
                                      f"to continue") from None
