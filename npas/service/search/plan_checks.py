"""The Python API's arguments, checked as the command line's are, and a plan checked again at `search`.

The CLI's parser gives every flag its type before npas runs; `npas.plan_search`, `npas.search` and
`npas.resume` take Python values, so the same mistakes (`trials="3"`, `launch={"workers": 2}`, a
misspelt keyword) used to fail deep inside with a bare TypeError or AttributeError, some after the
study was written. Here each argument is checked by type first (`ArgumentError`: an NpasError in one
line that is also a TypeError), and the values the CLI's parser would refuse (a seed past numpy's
range, an unknown sampler) are refused the same way.

A `SearchPlan` is frozen and built checked by `plan_search`, but a caller may build one by hand or
alter one with `dataclasses.replace`; `check_plan` re-runs the cheap checks (types, counts, names,
storage, the recipe against the space and the corpus) at `search()`'s entry, before Ray or the
database: otherwise `replace(plan, trials=0)` wrote a study that ran nothing.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from typing import Any

from npas.allocation.knobs import closest
from npas.allocation.space import Space
from npas.errors import ArgumentError, StudyError
from npas.service.execution.outcome import check_repeats
from npas.service.search.launch import check_inputs
from npas.service.search.samplers import SAMPLERS
from npas.service.study.names import study_name_problem
from npas.training.data import Corpus
from npas.training.recipe import Recipe
from npas.training.tokenizers import Tokenizer, TokenizerSpec

SEED_MAX = 2**32 - 1  # numpy's RandomState, under Optuna's samplers, takes seeds in [0, 2**32)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _optional(ok: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or ok(v)


def _path(v: Any) -> bool:
    return isinstance(v, str | os.PathLike)


def _recipe(v: Any) -> bool:
    return _path(v) or isinstance(v, Recipe)


def _corpus(v: Any) -> bool:
    return isinstance(v, Corpus)


def _tokenizer(v: Any) -> bool:
    if _path(v):
        return True
    return isinstance(v, Tokenizer | TokenizerSpec)


# plan_search's keyword -> (its test, what it must be); trials, launch, storage and repeats are checked
# with the launch (`launch.check_types`, `outcome.check_repeats`), as `npas.resume` checks them
PLAN_SEARCH_ARGS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "study": (_optional(lambda v: isinstance(v, str)), "a study name string or None"),
    "recipe": (_optional(_recipe), "a recipe name, a YAML path, a Recipe or None"),
    "data": (_optional(_path), "a corpus path or None"),
    "budget": (_optional(lambda v: isinstance(v, str | int | float) and not isinstance(v, bool)),
               "a budget such as '0.25x' or '1.5M', a number, or None"),
    "sampler": (_optional(lambda v: isinstance(v, str)), f"one of {', '.join(SAMPLERS)} or None"),
    "seed": (_optional(_is_int), f"an int from 0 to {SEED_MAX} or None"),
    "init_from": (_optional(_path), "a model directory path or None"),
    "tokenizer": (_optional(_tokenizer), "a tokenizer spec ('char', 'bpe:4096', a tokenizer.json path) or None"),
    "data_glob": (_optional(lambda v: isinstance(v, str)), "a glob string or None"),
    "text_field": (_optional(lambda v: isinstance(v, str)), "a field name string or None"),
    "budget_scope": (_optional(lambda v: isinstance(v, str)), "'all', 'non_embedding' or None"),
    "corpus": (_optional(_corpus), "a Corpus from npas.load_corpus or None"),
    "locate_lr": (_optional(lambda v: isinstance(v, bool)), "True, False or None"),
}
# SearchPlan's field -> (its test, what it must be)
PLAN_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "space": (lambda v: isinstance(v, Space), "a Space"),
    "recipe": (lambda v: _recipe(v) and not _path(v), "a Recipe (npas.load_recipe)"),
    "corpus": (_corpus, "a Corpus (npas.load_corpus)"),
    "study_name": (lambda v: isinstance(v, str), "a study name string"),
    "sampler": (lambda v: isinstance(v, str), f"one of {', '.join(SAMPLERS)}"),
    "seed": (_is_int, f"an int from 0 to {SEED_MAX}"),
    "tokenizer": (lambda v: isinstance(v, str), "the tokenizer spec string"),
    "init_from": (_optional(lambda v: isinstance(v, Mapping)), "None or the starting model's InitSource"),
    "data": (_optional(_path), "None or a corpus path"),
    "locate_lr": (lambda v: isinstance(v, bool), "True or False"),
    "given": (lambda v: isinstance(v, Mapping), "a mapping of the settings given"),
}


def _check(where: str, table: dict[str, tuple[Callable[[Any], bool], str]], values: Mapping[str, Any]) -> None:
    for name, (ok, what) in table.items():
        if name in values and not ok(values[name]):
            value = values[name]
            raise ArgumentError(f"{where}: {name} must be {what}, got {value!r} ({type(value).__name__})")


def check_space(space: Any, where: str) -> None:
    if not isinstance(space, Space):
        raise ArgumentError(f"{where}: the space must be an npas Space, got {type(space).__name__}; load one with "
                            "npas.load_space('search_spaces/full.yaml') (a path or a shipped name)")


def check_choices(sampler: str | None, seed: int | None) -> None:
    """The values the CLI's parser limits: a sampler Optuna has, a seed numpy takes."""
    if sampler is not None and sampler not in SAMPLERS:
        raise StudyError(f"unknown sampler {sampler!r}{closest(sampler, SAMPLERS)}; choose one of "
                         f"{', '.join(SAMPLERS)}")
    if seed is not None and not 0 <= seed <= SEED_MAX:
        raise StudyError(f"seed {seed} is out of range; give a whole number from 0 to {SEED_MAX:,}, e.g. 0")


def check_plan_search_arguments(space: Any, values: Mapping[str, Any]) -> None:
    """`plan_search`'s arguments by type, then the sampler and the seed by value."""
    check_space(space, "plan_search")
    _check("plan_search", PLAN_SEARCH_ARGS, values)
    check_choices(values.get("sampler"), values.get("seed"))


def check_keywords(where: str, options: Mapping[str, Any], function: Callable[..., Any]) -> None:
    """Refuse a keyword `function` does not take, naming the closest one it does."""
    known = [n for n, p in inspect.signature(function).parameters.items() if p.kind is p.KEYWORD_ONLY]
    for key in options:
        if key not in known:
            raise ArgumentError(f"{where}: unknown option {key!r}{closest(key, known)} (it takes {', '.join(known)})")


RESUME_ARGS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "space_text": (_optional(lambda v: isinstance(v, str)), "the space file's text or None"),
    "allow_space_change": (lambda v: isinstance(v, bool), "True or False"),
    "data": (_optional(_path), "a corpus path or None"),
    "init_from": (_optional(_path), "a model directory path or None"),
    "tokenizer": (_optional(_tokenizer), "a tokenizer spec or None"),
}


def check_resume_arguments(name: Any, **values: Any) -> None:
    """`resume`'s arguments by type (its counts, launch and storage go through `check_launch`)."""
    if not isinstance(name, str):
        raise ArgumentError(f"resume: the study name must be a string, got {name!r} ({type(name).__name__})")
    _check("resume", RESUME_ARGS, values)


def locate_lr_problem(recipe: Any, early_stop: bool | None) -> str | None:
    """Why --locate-lr cannot run under `recipe`, or None: the located rate is chosen at a rung below the
    ladder's top, so it needs a wsd recipe, early stopping, and a rung below `steps`."""
    if recipe.schedule != "wsd" or early_stop is False:
        why = "--no-early-stop trains every trial to T" if recipe.schedule == "wsd" else \
            f"recipe {recipe.name!r} has schedule {recipe.schedule!r}"
        return (f"--locate-lr chooses each trial's rate at a rung of the promotion ladder, but {why}; use a recipe "
                "with schedule: wsd and early stopping, or drop --locate-lr")
    if len(recipe.fork_rungs()) < 2:
        return (f"--locate-lr chooses each trial's rate at a rung below the top, but recipe {recipe.name!r} has "
                f"one rung only ({recipe.steps} steps: every candidate would train its whole grid to T); give it "
                "rungs below steps (e.g. rungs: [T/16, T/4]) or drop --locate-lr")
    return None


def check_plan(plan: Any) -> Any:
    """A SearchPlan as `search` runs it, checked again (cheap checks only, nothing touched); returns its
    launch as `check_inputs` returns it."""
    _check("search(plan)", PLAN_FIELDS, {name: getattr(plan, name) for name in PLAN_FIELDS})
    if problem := study_name_problem(plan.study_name):
        raise StudyError(f"{problem}; pass another study name")
    launch = check_inputs(plan.trials, plan.launch, plan.storage)
    check_repeats(plan.repeats)
    check_choices(plan.sampler, plan.seed)
    if plan.locate_lr and (problem := locate_lr_problem(plan.recipe, launch.early_stop)):
        raise StudyError(problem)
    chassis = plan.space.reference_chassis
    if plan.recipe.seq_len > chassis.context:
        raise StudyError(f"recipe {plan.recipe.name!r} trains at seq_len={plan.recipe.seq_len} > the space's context "
                         f"{chassis.context}; build the plan with npas.plan_search, which checks it")
    if plan.corpus.vocab_size > chassis.vocab_size:
        raise StudyError(f"the corpus's tokenizer has {plan.corpus.vocab_size} tokens but the space's chassis embeds "
                         f"{chassis.vocab_size}; build the plan with npas.plan_search, which binds the space to "
                         "the corpus")
    return launch


__all__ = ["SEED_MAX", "check_choices", "check_keywords", "check_plan", "check_plan_search_arguments",
           "check_resume_arguments", "check_space", "locate_lr_problem"]
