"""Fault tolerance of drivers: claims, heartbeats, orphan recovery and re-enqueueing.

Several drivers (on PostgreSQL) share one study, and any of them can die. Each trial a driver asks
is claimed at once with its identity and a heartbeat; a heartbeat thread keeps its live trials'
beats fresh. A RUNNING trial is an orphan when its heartbeat is older than the grace period by the
database server's clock (the one clock every host agrees on). A local process check can only make
that faster, for a driver that ran in this very host, PID namespace and boot and is gone.
An orphan is failed with its reason and its exact parameters are enqueued again.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from npas.service.study import optuna_adapter as adapter
from npas.service.study.record import TrialAttr

log = logging.getLogger(__name__)

HEARTBEAT_S = 10  # a driver beats for its running trials this often...
GRACE_S = 60  # ...and a trial silent this long (database clock) belongs to a dead driver
RECOVER_EVERY_S = 30  # a running driver also recovers other drivers' orphans this often


# unclaimed trials this process gave their one heartbeat, per storage (trial ids repeat across databases)
_ADOPTED: weakref.WeakKeyDictionary[Any, set[int]] = weakref.WeakKeyDictionary()


@cache
def _namespace() -> dict[str, str]:
    """What makes a pid meaningful: the PID namespace and the boot it belongs to (Linux)."""
    out = {}
    for key, path in (("pidns", "/proc/self/ns/pid"), ("boot", "/proc/sys/kernel/random/boot_id")):
        try:
            out[key] = os.readlink(path) if key == "pidns" else Path(path).read_text().strip()
        except OSError:
            pass
    return out


def driver_id() -> dict[str, Any]:
    """This driver's identity as stored on the trials it claims."""
    return {"host": socket.gethostname(), "pid": os.getpid(), **_namespace()}


def claim(study: optuna.Study, trial: optuna.Trial) -> None:
    """Heartbeat first (so a driver dying right after the ask leaves a trial that goes stale), then
    the driver's identity (so a resume on this host can tell at once that the driver is gone)."""
    adapter.record_heartbeat(study, trial)
    trial.set_user_attr(TrialAttr.DRIVER, driver_id())


def is_this_process(driver: dict[str, Any]) -> bool:
    me = driver_id()
    return all(driver.get(k) == me.get(k) for k in ("host", "pid", "pidns", "boot")) and bool(driver)


def _provably_dead(driver: dict[str, Any]) -> bool:
    """True only for a driver that ran in this host's PID namespace and boot and whose pid is gone.

    Anything less certain (another host, another container, a record without a namespace, a pid
    reused by some other process) is False: such a driver's trials wait for their heartbeat.
    """
    me = driver_id()
    if not driver.get("pid") or driver.get("host") != me["host"]:
        return False
    if "pidns" not in me or any(driver.get(k) != me.get(k) for k in ("pidns", "boot")):
        return False
    pid = int(driver["pid"])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # exists, owned by someone else
        return False
    return False


def runs_elsewhere_here(driver: dict[str, Any]) -> bool:
    """True for a live process other than this one that recorded `driver` in this host's PID
    namespace and boot (a pid from another container or boot names some other process, or none).
    A record without a namespace (older npas) is judged by host and pid alone."""
    me = driver_id()
    if not driver.get("pid") or driver.get("host") != me["host"] or int(driver["pid"]) == os.getpid():
        return False
    if any(k in driver and driver.get(k) != me.get(k) for k in ("pidns", "boot")):
        return False
    try:
        os.kill(int(driver["pid"]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def recover_orphans(study: optuna.Study, wait_unclaimed_s: float = 0.0) -> list[int]:
    """`recover_once`, repeated for up to `wait_unclaimed_s` while unclaimed RUNNING trials remain.

    A driver killed between its ask and its claim leaves a trial no pid or driver record speaks for;
    only its heartbeat going stale (one grace period) shows it is orphaned. It counts toward the
    target while RUNNING, so a resume that did not wait for it would stop one trial short.
    """
    recovered = recover_once(study)
    deadline = time.monotonic() + wait_unclaimed_s
    told = False
    while wait_unclaimed_s > 0 and (pending := unclaimed(study)) and time.monotonic() < deadline:
        if not told:
            log.warning("waiting up to %.0f s for trial(s) %s, asked by a driver that never claimed them",
                        wait_unclaimed_s, pending)
            told = True
        time.sleep(1.0)
        recovered += recover_once(study)
    return recovered


def unclaimed(study: optuna.Study) -> list[int]:
    return [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if not t.user_attrs.get(TrialAttr.DRIVER)]


def recover_once(study: optuna.Study) -> list[int]:
    """Fail + re-enqueue RUNNING trials whose driver is dead; returns their numbers.

    An unclaimed trial (its driver died between the ask and the claim, which beats first) is given a
    heartbeat now, which starts its grace period on the database clock; a later recovery fails it if no
    driver beats it meanwhile. The status is written while the trial is still RUNNING (a finished
    trial cannot be updated), then the state flips to FAIL; a trial that another process finished
    first is left alone.
    """
    storage = adapter.storage_of(study)
    stale = adapter.stale_trial_ids(study)
    adopted = _ADOPTED.setdefault(storage, set())
    recovered = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        tid = adapter.trial_id(t)
        drv = t.user_attrs.get(TrialAttr.DRIVER) or {}
        if is_this_process(drv):
            continue
        if tid not in stale and not _provably_dead(drv):
            if not drv and tid not in adopted:  # unclaimed: one beat starts its grace period
                adapter.record_heartbeat(study, tid)  # (harmless if its driver is mid-claim: it beats too)
                adopted.add(tid)
            continue
        try:
            storage.set_trial_user_attr(tid, TrialAttr.STATUS, "orphaned")
            storage.set_trial_user_attr(tid, TrialAttr.REASON, "orphaned: its driver stopped while it ran")
            ok = storage.set_trial_state_values(tid, state=TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            ok = False
        if ok:
            requeue(study, storage.get_trial(tid))
            recovered.append(t.number)
    return recovered


def requeue(study: optuna.Study, trial: FrozenTrial) -> None:
    """Enqueue a trial's exact parameters again (and its baseline name) so a later driver re-runs it; a
    ladder trial keeps the path of its checkpoint and its directory, so the re-run resumes from the
    newest checkpoint there, and the steps it had trained, so the re-run counts those it loses.

    A trial that was fitted keeps its allocation and the fit version that made it: the re-run trains
    that allocation whatever the current fit would make of the same knobs (a checkpoint holds its
    shapes, and a study's results stay comparable with what it already ran)."""
    attrs: dict[str, Any] = {TrialAttr.RETRY_OF: trial.number}
    for key in (TrialAttr.BASELINE, TrialAttr.BASELINE_FIXED, TrialAttr.LADDER_CHECKPOINT, TrialAttr.LADDER_DIR,
                TrialAttr.ALLOC, TrialAttr.SHORT):
        if key in trial.user_attrs:
            attrs[key] = trial.user_attrs[key]
    if TrialAttr.ALLOC in attrs:
        attrs[TrialAttr.FIT_VERSION] = trial.user_attrs.get(TrialAttr.FIT_VERSION, 1)
    if trial.user_attrs.get(TrialAttr.TRAINED_STEPS):
        attrs[TrialAttr.STEPS_BEFORE] = trial.user_attrs[TrialAttr.TRAINED_STEPS]
    study.enqueue_trial(trial.params, user_attrs=attrs, skip_if_exists=False)


def live_drivers(study: optuna.Study) -> list[dict[str, Any]]:
    """Drivers other than this process that hold RUNNING trials of the study and may be alive
    (neither stale by their heartbeat nor provably gone from this host)."""
    stale = adapter.stale_trial_ids(study)
    seen: dict[tuple, dict[str, Any]] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        drv = t.user_attrs.get(TrialAttr.DRIVER)
        if drv and not is_this_process(drv) and adapter.trial_id(t) not in stale and not _provably_dead(drv):
            seen.setdefault((drv.get("host"), drv.get("pid")), drv)
    return [seen[k] for k in sorted(seen, key=str)]


class Heartbeat:
    """A daemon thread that beats for this driver's live trials and, now and then, recovers other
    drivers' orphans so a study shared on PostgreSQL does not wait forever on a dead peer."""

    def __init__(self, study: optuna.Study, live_trial_ids: Callable[[], list[int]],
                 interval_s: float = HEARTBEAT_S, recover_every_s: float = RECOVER_EVERY_S) -> None:
        self.study = study
        self.live_trial_ids = live_trial_ids
        self.interval_s = interval_s
        self.recover_every_s = recover_every_s
        self.recovered: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="npas-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval_s + 5)

    def _main(self) -> None:
        since_recovery = 0.0
        while not self._stop.wait(self.interval_s):
            for tid in self.live_trial_ids():
                try:
                    adapter.record_heartbeat(self.study, tid)
                except Exception as e:  # a flaky database must not kill the search; the next beat retries
                    log.warning("heartbeat failed: %s", e)
            since_recovery += self.interval_s
            if since_recovery >= self.recover_every_s:
                since_recovery = 0.0
                try:
                    found = recover_once(self.study)
                except Exception as e:
                    log.warning("orphan recovery failed: %s", e)
                    continue
                if found:
                    log.warning("re-enqueued orphaned trials of another driver: %s", found)
                    self.recovered.extend(found)
