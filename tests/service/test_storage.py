"""Storage set-up races: a driver joining a study that another is still creating."""

from __future__ import annotations

import threading
import time

import optuna
import pytest

from npas.errors import StorageError, StudyError
from npas.service.search import driver
from npas.service.study.record import StudyAttr
from npas.service.study.storage import open_storage, reachable
from npas.service.study.urls import redact, scrub


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


@pytest.mark.parametrize("url, secrets", [
    ("postgresql+psycopg://npas:s3cr3t@db:5432/npas", ["s3cr3t"]),
    ("postgresql+psycopg://npas@db/npas?password=s3cr3t&sslpassword=pw2&application_name=npas", ["s3cr3t", "pw2"]),
    ("mysql://u@h/db?auth_token=t0k3n&client_secret=xyz", ["t0k3n", "xyz"]),
    ("sqlite:///trials/x.db?password=s3cr3t", ["s3cr3t"]),
])
def test_redaction_hides_every_secret_a_url_can_carry(url, secrets):
    shown = redact(url)
    assert not any(s in shown for s in secrets), shown
    assert "***" in shown
    # what drivers echo in their errors: the URL itself and a libpq-style connection string
    echoed = scrub(f"connection to {url} failed: password=s3cr3t sslpassword='pw2' user=npas", url)
    assert not any(s in echoed for s in secrets), echoed
    assert "user=npas" in echoed  # only secrets go


def test_opening_for_reading_creates_nothing(tmp_path):
    for url in (f"sqlite:///{tmp_path}/typo/x.db", f"sqlite:///{tmp_path}/x.db"):
        with pytest.raises(StorageError, match="no database at"):
            open_storage(url, read_only=True)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "junk.db").write_bytes(b"")  # an existing file that is not an Optuna database stays empty
    with pytest.raises(StorageError, match="not an Optuna database"):
        open_storage(f"sqlite:///{tmp_path}/junk.db", read_only=True)
    assert (tmp_path / "junk.db").read_bytes() == b""


def test_one_handle_per_database_and_process(tmp_path):
    url = f"sqlite:///{tmp_path}/h.db"
    handle = open_storage(url)
    assert open_storage(url) is handle and open_storage(url, read_only=True) is handle  # a writer can read
    assert handle.redacted == url and handle.is_sqlite


def test_reachable_tells_a_server_that_answers_from_one_that_does_not(tmp_path):
    # what the PostgreSQL tests and benchmarks/driver_scale.py skip on: no exception, just True or False
    assert reachable(f"sqlite:///{tmp_path}/r.db")
    assert not reachable("postgresql+psycopg://postgres@127.0.0.1:1/test")  # nothing listens on port 1
    assert not reachable(f"sqlite:///{tmp_path}/no/such/dir/r.db")
