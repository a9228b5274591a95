"""Joining an existing study by name (`npas search --study NAME`): what must match, checked read-only.

A driver may join a study another driver created (PostgreSQL), or continue a stopped one (SQLite),
only with the same space and the settings it was created with. `join_problem` says why a plan cannot
join; `check_join` asks it before Ray starts, reading the study without writing (the driver asks again
when it joins, after Ray is up, in case the study appeared meanwhile). Light on purpose: the CLI calls
it before it boots Ray in the background, so it must not import the driver (ray.tune, seconds).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

import optuna

from npas.errors import ConfigError, StorageError, StudyError
from npas.service.study.storage import open_storage
from npas.service.study.studies import is_set_up, read_record
from npas.training.recipe import Recipe

if TYPE_CHECKING:
    from npas.service.search.plan import SearchPlan
    from npas.service.study.record import StudyRecord


def join_problem(plan: SearchPlan, record: StudyRecord, where: str) -> str | None:
    """Why `plan` cannot join the study `record` describes: another space, or settings given that differ."""
    name = plan.study_name
    if record.space_hash != plan.space.hash:
        return (f"study {name!r} already exists in {where} with a different space, budget or data; pick another "
                f"--study name, or `npas resume {name}` to continue it as it was")
    stored = {"recipe": _plain(record.recipe), "sampler": record.sampler, "seed": record.seed,
              "repeats": record.repeats, "tokenizer": record.tokenizer_fingerprint, "locate_lr": record.locate_lr}
    mismatch = [f"--{k} {_show(v)} (the study's is {_show(stored[k])})" for k, v in plan.given.items()
                if v is not None and not _same(k, v, stored[k])]
    if mismatch:
        return (f"study {name!r} was created with other settings: {'; '.join(mismatch)}; drop the option to use "
                "the study's, or pick another --study name")
    return None


def check_join(plan: SearchPlan) -> None:
    """Refuse, read-only and before Ray starts, a plan whose study already exists (set up) with another
    space or other settings given (a changed recipe on a ladder study): the driver's join would refuse
    it only after Ray was up. A database or study that is not there yet is a new study: nothing to check."""
    try:
        handle = open_storage(plan.storage, read_only=True)
    except StorageError:
        return
    if plan.study_name not in {s.study_name for s in handle.storage.get_all_studies()}:
        return
    existing = optuna.load_study(study_name=plan.study_name, storage=handle.storage)
    if is_set_up(existing) and (problem := join_problem(plan, read_record(existing), handle.redacted)):
        raise StudyError(problem)


def _same(key: str, given: object, stored: object) -> bool:
    """Whether a setting given equals the study's. Recipes compare as recipes, not as the mappings
    written at different times: a study stores its recipe as the npas of its day wrote it (fields added
    later left out at their defaults), and the same recipe written with every field is the same recipe."""
    if key == "recipe" and isinstance(given, Mapping) and isinstance(stored, Mapping):
        try:
            return Recipe.from_dict(dict(given)) == Recipe.from_dict(dict(stored))
        except ConfigError:  # a stored mapping this npas cannot read: compare it as written
            pass
    return _plain(given) == stored


def _plain(value: object) -> object:
    """As stored: JSON turns tuples into lists."""
    return json.loads(json.dumps(value))


def _show(value: object) -> str:
    return repr(value["name"]) if isinstance(value, dict) and "name" in value else repr(value)


__all__ = ["check_join", "join_problem"]
