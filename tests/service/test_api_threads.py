"""The Python API from a thread other than the main one: a program that runs `npas.search` in a worker
thread (a notebook's background job, a web service) gets a search, not `ValueError: signal only works
in main thread` after the study was already written."""

from __future__ import annotations

import signal
import threading
import uuid

import optuna
import pytest

import npas
from npas.service.execution.session import sigterm_as_interrupt
from npas.service.search.launch import Launch
from npas.service.study.studies import counts_toward_target
from tests.conftest import ROOT

TINY = ROOT / "tests" / "data" / "tiny.yaml"
FAST = str(ROOT / "tests" / "data" / "fast.yaml")


def _in_a_thread(fn) -> list:
    """Run fn() in a fresh thread; [result] or [exception]."""
    out: list = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as e:  # noqa: BLE001 - handed back to the test to inspect
            out.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join(timeout=600)
    assert not t.is_alive(), "the call did not return"
    return out


def test_sigterm_as_interrupt_off_the_main_thread_installs_nothing_and_runs_the_body():
    before = signal.getsignal(signal.SIGTERM)

    def body() -> str:
        with sigterm_as_interrupt():
            assert signal.getsignal(signal.SIGTERM) is before  # the program's own handling stays
            return "ran"

    (result,) = _in_a_thread(body)
    assert result == "ran"
    assert signal.getsignal(signal.SIGTERM) is before


def test_sigterm_as_interrupt_on_the_main_thread_still_turns_sigterm_into_an_interrupt():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), sigterm_as_interrupt():
        signal.raise_signal(signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is before  # restored


@pytest.mark.slow  # a real search on Ray
def test_npas_search_runs_from_a_worker_thread(ray_local, tmp_path):
    url = f"sqlite:///{tmp_path}/npas.db"
    name = f"thread-{uuid.uuid4().hex[:6]}"
    plan = npas.plan_search(npas.load_space(TINY), trials=4, study=name, storage=url, recipe=FAST,
                            sampler="random", launch=Launch(workers=2, early_stop=False))
    (result,) = _in_a_thread(lambda: npas.search(plan))
    assert isinstance(result, optuna.Study), f"npas.search from a thread raised {result!r}"
    done = [t for t in optuna.load_study(study_name=name, storage=url).trials if counts_toward_target(t)]
    assert len(done) == 4
