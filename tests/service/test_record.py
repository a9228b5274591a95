"""The study's stored record: it owns every study key, round-trips, and reads studies written the old way."""

from __future__ import annotations

import optuna
import pytest

from npas.errors import StudyError
from npas.service.study.record import StudyAttr, StudyRecord
from npas.service.study.storage import open_storage
from npas.service.study.studies import load, read_record, write_record

RECORD = StudyRecord(
    version="0.1.0", space_text="name: t\n", space_hash="h", space_name="t", space_source="t.yaml",
    budget_params=1000, budget_spec="0.5x", reference_params=2000, recipe={"name": "fast", "steps": 40},
    data_source=None, data_fingerprint="fp", vocab_size=68, objectives=("val_loss", "train_memory_bytes"),
    sampler="nsga2", seed=3, early_stop=False, target_trials=8, overrides={"vocab_size": 68})

# what npas wrote before the record existed (one set_user_attr per key, names spelled out), from a
# version that did not store sampler, seed, early stop, target or overrides yet
OLD_ATTRS = {"npas_version": "0.0.9", "space_text": "name: t\n", "space_hash": "h", "space_name": "t",
             "space_source": "t.yaml", "budget_params": 1000, "budget_spec": "0.5x", "reference_params": 2000,
             "recipe": {"name": "fast", "steps": 40}, "data_source": None, "data_fingerprint": "fp",
             "vocab_size": 68, "objectives": ["val_loss", "train_memory_bytes"]}


def test_the_record_owns_every_study_key():
    import dataclasses

    # locate_lr is written only when on (a study without it is stored as before it existed)
    assert set(dataclasses.replace(RECORD, locate_lr=True).to_attrs()) == {str(k) for k in StudyAttr} - {StudyAttr.READY}
    assert StudyAttr.LOCATE_LR not in RECORD.to_attrs()


def test_round_trip_through_a_real_study(tmp_path):
    handle = open_storage(f"sqlite:///{tmp_path}/r.db")
    study = optuna.create_study(study_name="r", storage=handle.storage)
    write_record(study, RECORD)
    again = read_record(load("r", handle))
    assert again == RECORD
    assert optuna.load_study(study_name="r", storage=handle.url).user_attrs["early_stop"] is False  # plain Optuna


def test_a_study_written_the_old_way_loads_with_the_settings_it_ran_with(tmp_path):
    handle = open_storage(f"sqlite:///{tmp_path}/o.db")
    study = optuna.create_study(study_name="old", storage=handle.storage)
    for k, v in OLD_ATTRS.items():
        study.set_user_attr(k, v)
    rec = read_record(load("old", handle))
    assert rec.objectives == ("val_loss", "train_memory_bytes") and rec.budget_params == 1000
    assert (rec.sampler, rec.seed, rec.early_stop, rec.target_trials, dict(rec.overrides)) == ("tpe", 0, True, 20, {})


def test_a_study_without_a_record_is_named():
    with pytest.raises(StudyError, match="no npas record.*data_fingerprint"):
        StudyRecord.from_attrs({k: v for k, v in OLD_ATTRS.items() if k != "data_fingerprint"}, "x")


def test_resume_refuses_a_study_whose_text_was_split_differently(tmp_path):
    """The split is part of the record: a study ranked on other validation text is not continued."""
    from dataclasses import replace

    import npas
    from npas.service.search.driver import resume
    from npas.training.data import load_corpus
    from npas.training.recipe import load_recipe

    space = npas.load_space("search_spaces/taper.yaml")
    rec = load_recipe("smoke")
    corpus = load_corpus(None, val_fraction=rec.val_fraction, test_fraction=rec.test_fraction)
    split = corpus.describe()["split"]
    record = replace(RECORD, space_text=space.text, space_source=space.source, recipe=rec.to_dict(),
                     data_fingerprint=corpus.fingerprint, overrides={"vocab_size": corpus.vocab_size},
                     objectives=tuple(space.objectives),
                     data_split={**split, "chunk_chars": split["chunk_chars"] // 2})
    assert record.to_attrs()[StudyAttr.SPLIT]["chunk_chars"] == split["chunk_chars"] // 2
    url = f"sqlite:///{tmp_path}/s.db"
    study = optuna.create_study(study_name="s", storage=open_storage(url).storage,
                                directions=["minimize"] * len(space.objectives))
    write_record(study, record)
    study.set_user_attr(StudyAttr.READY, True)
    with pytest.raises(StudyError, match="split its text .* differently"):
        resume("s", storage=url)
