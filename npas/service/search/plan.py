"""`SearchPlan`: one search request, built and checked once, then passed whole.

`npas search` and `npas.search` both turn their arguments into a plan with `plan_search`, which runs
every check of the user's input exactly once, before the database is touched or Ray is started, and
holds every default (`DEFAULT_TRIALS`, `DEFAULT_SAMPLER`, ...). A plan is then run by
`npas.service.search.driver.search(plan)`: start or join Ray, create or join the study, run the trials. A
resume, and a driver joining an existing study, build the same plan from the study's record
(`plan_resume`), so every driver runs one kind of object and no layer re-checks or re-spells it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from npas.allocation.bounds import check_reachable
from npas.allocation.space import Space
from npas.allocation.space_parser import parse_space
from npas.conversion.init_from import check_same_source, describe_source, source_chassis, source_tokenizer
from npas.errors import SpaceError, StudyError
from npas.service.execution import session
from npas.service.execution.outcome import check_repeats
from npas.service.search.launch import Launch, check_inputs
from npas.service.search.learned import attach
from npas.service.search.plan_checks import check_plan_search_arguments, locate_lr_problem
from npas.service.study.names import study_name_problem
from npas.training.corpora import DEFAULT_GLOB, DEFAULT_TEXT_FIELD, check_source
from npas.training.data import Corpus, is_bundled, load_corpus
from npas.training.init_source import InitSource
from npas.training.recipe import Recipe, load_recipe
from npas.training.tokenizers import tokenizer_from_json

if TYPE_CHECKING:
    from npas.service.study.record import StudyRecord

DEFAULT_TRIALS = 20  # a new study's target when `trials` is not given
DEFAULT_SAMPLER, DEFAULT_SEED, DEFAULT_REPEATS = "tpe", 0, 1
DEFAULT_TOKENIZER = "char"
Fidelity = Literal["ladder", "asha", "none"]


@dataclass(frozen=True)
class SearchPlan:
    """Everything a driver needs to create, join or continue one study, checked.

    `space` is bound to the corpus's vocabulary and the budget; `corpus` is loaded with the study's
    tokenizer; `init_from` is the starting model (`--init-from`, read and fingerprinted once).
    `given` holds the settings the user named explicitly, which a join compares with the study's.
    `trials=None` means: the default for a new study, the stored target when joining."""

    space: Space
    recipe: Recipe
    corpus: Corpus
    study_name: str
    launch: Launch = field(default_factory=Launch)
    storage: str | None = None
    trials: int | None = None
    sampler: str = DEFAULT_SAMPLER
    seed: int = DEFAULT_SEED
    repeats: int = DEFAULT_REPEATS
    tokenizer: str = DEFAULT_TOKENIZER
    init_from: InitSource | None = None
    data: str | None = None  # the --data given (a join or resume reads the study's corpus from it)
    locate_lr: bool = False  # --locate-lr: each trial's rate chosen at the ladder's rung at T/4 (located_rate)
    given: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    # set by `plan_search` once its checks ran; a plan built by hand or altered with `dataclasses.replace`
    # (which resets a field outside __init__) is checked again by `search` (`plan_checks.check_plan`)
    checked: bool = field(default=False, init=False, repr=False, compare=False)

    @property
    def cpus_per_trial(self) -> float:
        """CPUs each trial asks Ray for: the recipe's torch threads."""
        return float(max(1, self.recipe.threads or 1))

    @property
    def early_stop(self) -> bool:
        return True if self.launch.early_stop is None else self.launch.early_stop

    @property
    def fidelity(self) -> Fidelity:
        """The search's multi-fidelity mechanism, the one field the runner reads: ``"ladder"`` (a
        ``wsd`` recipe: trials pause at the recipe's rungs and the promoted resume from their
        checkpoint, ``npas.service.search.ladder_scheduler``), ``"asha"`` (a ``cosine`` recipe cannot
        fork, so it keeps ASHA on its evaluations, as before the ladder) or ``"none"``
        (``--no-early-stop``: every trial trains to the recipe's steps)."""
        if not self.early_stop:
            return "none"
        return "ladder" if self.recipe.schedule == "wsd" else "asha"

    @property
    def rungs(self) -> tuple[int, ...]:
        """The ladder's rungs (``Recipe.fork_rungs``); empty unless ``fidelity == "ladder"``."""
        return self.recipe.fork_rungs() if self.fidelity == "ladder" else ()

    @property
    def target(self) -> int:
        return DEFAULT_TRIALS if self.trials is None else self.trials


def default_study_name(space_name: str) -> str:
    return f"{space_name}-{time.strftime('%Y%m%d-%H%M%S')}"


def _check_default_study_name(space_name: str) -> None:
    problem = study_name_problem(space_name) or study_name_problem(f"{space_name}-20000101-000000")
    if problem:
        problem = problem.replace("study name", "the space name", 1)
        raise StudyError(f"the default study name is the space's name and a time, but {problem}; pass --study "
                         "NAME or rename the space")


def check_launch(trials: int | None, launch: Launch, storage: str | None, repeats: int | None = None) -> Launch:
    """The counts, the storage URL and a cluster's address: nothing is started or written."""
    launch = check_inputs(trials, launch, storage)
    check_repeats(repeats)
    if launch.ray_address:
        session.check_address_reachable(launch.ray_address)
    return launch


def plan_search(space: Space, *, trials: int | None = None, study: str | None = None, storage: str | None = None,
                recipe: str | None = None, data: str | None = None, budget: str | None = None,
                sampler: str | None = None, seed: int | None = None, launch: Launch | None = None,
                repeats: int | None = None, init_from: str | None = None, tokenizer: str | None = None,
                data_glob: str | None = None, text_field: str | None = None, budget_scope: str | None = None,
                corpus: Corpus | None = None, locate_lr: bool | None = None) -> SearchPlan:
    """The checked plan of a new (or joined) study on `space`; each check runs here, once.

    Options left as None take the study's stored value when joining, and the defaults above when
    creating. `recipe` is a name, a YAML path or a `Recipe`; `corpus` is that corpus already loaded
    with these settings, if the caller has it. Every argument's type is checked first (`plan_checks`)."""
    check_plan_search_arguments(space, {  # the Python API's types, as the CLI's parser gives them
        "study": study, "recipe": recipe, "data": data, "budget": budget, "sampler": sampler, "seed": seed,
        "init_from": init_from, "tokenizer": tokenizer, "data_glob": data_glob, "text_field": text_field,
        "budget_scope": budget_scope, "corpus": corpus, "locate_lr": locate_lr})
    if study is None:  # the default name is SPACE-YYYYmmdd-HHMMSS: the space's name must make a safe one
        _check_default_study_name(space.name)
    elif problem := study_name_problem(study):  # it names folders: before Ray or the database
        raise StudyError(f"{problem}; pass another study name")
    launch = check_launch(trials, launch or Launch(), storage, repeats)
    rec = recipe if isinstance(recipe, Recipe) else load_recipe(recipe or space.recipe)
    if locate_lr and (problem := locate_lr_problem(rec, launch.early_stop)):
        raise StudyError(problem)
    glob, text = data_glob or DEFAULT_GLOB, text_field or DEFAULT_TEXT_FIELD
    source = data or rec.data
    if corpus is None and not is_bundled(source):
        check_source(source, glob, text)  # the cheap checks first: path, glob, field
    if init_from is not None:  # the study reads text as the starting model does: with its tokenizer.json
        tokenizer = source_tokenizer(init_from, tokenizer)
        if (pinned := source_chassis(init_from)) is not None:  # a Hugging Face checkpoint: its chassis is the search's
            space = space.bind(chassis=pinned)
    if corpus is None:
        corpus = load_corpus(source, val_fraction=rec.val_fraction, test_fraction=rec.test_fraction,
                             tokenizer=tokenizer, glob=glob, text_field=text)
    context = space.reference_chassis.context
    if rec.seq_len > context:  # first: it is cheap, and bounds the corpus check below
        raise SpaceError(space.source, [f"recipe {rec.name!r} trains at seq_len={rec.seq_len} > chassis.context "
                                        f"{context}; lower seq_len or raise chassis.context"])
    corpus.check_fits(rec.seq_len, rec.batch_size)
    space = space.bind(vocab_size=corpus.vocab_size, budget=budget, budget_scope=budget_scope)
    check_reachable(space, DEFAULT_SEED if seed is None else seed)  # a budget nothing fits: refused before any write
    source = None
    if init_from is not None:  # the starting model must fit the space and corpus
        source = describe_source(init_from, space.reference_chassis, corpus)
    given = {"recipe": rec.to_dict() if recipe else None, "sampler": sampler, "seed": seed, "repeats": repeats,
             "tokenizer": corpus.tokenizer.fingerprint if tokenizer else None, "locate_lr": locate_lr}
    plan = SearchPlan(space=space, recipe=rec, corpus=corpus, study_name=study or default_study_name(space.name),
                      launch=launch, storage=storage, trials=trials, sampler=sampler or DEFAULT_SAMPLER,
                      seed=DEFAULT_SEED if seed is None else seed,
                      repeats=DEFAULT_REPEATS if repeats is None else repeats,
                      tokenizer=str(tokenizer or DEFAULT_TOKENIZER), init_from=source, data=data,
                      given=MappingProxyType(given), locate_lr=bool(locate_lr))
    object.__setattr__(plan, "checked", True)  # frozen: only plan_search marks a plan as checked
    return plan


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


def plan_resume(name: str, record: StudyRecord, *, trials: int | None = None, storage: str | None = None,
                space_text: str | None = None, allow_space_change: bool = False, data: str | None = None,
                launch: Launch, repeats: int | None = None, init_from: str | InitSource | None = None,
                tokenizer: str | None = None) -> SearchPlan:
    """The plan of a study that continues (`npas resume`, or a driver joining it), built from its
    record: its space, recipe, sampler, seed, seeds per trial and early stopping as created, its
    stored tokenizer loaded (never retrained), and its corpus and starting model proven the same.
    `launch` was checked by `check_launch`. `init_from`: a directory (`npas resume --init-from`), or the
    `InitSource` a joining driver's plan already read (not read again)."""
    space = check_space_change(name, record, space_text, allow_space_change) or \
        parse_space(record.space_text, record.space_source or name)
    space = space.rebind(record.overrides)  # vocabulary, budget and a starting checkpoint's chassis
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
        logging.getLogger("npas.service.search.driver").warning(
            "study %s predates the text-level train/validation/test split: new trials are ranked on "
            "other validation text than its old ones", name)
    stored_init, init = record.init_from, None
    if stored_init is not None or init_from is not None:
        given_init = init_from if isinstance(init_from, InitSource) else \
            describe_source(init_from or stored_init.dir, space.reference_chassis, corpus)
        check_same_source(name, stored_init, given_init)
        init = stored_init.moved_to(given_init.dir)
    # the stored launch setting wins over "the study's" (None)
    launch = launch if launch.early_stop is not None else _with_early_stop(launch, record.early_stop)
    return SearchPlan(space=space, recipe=rec, corpus=corpus, study_name=name, launch=launch, storage=storage,
                      trials=trials, sampler=record.sampler, seed=record.seed, repeats=record.repeats,
                      tokenizer=str(record.tokenizer), init_from=init,
                      data=data, locate_lr=record.locate_lr)


def _with_early_stop(launch: Launch, early_stop: bool) -> Launch:
    return dataclasses.replace(launch, early_stop=early_stop)
