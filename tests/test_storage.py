"""Storage set-up races: a driver joining a study that another is still creating."""

from __future__ import annotations

import threading
import time

import optuna
import pytest

from npas.errors import StudyError
from npas.service import driver
from npas.service.record import StudyAttr
from npas.service.storage import open_storage


def _half_created(url: str, name: str) -> optuna.Study:
    """What a joiner can see while the creator is between create_study and its last attribute."""
    st = open_storage(url).storage
    study = optuna.create_study(study_name=name, storage=st, directions=["minimize", "minimize"])
    study.set_user_attr(StudyAttr.VERSION, "x")
    study.set_user_attr(StudyAttr.SPACE_TEXT, "name: half\n")  # the hash, recipe ... not written yet
    return study


def test_joiner_waits_for_the_creator_to_finish(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'j.db'}"
    study = _half_created(url, "j")
    monkeypatch.setattr(driver, "SETUP_WAIT_S", 30.0)
    t0 = time.monotonic()
    threading.Timer(0.6, lambda: (study.set_user_attr(StudyAttr.SPACE_HASH, "h"), study.set_user_attr(StudyAttr.READY, True)))\
        .start()
    joined = driver._await_setup("j", open_storage(url))
    assert time.monotonic() - t0 >= 0.5
    assert joined.user_attrs[StudyAttr.SPACE_HASH] == "h"  # read after the creator finished, not half-way


def test_a_study_whose_creator_died_during_setup_is_named(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'd.db'}"
    _half_created(url, "d")
    monkeypatch.setattr(driver, "SETUP_WAIT_S", 0.3)
    with pytest.raises(StudyError, match="was never fully set up.*another --study name"):
        driver.resume("d", storage=url)
    # nothing was deleted or changed
    assert optuna.load_study(study_name="d", storage=url).user_attrs[StudyAttr.SPACE_TEXT] == "name: half\n"



def test_resume_of_an_unknown_study_lists_what_is_there(tmp_path):
    url = f"sqlite:///{tmp_path / 'u.db'}"
    _half_created(url, "present")
    with pytest.raises(StudyError, match=r"no study 'absent' .*studies there: present"):
        driver.resume("absent", storage=url)


def test_a_study_that_already_ran_trials_needs_no_marker(tmp_path, monkeypatch):
    """Studies written before the npas_ready marker existed are recognised by their trials."""
    url = f"sqlite:///{tmp_path / 'o.db'}"
    study = _half_created(url, "old")
    study.tell(study.ask(), [1.0, 2.0])
    monkeypatch.setattr(driver, "SETUP_WAIT_S", 0.0)
    assert driver._await_setup("old", open_storage(url)).study_name == "old"
