"""The round-three input corpus's shared setting (tests/presentation/test_inputs_round3.py for the CLI,
test_inputs_api_round3.py for the Python API): the tiny space and recipe, an `npas train`-style model
directory and a set-up study that every refused input must leave as it was."""

from __future__ import annotations

import json

import pytest
import torch

import npas
from tests.conftest import ROOT

TINY = str(ROOT / "tests" / "data" / "tiny.yaml")
FAST = str(ROOT / "tests" / "data" / "fast.yaml")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """The tiny chassis's allocation and an `npas train`-style directory of it (untrained), built once."""
    from npas.allocation.config import reference_config
    from npas.allocation.recursion import RecursionSpec
    from npas.allocation.recursion_allocation import recursion_config
    from npas.training.data import load_corpus
    from npas.training.recipe import load_recipe
    from npas.training.train import save_trained, write_metrics
    from tests.presentation.model_dirs import placeholder_result

    root = tmp_path_factory.mktemp("round3")
    cfg = reference_config(npas.load_space(TINY).reference_chassis)
    recipe = load_recipe(FAST)
    corpus = load_corpus(None, recipe.val_fraction, recipe.test_fraction)
    result = placeholder_result()
    torch.manual_seed(0)
    save_trained(npas.build_model(cfg), cfg, corpus.tokenizer, root / "model")
    write_metrics(root / "model", result, recipe, corpus)
    db = f"sqlite:///{root / 'study.db'}"
    set_up_study(npas.plan_search(npas.load_space(TINY), recipe=FAST, study="ladder-r3", storage=db))
    mor = recursion_config(cfg.chassis, RecursionSpec(steps=2, stack=2, capacities=(1.0, 0.5)))
    return {"model": root / "model", "ALLOC": cfg.to_yaml(), "MOR": mor.to_yaml(), "db": db, "study": "ladder-r3",
            "EXPORT 5000": json.dumps({"allocation": cfg.to_dict(), "lr_factor": 5000.0})}


def set_up_study(plan) -> None:
    """A study as `npas.search` leaves it once set up (its record, marked ready), of `plan`, no trial run."""
    import optuna

    from npas.service.study.record import StudyRecord
    from npas.service.study.studies import mark_ready, write_record

    space = plan.space
    study = optuna.create_study(study_name=plan.study_name, storage=plan.storage, directions=["minimize"] * 2)
    write_record(study, StudyRecord(
        version=npas.__version__, space_text=space.text, space_hash=space.hash, space_name=space.name,
        space_source=space.source, budget_params=space.budget_params, budget_spec=space.budget_spec,
        reference_params=space.reference_params, recipe=plan.recipe.to_dict(), data_source=None,
        data_fingerprint=plan.corpus.fingerprint, vocab_size=plan.corpus.vocab_size, objectives=tuple(space.objectives),
        overrides=dict(space.overrides), tokenizer_fingerprint=plan.corpus.tokenizer.fingerprint))
    mark_ready(study)


def study_state(url: str, name: str) -> tuple[int, dict]:
    """(trials, attributes) of the set-up study, read through npas's cached read-only handle."""
    from npas.service.study.storage import open_storage

    storage = open_storage(url, read_only=True).storage
    sid = storage.get_study_id_from_name(name)
    return len(storage.get_all_trials(sid, deepcopy=False)), dict(storage.get_study_user_attrs(sid))
