"""`npas.search` and `npas.resume`: launch or continue a study, the Python API behind the CLI.

Everything a resume needs is written into the study when it is created (space text and hash,
budget, recipe, data fingerprint, objectives, sampler, seed), so `resume(name)` needs nothing but
the name and the storage URL. Orphaned trials of a dead driver are failed and re-enqueued with
their exact parameters before any new trial is asked.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

import optuna
from optuna.trial import TrialState

from npas import __version__
from npas.allocation.space import Space, parse_space
from npas.errors import StudyError
from npas.service import study as S
from npas.service.runner import check_address_reachable, check_resources, init_ray, run_trials
from npas.service.samplers import enqueue_baselines, make_sampler
from npas.service.searcher import NpasSearcher, Progress, requeue
from npas.service.storage import GRACE_S, is_sqlite, open_storage, redact, resolve_url

log = logging.getLogger(__name__)

SETUP_WAIT_S = 60.0  # how long a joining driver waits for the creator to finish writing the study's record


class Interrupted(StudyError):
    """The search was stopped by SIGINT/SIGTERM; running trials were recorded and re-enqueued."""

    exit_code = 130  # the shell's convention for a run stopped by Ctrl-C


@dataclass(frozen=True)
class Launch:
    """How and where to run (Ray Tune's RunConfig concerns), apart from what to search."""

    ray_address: str | None = None
    workers: int = 2
    gpus_per_trial: float = 0.0
    early_stop: bool = True
    max_retries: int = 2
    on_progress: Callable[[Progress], None] | None = None
    on_trial_done: Callable[[optuna.Study], None] | None = None  # e.g. refresh the HTML report


def _stale_ids(study: optuna.Study) -> set[int]:
    """Trial ids whose heartbeat is older than the grace period (Optuna's own check on its table)."""
    storage = study._storage
    check = getattr(storage, "_get_stale_trial_ids", None)  # RDBStorage; the public wrapper fails them too early
    return set(check(study._study_id)) if check is not None else set()


def recover_orphans(study: optuna.Study) -> list[int]:
    """Fail + re-enqueue RUNNING trials whose driver is dead: at once if it ran on this host and its
    process is gone, else once its heartbeat is older than the grace period.

    The status is written while the trial is still RUNNING (a finished trial cannot be updated),
    then the state flips to FAIL; a trial some other process finished first is left alone.
    """
    here = socket.gethostname()
    storage = study._storage
    stale = _stale_ids(study)
    recovered = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        drv = t.user_attrs.get(S.T_DRIVER) or {}
        local_dead = drv.get("host") == here and drv.get("pid") and not _alive(int(drv["pid"]))
        unclaimed = not drv and t.datetime_start is not None and (
            datetime.datetime.now() - t.datetime_start).total_seconds() > GRACE_S  # asked, never claimed
        if not (local_dead or unclaimed or t._trial_id in stale):
            continue
        try:
            storage.set_trial_user_attr(t._trial_id, S.T_STATUS, "orphaned")
            storage.set_trial_user_attr(t._trial_id, S.T_REASON, "orphaned: its driver stopped while it ran")
            ok = storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            ok = False
        if ok:
            requeue(study, storage.get_trial(t._trial_id))
            recovered.append(t.number)
    return recovered


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def search(space: Space, *, trials: int = 20, study: str | None = None, storage: str | None = None,
           recipe: str | None = None, data: str | None = None, budget: str | None = None,
           sampler: str = "tpe", seed: int = 0, launch: Launch | None = None) -> optuna.Study:
    """Create a study for `space` and run it to `trials` proxy runs. Returns the Optuna study."""
    from npas.training.data import load_corpus
    from npas.training.recipe import load_recipe

    launch = launch or Launch()
    url = resolve_url(storage)
    if launch.ray_address:
        check_address_reachable(launch.ray_address)
    rec = load_recipe(recipe or space.recipe)
    corpus = load_corpus(data or rec.data, val_fraction=rec.val_fraction)
    corpus.check_fits(rec.seq_len, rec.batch_size)
    space = space.bind(vocab_size=corpus.vocab_size, budget=budget)
    if rec.seq_len > space.reference_chassis.context:
        raise StudyError(f"recipe {rec.name!r} trains at seq_len={rec.seq_len} > the chassis context "
                         f"{space.reference_chassis.context}; lower seq_len or raise chassis.context")
    chosen = make_sampler(sampler, seed, len(space.objectives))  # validates the name before any database write
    name = study or f"{space.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    st = open_storage(url)
    try:
        created = optuna.create_study(study_name=name, storage=st, directions=["minimize"] * len(space.objectives),
                                      sampler=chosen)
    except optuna.exceptions.DuplicatedStudyError:
        return _join(name, st, url, space, trials, data, launch)
    created.set_metric_names(list(space.objectives))
    attrs = {
        S.S_VERSION: __version__, S.S_SPACE_TEXT: space.text, S.S_SPACE_HASH: space.hash,
        S.S_SPACE_NAME: space.name, S.S_SPACE_SOURCE: space.source, S.S_BUDGET: space.budget_params,
        S.S_BUDGET_SPEC: space.budget_spec, S.S_REFERENCE: space.reference_params, S.S_RECIPE: rec.to_dict(),
        S.S_DATA: None if corpus.source.startswith("bundled") else corpus.source,
        S.S_FINGERPRINT: corpus.fingerprint, S.S_VOCAB: corpus.vocab_size, S.S_OBJECTIVES: list(space.objectives),
        S.S_SAMPLER: sampler, S.S_SEED: seed, S.S_EARLY_STOP: launch.early_stop, S.S_TARGET: trials,
        "overrides": space.overrides,
    }
    for k, v in attrs.items():
        created.set_user_attr(k, v)
    enqueue_baselines(created, space, S.T_BASELINE)
    created.set_user_attr(S.S_READY, True)  # last: a driver joining by name waits for this
    _run(created, space, rec.to_dict(), corpus, trials, url, launch)
    return created


def _join(name: str, st, url: str, space: Space, trials: int, data: str | None, launch: Launch) -> optuna.Study:
    """`npas search --study S` on an existing study: another driver joins it (PostgreSQL), or a
    stopped one continues (SQLite), provided the space and its launch overrides are unchanged."""
    existing = _await_setup(name, st, url)
    if existing.user_attrs.get(S.S_SPACE_HASH) != space.hash:
        raise StudyError(f"study {name!r} already exists in {redact(url)} with a different space, budget or data; "
                         f"pick another --study name, or `npas resume {name}` to continue it as it was")
    return resume(name, trials=trials, storage=url, data=data, launch=launch)


def _await_setup(name: str, st, url: str) -> optuna.Study:
    """Wait for a study's creator to finish writing its attributes and baselines.

    Optuna writes study attributes one at a time, so two drivers started together on one
    PostgreSQL study can see it half-written; the joiner polls for S_READY rather than
    misreading a partial record as a different space.
    """
    try:
        sid = st.get_study_id_from_name(name)
    except KeyError:
        S.load(name, st, url)  # raises the StudyError that lists the studies there
        raise
    deadline = time.monotonic() + SETUP_WAIT_S
    while not _set_up(st, sid):
        if time.monotonic() > deadline:
            raise StudyError(f"study {name!r} in {redact(url)} was never fully set up (the driver that created it "
                             f"stopped during set-up); pick another --study name, or delete it with "
                             f"`optuna delete-study --study-name {name} --storage URL`")
        time.sleep(0.25)
    return S.load(name, st, url)


def _set_up(st, sid: int) -> bool:
    """Marked ready by its creator, or (a study from before the marker) it has already run trials."""
    if st.get_study_user_attrs(sid).get(S.S_READY):
        return True
    ran = (TrialState.RUNNING, TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)
    return bool(st.get_all_trials(sid, deepcopy=False, states=ran))


def resume(name: str, *, trials: int | None = None, storage: str | None = None, space_text: str | None = None,
           allow_space_change: bool = False, data: str | None = None, launch: Launch | None = None) -> optuna.Study:
    """Continue a study from the database alone: recover orphans, then run to the target total."""
    from npas.training.data import load_corpus
    from npas.training.recipe import Recipe

    launch = launch or Launch()
    url = resolve_url(storage)
    if launch.ray_address:
        check_address_reachable(launch.ray_address)
    st = open_storage(url)
    peek = _await_setup(name, st, url)
    ua = peek.user_attrs
    text = ua[S.S_SPACE_TEXT]
    space = parse_space(text, ua.get(S.S_SPACE_SOURCE, name))
    if space_text is not None and space_text != text and not allow_space_change:
        raise StudyError(f"the space file differs from the one study {name!r} was created with; "
                         f"resume without it, or pass --allow-space-change to use the new one")
    if space_text is not None and allow_space_change:
        space = parse_space(space_text, ua.get(S.S_SPACE_SOURCE, name))
    over = ua.get("overrides", {})
    space = space.bind(vocab_size=over.get("vocab_size"), budget=over.get("budget"))
    rec = Recipe.from_dict(ua[S.S_RECIPE])
    corpus = load_corpus(data or ua.get(S.S_DATA), val_fraction=rec.val_fraction)
    if corpus.fingerprint != ua[S.S_FINGERPRINT]:
        raise StudyError(f"the data differs from the corpus study {name!r} ran on (fingerprint "
                         f"{corpus.fingerprint} != {ua[S.S_FINGERPRINT]}); pass --data with the original corpus")
    sampler = make_sampler(ua.get(S.S_SAMPLER, "tpe"), ua.get(S.S_SEED), len(space.objectives))
    study = optuna.load_study(study_name=name, storage=st, sampler=sampler)
    target = int(trials if trials is not None else ua.get(S.S_TARGET, 20))
    if trials is not None:
        study.set_user_attr(S.S_TARGET, target)
    recovered = recover_orphans(study)
    if recovered:
        log.warning("re-enqueued orphaned trials %s", recovered)
    _run(study, space, rec.to_dict(), corpus, target, url, launch)
    return study


def _run(study: optuna.Study, space: Space, recipe: dict, corpus, target: int, url: str, launch: Launch) -> None:
    others = {(d.get("host"), d.get("pid")) for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
              if (d := t.user_attrs.get(S.T_DRIVER))}
    if others and is_sqlite(url):
        host, pid = sorted(others, key=str)[0]
        raise StudyError(f"study {study.study_name!r} is being run by another driver ({host}, pid {pid}); SQLite "
                         f"allows one driver per study: use a PostgreSQL --storage to run several")
    init_ray(launch.ray_address, num_cpus=None)
    cpus = float(max(1, recipe.get("threads") or 1))
    check_resources(launch.workers, cpus, launch.gpus_per_trial)
    payload = {"source": None if corpus.source.startswith("bundled") else corpus.source,
               "fingerprint": corpus.fingerprint}
    if launch.ray_address is None and payload["source"] is not None:
        payload["corpus"] = corpus  # embedded Ray: ship the tensors through the object store
    searcher = NpasSearcher(study, space, recipe, corpus.fingerprint, target, on_progress=launch.on_progress,
                            on_trial_done=launch.on_trial_done)
    try:
        finished = run_trials(searcher, study_name=study.study_name, recipe_steps=int(recipe["steps"]),
                              eval_every=int(recipe["eval_every"]), corpus_payload=payload, workers=launch.workers,
                              cpus_per_trial=cpus, gpus_per_trial=launch.gpus_per_trial,
                              early_stop=launch.early_stop, max_retries=launch.max_retries)
        if not finished:
            numbers = searcher.abandon_live("interrupted", "interrupted: the driver was stopped (SIGINT/SIGTERM)")
            raise Interrupted(f"search interrupted; {len(numbers)} running trial(s) recorded and re-enqueued; "
                              f"continue with `npas resume {study.study_name} --storage {redact(url)}`")
        if searcher.error:
            raise StudyError(searcher.error)
    finally:
        searcher.close()
