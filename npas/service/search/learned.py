"""Where a study's learned sharing groups come from: one trained model's layer similarity, once.

`tying.mode: learned` and `pools.rule: learned` cluster layers by how alike their trained weights are
(`npas.conversion.groups`). The creating driver decides the model once per study:

* with `--init-from DIR`, the model the trials start from;
* otherwise it pretrains the dense reference once, under the study's own recipe (a proxy run: the
  groups need weights that have begun to specialise, not a converged model), into
  `<database dir>/<study>.learned-source/` for SQLite (`./<study>.learned-source/` for a server
  database), in `npas train`'s format so `npas sample` or `--init-from` can read it.

The record keeps the model's directory and weights fingerprint and the (L, L) similarity itself, so
resume, joiners (which wait while the creator pretrains, see `PRETRAINING_ATTR`) and every later
reader rebuild identical candidates from the database alone, without the model or a second run. Ray
workers need nothing: they receive each trial's fitted allocation, not knob values.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import optuna

from npas.allocation.config import reference_config
from npas.allocation.space import Space
from npas.conversion.directory import fingerprint_weights
from npas.conversion.groups import similarity_of
from npas.errors import StudyError
from npas.training.train import train_allocation

if TYPE_CHECKING:
    from npas.service.study.storage import StorageHandle
    from npas.training.init_source import InitSource

log = logging.getLogger(__name__)

class _Plan(Protocol):
    """What the creator's look reads of a `SearchPlan` (the plan itself is built with these groups
    attached, so this module cannot import it)."""

    space: Space
    init_from: InitSource | None
    recipe: Any
    corpus: Any


PRETRAINING_ATTR = "npas_pretraining"  # set by the creator while it pretrains: joiners wait PRETRAIN_WAIT_S
PRETRAIN_WAIT_S = 3600.0


def learn_for_study(study: optuna.Study, handle: StorageHandle, plan: _Plan) -> dict:
    """The creator's one look at trained weights for the learned groups.

    Runs after the study name is claimed, so a joiner never pretrains too: it waits on the
    pretraining marker. A failure deletes the half-made study and the pretraining's directory,
    leaving the database and its folder as they were."""
    try:
        if plan.init_from is None:
            study.set_user_attr(PRETRAINING_ATTR, True)
        return learn_source(plan.space, plan.init_from, plan.recipe, plan.corpus,
                            source_dir(study.study_name, handle.sqlite_path))
    except BaseException:
        optuna.delete_study(study_name=study.study_name, storage=handle.storage)
        raise


def source_dir(study: str, sqlite_path: Path | None) -> Path:
    """Where the creator's pretrained model goes: beside the SQLite file, else the working directory."""
    return (sqlite_path.parent if sqlite_path is not None else Path.cwd()) / f"{study}.learned-source"


def learn_source(space: Space, init: InitSource | None, recipe: Any, corpus: Any, out: Path) -> dict:
    """The record of the model the study's groups are learned from, with its layer similarity.

    From the --init-from model when there is one (`init`), else from one
    proxy-length training of the space's reference written to `out`."""
    if init is not None:
        sim = similarity_of(init.dir)
        space.with_similarity(sim)  # its shape is checked against the space here, before anything is recorded
        return {"origin": "init_from", "dir": init.dir, "weights": init.weights,
                "similarity": [list(r) for r in sim]}
    if out.exists():  # a failed earlier creation's leftovers: this study's run replaces them
        shutil.rmtree(out)
    log.info("learned groups: pretraining the reference once (%d steps of recipe %s) into %s",
             recipe.steps, recipe.name, out)
    try:
        result = train_allocation(reference_config(space.reference_chassis, space.dtype), recipe, corpus, out)
        if result.status != "ok":
            raise StudyError(f"pretraining the reference for learned groups failed ({result.status}: "
                             f"{result.failure_reason}); pass --init-from DIR with a trained model instead")
        sim = similarity_of(out)
        space.with_similarity(sim)
    except BaseException:  # the study is deleted too (learn_for_study): nothing of it stays beside the database
        shutil.rmtree(out, ignore_errors=True)
        raise
    return {"origin": "pretrained", "dir": str(out.resolve()), "weights": fingerprint_weights(out),
            "similarity": [list(r) for r in sim]}


def attach(space: Space, learned: dict | None, study: str) -> Space:
    """The space with the study's recorded similarity, or the reason a learned mode cannot run."""
    if learned is not None:
        return space.with_similarity(learned["similarity"])
    if space.learns_groups:
        raise StudyError(f"study {study!r} recorded no learned groups (it was created with a space that learns "
                         f"none); a learned tying or bank rule needs a new study")
    return space
