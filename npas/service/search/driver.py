"""`npas.search` and `npas.resume`: launch, join or continue a study, the Python API behind the CLI.

`search(plan)` runs a `SearchPlan` (`npas.service.search.plan`), whose checks have all run; a resume
and a joining driver rebuild the same kind of plan from the study's record (`plan_resume`).
Everything a resume needs is written into the study when it is created (its `StudyRecord`), so
`resume(name)` needs nothing but the name and the storage URL. The record is the truth for every
later driver: a joiner (`search --study NAME` on an existing study) or a resume either matches the
stored recipe, sampler, seed and early stopping or is refused with the reason; the trial target is
study-wide and changes only when `trials` is given, which is logged. Ray is started (and a cluster's
address and authentication proven) before anything is written, so a driver that cannot run leaves
the database as it found it. A space with learned sharing groups gets its layer similarity once, from
the creating driver (`npas.service.search.learned`), and every later driver reads it from the record.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import optuna

from npas import __version__
from npas.allocation.space import Space
from npas.errors import ArgumentError, Interrupted, StudyError
from npas.service.execution import session
from npas.service.execution.worker import WorkerSpec
from npas.service.search import learned as groups
from npas.service.search.admission import ranked_objectives
from npas.service.search.join import check_join, join_problem
from npas.service.search.ladder_run import SearchLadder, rebuild
from npas.service.search.launch import Launch
from npas.service.search.plan import (
    DEFAULT_TRIALS,
    SearchPlan,
    check_launch,
    check_space_change,
    plan_resume,
    plan_search,
)
from npas.service.search.plan_checks import check_keywords, check_plan, check_resume_arguments, check_space
from npas.service.search.rung_exchange import RungExchange
from npas.service.search.runner import run_trials
from npas.service.search.samplers import enqueue_baselines, make_sampler
from npas.service.search.searcher import NpasSearcher
from npas.service.study import faults
from npas.service.study.record import StudyAttr, StudyRecord, TrialAttr
from npas.service.study.storage import StorageHandle, open_storage
from npas.service.study.studies import is_set_up, load, mark_ready, read_record, write_record
from npas.training.proxy import eval_tokens_per_byte

__all__ = ["DEFAULT_TRIALS", "SearchPlan", "check_space_change", "plan_search", "resume", "search"]

log = logging.getLogger(__name__)

SETUP_WAIT_S = 60.0  # how long a joining driver waits for the creator to finish writing the study's record


def search(plan: SearchPlan | Space, **options: Any) -> optuna.Study:
    """Run a `SearchPlan`: create its study and run it to its target of proxy runs, or join the study
    of that name. Given a `Space`, the plan is first built from `options` (`plan_search`'s keywords:
    trials, study, storage, recipe, data, budget, sampler, seed, launch, repeats, init_from, tokenizer,
    data_glob, text_field, budget_scope, corpus, locate_lr), with every check run there, once. A plan
    built by hand or altered with `dataclasses.replace` (not `plan.checked`) has its cheap checks run
    here, before Ray or the database (`plan_checks.check_plan`).

    It may run in any thread. On the main thread SIGTERM stops it like Ctrl-C (running trials are
    recorded and re-enqueued, `resume` continues); elsewhere no signal handler can be installed, so
    none is, and the calling program's own SIGTERM handling applies."""
    if isinstance(plan, SearchPlan):
        if options:
            raise ArgumentError(f"search(plan) takes no other options, got {sorted(options)}; pass them to "
                                "npas.plan_search, or search(space, **options)")
        if not plan.checked:
            plan = dataclasses.replace(plan, launch=check_plan(plan))
    else:
        check_space(plan, "search")
        check_keywords("search", options, plan_search)
        plan = plan_search(plan, **options)
    space, rec, corpus = plan.space, plan.recipe, plan.corpus
    chosen = make_sampler(plan.sampler, plan.seed, len(space.objectives))
    check_join(plan)  # read-only, before Ray
    cpus = _prove_ray(plan)  # before the first write
    handle = open_storage(plan.storage)
    try:
        created = optuna.create_study(study_name=plan.study_name, storage=handle.storage,
                                      directions=["minimize"] * len(space.objectives), sampler=chosen)
    except optuna.exceptions.DuplicatedStudyError:
        return _join(plan, handle)
    learned = groups.learn_for_study(created, handle, plan) if space.learns_groups else None
    if learned is not None:
        space = space.with_similarity(learned["similarity"])
        plan = dataclasses.replace(plan, space=space)
    record = StudyRecord(
        version=__version__, space_text=space.text, space_hash=space.hash, space_name=space.name,
        space_source=space.source, budget_params=space.budget_params, budget_spec=space.budget_spec,
        reference_params=space.reference_params, recipe=rec.to_dict(),
        data_source=None if corpus.source.startswith("bundled") else corpus.source,
        data_fingerprint=corpus.fingerprint, vocab_size=corpus.vocab_size, objectives=tuple(space.objectives),
        sampler=plan.sampler, seed=plan.seed, early_stop=plan.early_stop, target_trials=plan.target,
        overrides=dict(space.overrides), data_split=corpus.describe()["split"], repeats=plan.repeats,
        tokenizer=plan.tokenizer, tokenizer_json=corpus.tokenizer.to_json(),
        tokenizer_fingerprint=corpus.tokenizer.fingerprint, data_glob=corpus.glob, text_field=corpus.text_field,
        init_from=plan.init_from, learned=learned, locate_lr=plan.locate_lr)
    created.set_metric_names(list(space.objectives))
    write_record(created, record)
    enqueue_baselines(created, space, TrialAttr.BASELINE)  # with knob values as params, so samplers model them
    mark_ready(created)  # last: a driver joining by name waits for this
    _run(created, handle, plan, record, record.target_trials, cpus)
    return created


def _prove_ray(plan: SearchPlan) -> float:
    """Start or join Ray and check the resources a trial needs; returns the CPUs per trial."""
    session.init_ray(plan.launch.ray_address, num_cpus=None)
    session.check_resources(plan.launch.workers, plan.cpus_per_trial, plan.launch.gpus_per_trial)
    return plan.cpus_per_trial


def _join(plan: SearchPlan, handle: StorageHandle) -> optuna.Study:
    """`npas search --study S` on an existing study: another driver joins it (PostgreSQL), or a
    stopped one continues (SQLite), provided the space, its launch overrides and the settings match."""
    name = plan.study_name
    existing = _await_setup(name, handle)
    record = read_record(existing)
    if problem := join_problem(plan, record, handle.redacted):
        raise StudyError(problem)
    # the plan's starting model, read and described once by plan_search: the resume plan checks it is the study's
    return _continue(handle, existing, record, trials=plan.trials, data=plan.data, launch=plan.launch,
                     init_from=plan.init_from)


def _await_setup(name: str, handle: StorageHandle) -> optuna.Study:
    """Wait for a study's creator to finish writing its record and baselines.

    Optuna writes study attributes one at a time, so two drivers started together on one
    PostgreSQL study can see it half-written; the joiner polls for the ready marker rather than
    misreading a partial record as a different space. A creator that pretrains the model of its
    learned groups marks it, and joiners then wait up to `PRETRAIN_WAIT_S` instead.
    """
    if name not in {s.study_name for s in handle.storage.get_all_studies()}:
        load(name, handle)  # raises the StudyError that lists the studies there
    study = optuna.load_study(study_name=name, storage=handle.storage)
    start = time.monotonic()
    while not is_set_up(study):
        limit = groups.PRETRAIN_WAIT_S if study.user_attrs.get(groups.PRETRAINING_ATTR) else SETUP_WAIT_S
        if time.monotonic() - start > limit:
            raise StudyError(f"study {name!r} in {handle.redacted} was never fully set up (the driver that "
                             f"created it stopped during set-up); pick another --study name, or delete it with "
                             f"`optuna delete-study --study-name {name} --storage URL`")
        time.sleep(0.25)
    return load(name, handle)


def resume(name: str, *, trials: int | None = None, storage: str | None = None, space_text: str | None = None,
           allow_space_change: bool = False, data: str | None = None, launch: Launch | None = None,
           repeats: int | None = None, init_from: str | None = None,
           tokenizer: str | None = None) -> optuna.Study:
    """Continue a study from the database alone: recover orphans, then run to the target total.

    `repeats`, when given, must equal the study's stored seeds per trial: a mean over another number
    of seeds would not rank against the trials already run. A study whose trials start from a
    trained model reloads it from its recorded directory, or from `init_from` (same weights required).
    The study's stored tokenizer is loaded, not retrained; a `tokenizer` given here must produce that
    very tokenizer (same fingerprint), or the resume is refused. Nothing is written, and Ray is not
    started, for a study that is not there."""
    check_resume_arguments(name, space_text=space_text, allow_space_change=allow_space_change, data=data,
                           init_from=init_from, tokenizer=tokenizer)
    launch = check_launch(trials, launch or Launch(), storage, repeats)
    load(name, open_storage(storage, read_only=True))  # it exists: a missing SQLite file is not created
    return resume_checked(name, trials=trials, storage=storage, space_text=space_text,
                          allow_space_change=allow_space_change, data=data, launch=launch, repeats=repeats,
                          init_from=init_from, tokenizer=tokenizer)


def resume_checked(name: str, *, storage: str | None, launch: Launch, **options: Any) -> optuna.Study:
    """`resume` with its launch already checked (`check_launch`: the CLI does it before Ray starts)."""
    handle = open_storage(storage)
    existing = _await_setup(name, handle)
    return _continue(handle, existing, read_record(existing), launch=launch, **options)


def _continue(handle: StorageHandle, existing: optuna.Study, record: StudyRecord, **options: Any) -> optuna.Study:
    """A resume or a join: the plan rebuilt from the study's record, orphans recovered, then run."""
    name = existing.study_name
    plan = plan_resume(name, record, storage=handle.url, **options)
    sampler = make_sampler(plan.sampler, plan.seed, len(plan.space.objectives))
    study = optuna.load_study(study_name=name, storage=handle.storage, sampler=sampler)
    if handle.is_sqlite and (others := faults.live_drivers(study)):
        drv = others[0]
        raise StudyError(f"study {name!r} is being run by another driver ({drv.get('host')}, pid {drv.get('pid')}); "
                         f"SQLite allows one driver per study: use a PostgreSQL --storage to run several")
    cpus = _prove_ray(plan)  # before the first write
    target = record.target_trials
    if plan.trials is not None and plan.trials != target:
        study.set_user_attr(StudyAttr.TARGET, plan.trials)
        log.warning("study %s: trial target set to %d (was %d)", name, plan.trials, target)
        target = plan.trials
    recovered = faults.recover_orphans(study, wait_unclaimed_s=faults.GRACE_S + 2 * faults.HEARTBEAT_S)
    if recovered:
        log.warning("re-enqueued orphaned trials %s", recovered)
    _run(study, handle, plan, record, target, cpus)
    return study


def _run(study: optuna.Study, handle: StorageHandle, plan: SearchPlan, record: StudyRecord, target: int,
         cpus: float) -> None:
    corpus, launch, recipe = plan.corpus, plan.launch, plan.recipe
    bundled_chars = corpus.source.startswith("bundled") and corpus.tokenizer.name == "char"
    # embedded Ray: ship the tensors through the object store
    worker = WorkerSpec.of(corpus, plan.space.reference_chassis, plan.repeats, plan.init_from,
                           embed=launch.ray_address is None and not bundled_chars)
    if plan.locate_lr:
        worker = dataclasses.replace(worker, locate_lr=True)
    searcher = NpasSearcher(study, plan.space, dict(record.recipe), corpus.fingerprint, target,
                            on_progress=launch.on_progress, on_trial_done=launch.on_trial_done,
                            tokens_per_byte=eval_tokens_per_byte(corpus, recipe))
    ladder = None
    if plan.fidelity == "ladder":  # a wsd recipe: trials climb the rungs, paused and resumed (ladder_run)
        names = list(plan.space.objectives)
        ladder = SearchLadder(plan.rungs, names, launch.workers, target=target)  # target: the rungs' caps
        ladder.ladder = rebuild(study, plan.rungs, names, ladder.ladder.eta, target)  # earlier drivers' rungs
        ladder.exchange = RungExchange(study, searcher.live_trial, searcher.own_numbers,  # and the others', live
                                       [names.index(o) for o in ranked_objectives(names)])
        ladder.on_paused = searcher.set_paused
        searcher.ladder_objectives = names
    with faults.Heartbeat(study, searcher.live_trial_ids):
        finished = run_trials(searcher, study_name=study.study_name, recipe_steps=recipe.steps,
                              eval_every=recipe.eval_every, worker=worker, workers=launch.workers,
                              cpus_per_trial=cpus, gpus_per_trial=launch.gpus_per_trial,
                              early_stop=plan.early_stop, max_retries=launch.max_retries, ladder=ladder,
                              checkpoint_storage=launch.checkpoint_storage)
    if not finished:
        numbers = searcher.abandon_live("interrupted", "interrupted: the driver was stopped (SIGINT/SIGTERM)")
        raise Interrupted(f"search interrupted; {len(numbers)} running trial(s) recorded and re-enqueued; "
                          f"continue with `npas resume {study.study_name} --storage {handle.redacted}`")
    if searcher.error:
        raise StudyError(searcher.error)
