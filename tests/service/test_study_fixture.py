"""The stored smoke study (tests/data/smoke_study.json, the `smoke_study` fixture) stays what a search writes.

The fast tier reads a finished study from that file instead of searching; these tests make sure the file
is rebuilt faithfully and, in the slow tier, that today's search still writes a study of the same shape
(else: regenerate it with `python -m tests.study_fixture`).
"""

from __future__ import annotations

import pytest

from tests.study_fixture import FIXTURE, dump, load, rebuild, run_smoke_search, shape


def test_the_rebuilt_study_is_the_stored_one(tmp_path):
    stored = load()
    assert dump(rebuild(stored, f"sqlite:///{tmp_path}/npas.db")) == stored  # numbers, states, attrs, times


def test_the_stored_study_is_a_finished_search_with_a_front():
    stored = load()
    assert [t["number"] for t in stored["trials"]] == list(range(len(stored["trials"])))
    assert {t["state"] for t in stored["trials"]} == {"COMPLETE"}
    assert stored["user_attrs"]["npas_ready"] and stored["user_attrs"]["target_trials"] == 6
    assert any(t["user_attrs"].get("baseline") for t in stored["trials"])  # the reference baselines ran too


@pytest.mark.slow  # a real search on the session's Ray
def test_todays_search_writes_a_study_of_the_stored_shape(ray_local, tmp_path):
    fresh = dump(run_smoke_search(f"sqlite:///{tmp_path}/npas.db"))
    assert shape(fresh) == shape(load()), f"{FIXTURE} is stale: regenerate it with `python -m tests.study_fixture`"
