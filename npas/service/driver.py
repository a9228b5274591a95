"""`npas.search` and `npas.resume`: launch, join or continue a study, the Python API behind the CLI.

Everything a resume needs is written into the study when it is created (its `StudyRecord`), so
`resume(name)` needs nothing but the name and the storage URL. The record is the truth for every
later driver: a joiner (`search --study NAME` on an existing study) or a resume either matches the
stored recipe, sampler, seed and early stopping or is refused with the reason; the trial target is
study-wide and changes only when `trials` is given, which is logged. Ray is started (and a cluster's
address and authentication proven) before anything is written, so a driver that cannot run leaves
the database as it found it. A space with learned sharing groups gets its layer similarity once, from
the creating driver (`npas.service.learned`), and every later driver reads it from the record.
"""

from __future__ import annotations

import json
import logging
import time

import optuna

from npas import __version__
from npas.allocation.space import Space
from npas.allocation.space_parser import parse_space
from npas.errors import Interrupted, StudyError
from npas.service import faults
from npas.service.launch import Launch, check_inputs
from npas.service.names import study_name_problem
from npas.service.outcome import check_repeats
from npas.service.record import StudyAttr, StudyRecord, TrialAttr
from npas.service.runner import check_address_reachable, check_resources, init_ray, run_trials
from npas.service.samplers import enqueue_baselines, make_sampler
from npas.service.searcher import NpasSearcher
from npas.service.storage import StorageHandle, open_storage
from npas.service.study import is_set_up, load, mark_ready, read_record, write_record

log = logging.getLogger(__name__)

SETUP_WAIT_S = 60.0  # how long a joining driver waits for the creator to finish writing the study's record
DEFAULT_TRIALS = 20  # a new study's target when `trials` is not given
DEFAULT_SAMPLER, DEFAULT_SEED = "tpe", 0


def search(space: Space, *, trials: int | None = None, study: str | None = None, storage: str | None = None,
           recipe: str | None = None, data: str | None = None, budget: str | None = None,
           sampler: str | None = None, seed: int | None = None, launch: Launch | None = None,
           repeats: int | None = None, init_from: str | None = None, tokenizer: str | None = None,
           data_glob: str | None = None, text_field: str | None = None, budget_scope: str | None = None,
           corpus=None) -> optuna.Study:
    """Create a study for `space` and run it to `trials` proxy runs, or join the study named `study`.

    Options left as None take the study's stored value when joining, and the defaults when creating.
    `repeats` trains every trial on that many seeds and ranks it by their mean (default 1).
    `init_from`: a `npas train` directory every trial is converted from before its proxy run.
    `tokenizer` is char (default), bpe:N (trained on the training split) or a tokenizer.json path
    (with `init_from`: default the model's own tokenizer.json, and no other is accepted);
    the tokenizer made here is stored in the study, and every later driver and worker loads it.
    `corpus` is that corpus already loaded with these settings (the CLI's preflight has it)."""
    from npas.training.corpora import DEFAULT_GLOB, DEFAULT_TEXT_FIELD
    from npas.training.data import load_corpus
    from npas.training.recipe import load_recipe

    launch = check_inputs(trials, launch or Launch(), storage)
    check_repeats(repeats)
    if launch.ray_address:
        check_address_reachable(launch.ray_address)
    if init_from is not None:  # the study reads text as the starting model does: with its tokenizer.json
        from npas.conversion.init_from import source_tokenizer

        tokenizer = source_tokenizer(init_from, tokenizer)
    rec = load_recipe(recipe or space.recipe)
    glob, field = data_glob or DEFAULT_GLOB, text_field or DEFAULT_TEXT_FIELD
    if corpus is None:
        corpus = load_corpus(data or rec.data, val_fraction=rec.val_fraction, test_fraction=rec.test_fraction,
                             tokenizer=tokenizer, glob=glob, text_field=field)
    corpus.check_fits(rec.seq_len, rec.batch_size)
    space = space.bind(vocab_size=corpus.vocab_size, budget=budget, budget_scope=budget_scope)
    if rec.seq_len > space.reference_chassis.context:
        raise StudyError(f"recipe {rec.name!r} trains at seq_len={rec.seq_len} > the chassis context "
                         f"{space.reference_chassis.context}; lower seq_len or raise chassis.context")
    init = _init_source(init_from, space, corpus)
    sampler_name = sampler or DEFAULT_SAMPLER
    chosen = make_sampler(sampler_name, DEFAULT_SEED if seed is None else seed, len(space.objectives))
    name = study or f"{space.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    if problem := study_name_problem(name):  # it names folders: before Ray or the database
        raise StudyError(f"{problem}; pass another study name")
    cpus = _prove_ray(launch, rec.threads)  # before the first write
    handle = open_storage(storage)
    try:
        created = optuna.create_study(study_name=name, storage=handle.storage,
                                      directions=["minimize"] * len(space.objectives), sampler=chosen)
    except optuna.exceptions.DuplicatedStudyError:
        given = {"recipe": rec.to_dict() if recipe else None, "sampler": sampler, "seed": seed, "repeats": repeats,
                 "tokenizer": corpus.tokenizer.fingerprint if tokenizer else None}
        return _join(name, handle, space, trials, data, launch, given, init)
    learned = _learn_groups(created, handle, space, init, rec, corpus) if space.learns_groups else None
    if learned is not None:
        space = space.with_similarity(learned["similarity"])
    record = StudyRecord(
        version=__version__, space_text=space.text, space_hash=space.hash, space_name=space.name,
        space_source=space.source, budget_params=space.budget_params, budget_spec=space.budget_spec,
        reference_params=space.reference_params, recipe=rec.to_dict(),
        data_source=None if corpus.source.startswith("bundled") else corpus.source,
        data_fingerprint=corpus.fingerprint, vocab_size=corpus.vocab_size, objectives=tuple(space.objectives),
        sampler=sampler_name, seed=DEFAULT_SEED if seed is None else seed,
        early_stop=True if launch.early_stop is None else launch.early_stop,
        target_trials=DEFAULT_TRIALS if trials is None else trials, overrides=dict(space.overrides),
        data_split=corpus.describe()["split"], repeats=1 if repeats is None else repeats,
        tokenizer=str(tokenizer or "char"), tokenizer_json=corpus.tokenizer.to_json(),
        tokenizer_fingerprint=corpus.tokenizer.fingerprint, data_glob=glob, text_field=field, init_from=init,
        learned=learned)
    created.set_metric_names(list(space.objectives))
    write_record(created, record)
    enqueue_baselines(created, space, TrialAttr.BASELINE)  # with knob values as params, so samplers model them
    mark_ready(created)  # last: a driver joining by name waits for this
    _run(created, handle, space, record, corpus, record.target_trials, launch, cpus, init)
    return created


def _init_source(init_from: str | None, space: Space, corpus) -> dict | None:
    """The starting model's record (checked against the space and corpus), before anything is written."""
    if init_from is None:
        return None
    from npas.conversion.init_from import describe_source

    return describe_source(init_from, space.reference_chassis, corpus)


def _learn_groups(study: optuna.Study, handle: StorageHandle, space: Space, init: dict | None, rec,
                  corpus) -> dict:
    """The creator's one look at trained weights for the learned groups (npas.service.learned).

    Runs after the study name is claimed, so a joiner never pretrains too: it waits on the
    pretraining marker. A failure deletes the half-made study, leaving the database as it was."""
    from npas.service.learned import PRETRAINING_ATTR, learn_source, source_dir

    try:
        if init is None:
            study.set_user_attr(PRETRAINING_ATTR, True)
        return learn_source(space, init, rec, corpus, source_dir(study.study_name, handle.sqlite_path))
    except BaseException:
        optuna.delete_study(study_name=study.study_name, storage=handle.storage)
        raise


def _prove_ray(launch: Launch, threads: int | None) -> float:
    """Start or join Ray and check the resources a trial needs; returns the CPUs per trial."""
    init_ray(launch.ray_address, num_cpus=None)
    cpus = float(max(1, threads or 1))
    check_resources(launch.workers, cpus, launch.gpus_per_trial)
    return cpus


def _join(name: str, handle: StorageHandle, space: Space, trials: int | None, data: str | None, launch: Launch,
          given: dict, init: dict | None = None) -> optuna.Study:
    """`npas search --study S` on an existing study: another driver joins it (PostgreSQL), or a
    stopped one continues (SQLite), provided the space, its launch overrides and the settings match."""
    existing = _await_setup(name, handle)
    record = read_record(existing)
    if record.space_hash != space.hash:
        raise StudyError(f"study {name!r} already exists in {handle.redacted} with a different space, budget or "
                         f"data; pick another --study name, or `npas resume {name}` to continue it as it was")
    stored = {"recipe": _plain(record.recipe), "sampler": record.sampler, "seed": record.seed,
              "repeats": record.repeats, "tokenizer": record.tokenizer_fingerprint}
    mismatch = [f"--{k} {_show(v)} (the study's is {_show(stored[k])})" for k, v in given.items()
                if v is not None and _plain(v) != stored[k]]
    if mismatch:
        raise StudyError(f"study {name!r} was created with other settings: {'; '.join(mismatch)}; drop the "
                         f"option to use the study's, or pick another --study name")
    from npas.conversion.init_from import check_same_source

    check_same_source(name, record.init_from, init)
    return resume(name, trials=trials, storage=handle.url, data=data, launch=launch,
                  init_from=init["dir"] if init else None)


def _plain(value: object) -> object:
    """As stored: JSON turns tuples into lists."""
    return json.loads(json.dumps(value))


def _show(value: object) -> str:
    return repr(value["name"]) if isinstance(value, dict) and "name" in value else repr(value)


def _await_setup(name: str, handle: StorageHandle) -> optuna.Study:
    """Wait for a study's creator to finish writing its record and baselines.

    Optuna writes study attributes one at a time, so two drivers started together on one
    PostgreSQL study can see it half-written; the joiner polls for the ready marker rather than
    misreading a partial record as a different space. A creator that pretrains the model of its
    learned groups marks it, and joiners then wait up to `PRETRAIN_WAIT_S` instead.
    """
    from npas.service.learned import PRETRAIN_WAIT_S, PRETRAINING_ATTR

    if name not in {s.study_name for s in handle.storage.get_all_studies()}:
        load(name, handle)  # raises the StudyError that lists the studies there
    study = optuna.load_study(study_name=name, storage=handle.storage)
    start = time.monotonic()
    while not is_set_up(study):
        limit = PRETRAIN_WAIT_S if study.user_attrs.get(PRETRAINING_ATTR) else SETUP_WAIT_S
        if time.monotonic() - start > limit:
            raise StudyError(f"study {name!r} in {handle.redacted} was never fully set up (the driver that "
                             f"created it stopped during set-up); pick another --study name, or delete it with "
                             f"`optuna delete-study --study-name {name} --storage URL`")
        time.sleep(0.25)
    return load(name, handle)


def check_space_change(name: str, record: StudyRecord, space_text: str | None,
                       allow_space_change: bool) -> Space | None:
    """The space a resume continues with when `space_text` replaces the study's (None: keep the
    study's), or the reason it cannot. A changed space needs `allow_space_change`, and even then its
    objectives must be the study's, in order: they are part of the study's identity (Optuna stores
    each trial's values by position, so other objectives would file new results under the old
    names, and another count fails every new trial)."""
    if space_text is None:
        return None
    if space_text != record.space_text and not allow_space_change:
        raise StudyError(f"the space file differs from the one study {name!r} was created with; "
                         f"resume without it, or pass --allow-space-change to use the new one")
    if not allow_space_change:
        return None
    space = parse_space(space_text, record.space_source or name)
    if tuple(space.objectives) != tuple(record.objectives):
        raise StudyError(f"--space optimises {list(space.objectives)} but study {name!r} optimises "
                         f"{list(record.objectives)}; objectives are part of a study's identity, even with "
                         f"--allow-space-change: keep them, or start a new study with `npas search`")
    return space


def resume(name: str, *, trials: int | None = None, storage: str | None = None, space_text: str | None = None,
           allow_space_change: bool = False, data: str | None = None, launch: Launch | None = None,
           repeats: int | None = None, init_from: str | None = None,
           tokenizer: str | None = None) -> optuna.Study:
    """Continue a study from the database alone: recover orphans, then run to the target total.

    `repeats`, when given, must equal the study's stored seeds per trial: a mean over another number
    of seeds would not rank against the trials already run. A study whose trials start from a
    trained model reloads it from its recorded directory, or from `init_from` (same weights required).
    The study's stored tokenizer is loaded, not retrained; a `tokenizer` given here must produce that
    very tokenizer (same fingerprint), or the resume is refused."""
    from npas.training.data import load_corpus
    from npas.training.recipe import Recipe
    from npas.training.tokenizers import tokenizer_from_json

    launch = check_inputs(trials, launch or Launch(), storage)
    check_repeats(repeats)
    if launch.ray_address:
        check_address_reachable(launch.ray_address)
    handle = open_storage(storage)
    existing = _await_setup(name, handle)
    record = read_record(existing)
    space = check_space_change(name, record, space_text, allow_space_change) or \
        parse_space(record.space_text, record.space_source or name)
    space = space.bind(vocab_size=record.overrides.get("vocab_size"), budget=record.overrides.get("budget"),
                       budget_scope=record.overrides.get("budget_scope"))
    from npas.service.learned import attach

    space = attach(space, record.learned, name)  # the recorded similarity: the same groups as at creation
    if launch.early_stop is not None and launch.early_stop != record.early_stop:
        flag = "--no-early-stop" if record.early_stop is False else "early stopping (ASHA)"
        raise StudyError(f"study {name!r} runs with {flag}; continue it as it was created (drop "
                         f"{'--no-early-stop' if not launch.early_stop else 'the option'}), or start a new study")
    if repeats is not None and repeats != record.repeats:
        raise StudyError(f"study {name!r} trains each trial on {record.repeats} seed(s) (--repeats {record.repeats}), "
                         f"not {repeats}; drop --repeats to continue it as it was created, or start a new study")
    rec = Recipe.from_dict(dict(record.recipe))
    stored_tok = None if record.tokenizer_json is None else tokenizer_from_json(record.tokenizer_json, "the study's")
    corpus = load_corpus(data or record.data_source, val_fraction=rec.val_fraction, test_fraction=rec.test_fraction,
                         tokenizer=tokenizer or stored_tok, glob=record.data_glob, text_field=record.text_field)
    if record.tokenizer_fingerprint is not None and corpus.tokenizer.fingerprint != record.tokenizer_fingerprint:
        raise StudyError(f"tokenizer {tokenizer} differs from the one study {name!r} was started with "
                         f"({record.tokenizer}, fingerprint {corpus.tokenizer.fingerprint} != "
                         f"{record.tokenizer_fingerprint}); resume without --tokenizer to use the study's")
    if corpus.fingerprint != record.data_fingerprint:
        raise StudyError(f"the data differs from the corpus study {name!r} ran on (fingerprint "
                         f"{corpus.fingerprint} != {record.data_fingerprint}); pass --data with the original corpus")
    split = corpus.describe()["split"]
    if record.data_split is not None and dict(record.data_split) != split:
        raise StudyError(f"study {name!r} split its text into train / validation / test differently (chunk "
                         f"{record.data_split.get('chunk_chars')} vs {split['chunk_chars']} characters, or other "
                         f"fractions); its trials were ranked on other validation text, so start a new study")
    if record.data_split is None:
        log.warning("study %s predates the text-level train/validation/test split: new trials are ranked on "
                    "other validation text than its old ones", name)
    stored_init = record.init_from
    init = None
    if stored_init is not None or init_from is not None:
        from npas.conversion.init_from import check_same_source

        init = _init_source(init_from or stored_init["dir"], space, corpus)
        check_same_source(name, stored_init, init)
        init = dict(stored_init, dir=init["dir"])
    sampler = make_sampler(record.sampler, record.seed, len(space.objectives))
    study = optuna.load_study(study_name=name, storage=handle.storage, sampler=sampler)
    if handle.is_sqlite and (others := faults.live_drivers(study)):
        drv = others[0]
        raise StudyError(f"study {name!r} is being run by another driver ({drv.get('host')}, pid {drv.get('pid')}); "
                         f"SQLite allows one driver per study: use a PostgreSQL --storage to run several")
    cpus = _prove_ray(launch, rec.threads)  # before the first write
    target = record.target_trials
    if trials is not None and trials != target:
        study.set_user_attr(StudyAttr.TARGET, trials)
        log.warning("study %s: trial target set to %d (was %d)", name, trials, target)
        target = trials
    recovered = faults.recover_orphans(study, wait_unclaimed_s=faults.GRACE_S + 2 * faults.HEARTBEAT_S)
    if recovered:
        log.warning("re-enqueued orphaned trials %s", recovered)
    _run(study, handle, space, record, corpus, target, launch, cpus, init)
    return study


def _run(study: optuna.Study, handle: StorageHandle, space: Space, record: StudyRecord, corpus, target: int,
         launch: Launch, cpus: float, init: dict | None = None) -> None:
    from npas.training.proxy import eval_tokens_per_byte
    from npas.training.recipe import Recipe

    recipe = dict(record.recipe)
    bundled_chars = corpus.source.startswith("bundled") and corpus.tokenizer.name == "char"
    payload = {"source": None if corpus.source.startswith("bundled") else corpus.source,
               "fingerprint": corpus.fingerprint,
               # workers load the study's tokenizer from this JSON (never retrain) and refuse another
               "tokenizer_json": corpus.tokenizer.to_json(), "tokenizer_fingerprint": corpus.tokenizer.fingerprint,
               "glob": corpus.glob, "text_field": corpus.text_field,
               # the chassis whose untied model the recipe's base lr is for: the fair parameterization
               # scales every candidate's per-group rates against it (training/parameterization.py)
               "reference": space.reference_chassis.to_dict(),
               "repeats": record.repeats}  # seeds per trial: the trainable loops over them
    if init is not None:
        payload["init_from"] = init  # each worker converts this model into its trial's allocation
    if launch.ray_address is None and not bundled_chars:
        payload["corpus"] = corpus  # embedded Ray: ship the tensors through the object store
    searcher = NpasSearcher(study, space, recipe, corpus.fingerprint, target, on_progress=launch.on_progress,
                            on_trial_done=launch.on_trial_done,
                            tokens_per_byte=eval_tokens_per_byte(corpus, Recipe.from_dict(recipe)))
    with faults.Heartbeat(study, searcher.live_trial_ids):
        finished = run_trials(searcher, study_name=study.study_name, recipe_steps=int(recipe["steps"]),
                              eval_every=int(recipe["eval_every"]), corpus_payload=payload, workers=launch.workers,
                              cpus_per_trial=cpus, gpus_per_trial=launch.gpus_per_trial,
                              early_stop=record.early_stop, max_retries=launch.max_retries)
    if not finished:
        numbers = searcher.abandon_live("interrupted", "interrupted: the driver was stopped (SIGINT/SIGTERM)")
        raise Interrupted(f"search interrupted; {len(numbers)} running trial(s) recorded and re-enqueued; "
                          f"continue with `npas resume {study.study_name} --storage {handle.redacted}`")
    if searcher.error:
        raise StudyError(searcher.error)
