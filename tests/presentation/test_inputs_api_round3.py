"""The round-three input corpus's Python API cases (`npas.plan_search`, `npas.search`, `npas.resume`):
each raises an `NpasError` in one line (never a bare TypeError, KeyError or AttributeError from deep
inside), writes no database, starts no Ray and leaves the set-up study as it was. The CLI cases and the
corpus-size check are tests/presentation/test_inputs_round3.py's."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import npas
from npas.errors import NpasError
from npas.service.search.launch import Launch
from tests.presentation.round3_study import FAST, TINY, built, study_state  # noqa: F401 (built: a fixture)
from tests.presentation.test_inputs import (
    _tree,
    guarded,  # noqa: F401 (a fixture: no Ray, the working folder watched)
)


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    """One checked plan of the tiny space (nothing written: planning touches no database)."""
    db = tmp_path_factory.mktemp("round3-plan") / "never.db"
    made = npas.plan_search(npas.load_space(TINY), recipe=FAST, study="r3", storage=f"sqlite:///{db}")
    assert not db.exists()
    return made


def _replace(**changes: Any) -> Callable[[Any, str], Any]:
    return lambda p, db: npas.search(dataclasses.replace(p, storage=db, **changes))


def _plan_search(**kw: Any) -> Callable[[Any, str], Any]:
    return lambda p, db: npas.plan_search(**({"space": p.space, "recipe": FAST, "storage": db} | kw))


def _recipe_of(p: Any, **changes: Any) -> Any:
    return dataclasses.replace(p.recipe, **changes)


# name -> (call(plan, storage URL), fragment of the one-line NpasError)
API_CASES: dict[str, tuple[Callable[[Any, str], Any], str]] = {
    "plan-space-a-path": (lambda p, db: npas.plan_search(TINY, recipe=FAST, storage=db), "must be an npas Space"),
    "plan-trials-string": (_plan_search(trials="3"), "trials must be an int"),
    "plan-trials-bool": (_plan_search(trials=True), "trials must be an int"),
    "plan-trials-float": (_plan_search(trials=2.5), "trials must be an int"),
    "plan-study-int": (_plan_search(study=5), "study must be"),
    "plan-storage-a-path": (_plan_search(storage=Path("x.db")), "storage must be a URL string"),
    "plan-launch-a-dict": (_plan_search(launch={"workers": 2}), "launch must be an"),
    "plan-workers-string": (_plan_search(launch=Launch(workers="2")), "Launch.workers must be an int"),
    "plan-gpus-string": (_plan_search(launch=Launch(gpus_per_trial="1")), "Launch.gpus_per_trial must be a number"),
    "plan-early-stop-string": (_plan_search(launch=Launch(early_stop="no")), "Launch.early_stop must be"),
    "plan-checkpoint-storage-int": (_plan_search(launch=Launch(checkpoint_storage=5)), "Launch.checkpoint_storage"),
    "plan-seed-negative": (_plan_search(seed=-1), "seed -1 is out of range"),
    "plan-seed-string": (_plan_search(seed="0"), "seed must be an int"),
    "plan-sampler-unknown": (_plan_search(sampler="cmaes"), "unknown sampler 'cmaes'"),
    "plan-tokenizer-int": (_plan_search(tokenizer=5), "tokenizer must be"),
    "plan-corpus-a-string": (_plan_search(corpus="shakespeare.txt"), "corpus must be a Corpus"),
    "plan-locate-lr-string": (_plan_search(locate_lr="yes"), "locate_lr must be True, False or None"),
    "plan-data-int": (_plan_search(data=5), "data must be a corpus path"),
    "plan-budget-list": (_plan_search(budget=[1]), "budget must be"),
    "plan-repeats-string": (_plan_search(repeats="2"), "--repeats must be a whole number"),
    "search-space-a-path": (lambda p, db: npas.search(TINY, recipe=FAST, storage=db), "must be an npas Space"),
    "search-misspelt-option": (lambda p, db: npas.search(p.space, trails=3, storage=db), "did you mean 'trials'"),
    "search-plan-and-options": (lambda p, db: npas.search(dataclasses.replace(p, storage=db), trials=3),
                                "takes no other options"),
    "replaced-trials-zero": (_replace(trials=0), "--trials must be >= 1"),
    "replaced-trials-string": (_replace(trials="4"), "trials must be an int"),
    "replaced-study-name-traversal": (_replace(study_name="../x"), "may hold only letters"),
    "replaced-seed-negative": (_replace(seed=-1), "seed -1 is out of range"),
    "replaced-repeats-zero": (_replace(repeats=0), "--repeats must be a whole number"),
    "replaced-workers-zero": (_replace(launch=Launch(workers=0)), "--workers must be >= 1"),
    "replaced-locate-lr-on-cosine": (_replace(locate_lr=True), "has schedule 'cosine'"),
    "replaced-recipe-a-name": (_replace(recipe="smoke"), "recipe must be a Recipe"),
    "replaced-recipe-longer-than-context": (lambda p, db: _replace(recipe=_recipe_of(p, seq_len=128))(p, db),
                                            "seq_len=128 > the space's context 64"),
    "replaced-space-narrower-vocabulary": (lambda p, db: _replace(space=p.space.bind(vocab_size=32))(p, db),
                                           "the corpus's tokenizer has 68 tokens"),
    "replaced-storage-in-memory": (lambda p, db: npas.search(dataclasses.replace(p, storage="sqlite://")),
                                   "in-memory"),
    "replaced-space-none": (_replace(space=None), "space must be a Space"),
    "replaced-given-none": (_replace(given=None), "given must be a mapping"),
    "replaced-checkpoint-storage-relative": (_replace(launch=Launch(checkpoint_storage="ck")), "relative path"),
    "resume-name-int": (lambda p, db: npas.resume(5, storage=db), "the study name must be a string"),
    "resume-trials-string": (lambda p, db: npas.resume("x", trials="3", storage=db), "trials must be an int"),
    "resume-launch-string": (lambda p, db: npas.resume("x", launch="local", storage=db), "launch must be an"),
    "resume-missing-study": (lambda p, db: npas.resume("x", storage=db), "no database"),
    "search-joins-with-another-sampler": (lambda p, db: npas.search(p.space, recipe=FAST, sampler="random",
                                                                    study=JOINED[1], storage=JOINED[0]),
                                          "was created with other settings: --sampler 'random'"),
}
JOINED = ["", "ladder-r3"]  # the set-up study of `built`: its storage URL, set by the test, and its name
# all but the plan's repeats, checked by type and range before this corpus
API_FAILED_BEFORE = set(API_CASES) - {"plan-repeats-string"}


@pytest.mark.parametrize("name", list(API_CASES))
def test_the_python_api_refuses_in_one_npas_error_before_ray_and_the_database(
        name: str, plan, built: dict, guarded: Path):  # noqa: F811 (fixtures imported by name)
    call, fragment = API_CASES[name]
    JOINED[0] = built["db"]
    study = study_state(built["db"], built["study"])
    db = guarded / "api.db"
    before = _tree(guarded)
    with pytest.raises(NpasError) as info:
        call(plan, f"sqlite:///{db}")
    message = str(info.value)
    assert fragment in message and "\n" not in message, message
    assert not db.exists()
    assert _tree(guarded) == before, f"files written: {sorted(_tree(guarded) - before)}"
    assert study_state(built["db"], built["study"]) == study
