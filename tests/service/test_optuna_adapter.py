"""The private Optuna APIs npas relies on, each checked against the installed Optuna.

An Optuna release that moves one of them fails here, naming the accessor, instead of failing a
search in the field. The installed version must lie in the range pyproject.toml declares.
"""

from __future__ import annotations

import re
import time
import tomllib

import optuna
import pytest
from optuna.trial import TrialState

from npas.service.study import optuna_adapter as adapter
from tests.conftest import ROOT


def test_installed_optuna_is_in_the_declared_range():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(d for d in deps if d.startswith("optuna"))
    lo, hi = (int(x) for x in re.fullmatch(r"optuna>=(\d+)(?:\.\d+)*,<(\d+)", spec).groups())
    assert (lo, hi) == adapter.SUPPORTED_OPTUNA, "update optuna_adapter.SUPPORTED_OPTUNA with pyproject.toml"
    major = int(optuna.__version__.split(".")[0])
    assert lo <= major < hi, f"optuna {optuna.__version__} is outside {spec}: re-check npas.service.study.optuna_adapter"


@pytest.fixture
def study(tmp_path):
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/a.db", heartbeat_interval=1, grace_period=1)
    return optuna.create_study(study_name="a", storage=storage, directions=["minimize", "minimize"])


def test_storage_study_and_trial_ids(study):
    storage = adapter.storage_of(study)
    assert isinstance(storage, optuna.storages.BaseStorage), "Study._storage moved"
    assert adapter.study_id(study) == storage.get_study_id_from_name("a"), "Study._study_id moved"
    frozen = storage.get_all_studies()[0]
    assert adapter.study_id(frozen) == adapter.study_id(study), "FrozenStudy._study_id moved"
    trial = study.ask()
    assert storage.get_trial(adapter.trial_id(trial)).number == trial.number, "Trial._trial_id moved"
    assert adapter.trial_id(study.trials[0]) == adapter.trial_id(trial), "FrozenTrial._trial_id moved"


def test_stale_trial_ids_use_the_heartbeat_and_fail_nothing(study):
    beating, silent = study.ask(), study.ask()
    adapter.record_heartbeat(study, beating)
    adapter.record_heartbeat(study, silent)
    assert adapter.stale_trial_ids(study) == set()
    time.sleep(2.5)
    adapter.record_heartbeat(study, beating)
    assert adapter.stale_trial_ids(study) == {adapter.trial_id(silent)}, "RDBStorage._get_stale_trial_ids moved"
    assert all(t.state == TrialState.RUNNING for t in study.trials)  # found, not failed


def test_no_heartbeat_storage_has_no_stale_trials(tmp_path):
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/b.db")
    study.ask()
    assert adapter.stale_trial_ids(study) == set()


def test_hypervolume_is_exact():
    assert adapter.hypervolume([[0.5, 0.5]], [1.0, 1.0]) == pytest.approx(0.25)
    assert adapter.hypervolume([[0.0, 0.5], [0.5, 0.0]], [1.0, 1.0]) == pytest.approx(0.75)
    assert adapter.hypervolume([], [1.0, 1.0]) == 0.0
