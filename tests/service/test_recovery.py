"""Orphan recovery without processes: which RUNNING trials count as a dead driver's.

The heartbeat, timed by the database's clock, is the truth for every driver but this process; a
pid can only speed recovery up, and only for a driver in this host's PID namespace and boot.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import time

import optuna
import pytest
import sqlalchemy
from optuna.trial import TrialState

from npas.service.study import faults
from npas.service.study import optuna_adapter as adapter
from npas.service.study.record import TrialAttr


@pytest.fixture
def study(tmp_path):
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/r.db", heartbeat_interval=1, grace_period=2)
    return optuna.create_study(study_name="r", storage=storage)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def running(study: optuna.Study, driver: dict | None) -> optuna.Trial:
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    adapter.record_heartbeat(study, trial)
    if driver is not None:
        trial.set_user_attr(TrialAttr.DRIVER, driver)
    return trial


def state(study: optuna.Study, trial: optuna.Trial) -> TrialState:
    return adapter.storage_of(study).get_trial(adapter.trial_id(trial)).state


def test_a_dead_driver_in_this_namespace_is_recovered_at_once(study):
    trial = running(study, {**faults.driver_id(), "pid": dead_pid()})
    assert faults.recover_orphans(study) == [trial.number]
    assert state(study, trial) == TrialState.FAIL
    retry = [t for t in study.trials if t.state == TrialState.WAITING]
    assert retry and retry[0].user_attrs[TrialAttr.RETRY_OF] == trial.number
    again = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})  # the enqueued one, exactly
    assert again.number == retry[0].number and again.params == trial.params


def test_a_pid_from_another_namespace_never_fails_a_beating_driver(study):
    """Same host name (containers, hostNetwork pods), another PID namespace: the pid means nothing here."""
    other_ns = {**faults.driver_id(), "pid": dead_pid(), "pidns": "pid:[1]"}
    old_record = {"host": faults.driver_id()["host"], "pid": dead_pid()}  # from before namespaces were stored
    a, b = running(study, other_ns), running(study, old_record)
    assert faults.recover_orphans(study) == []
    assert state(study, a) == state(study, b) == TrialState.RUNNING
    assert faults.live_drivers(study)  # and a SQLite joiner is refused while they beat


def test_another_hosts_driver_is_recovered_once_its_heartbeat_is_stale(study):
    trial = running(study, {"host": "elsewhere", "pid": os.getpid()})
    assert faults.recover_orphans(study) == []
    time.sleep(3.2)
    assert faults.recover_orphans(study) == [trial.number]
    assert faults.live_drivers(study) == []


def test_an_unclaimed_trial_is_judged_by_the_database_clock_not_the_askers(study, tmp_path):
    """A driver whose local clock (or time zone) is hours behind wrote datetime_start; it is alive and
    about to claim its trial. Its naive start time must not make the trial an orphan."""
    trial = study.ask()  # asked, not yet claimed or beaten
    engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path}/r.db")
    with engine.begin() as c:
        c.execute(sqlalchemy.text("UPDATE trials SET datetime_start = :t WHERE trial_id = :i"),
                  {"t": datetime.datetime.now() - datetime.timedelta(hours=3), "i": adapter.trial_id(trial)})
    assert faults.recover_orphans(study) == []
    assert state(study, trial) == TrialState.RUNNING
    time.sleep(3.2)  # nobody claimed or beat it for a grace period (database clock): now it is an orphan
    assert faults.recover_orphans(study) == [trial.number]


def test_this_process_never_recovers_its_own_trials(study):
    trial = running(study, faults.driver_id())
    time.sleep(3.2)  # even stale: a heartbeat thread that fell behind is not a dead driver
    assert faults.recover_orphans(study) == []
    assert state(study, trial) == TrialState.RUNNING


def test_resume_waits_for_a_trial_its_driver_never_claimed(study):
    """Killed between ask and claim: the trial counts toward the target while RUNNING, so recovery at
    resume waits (one grace period, database clock) until it is provably orphaned, then re-enqueues it."""
    trial = study.ask()
    t0 = time.monotonic()
    assert faults.recover_orphans(study, wait_unclaimed_s=30) == [trial.number]
    assert 1.5 < time.monotonic() - t0 < 30
    assert state(study, trial) == TrialState.FAIL
