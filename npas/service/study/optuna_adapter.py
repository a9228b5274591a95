"""Every use of a private Optuna API in npas, in one place.

Optuna's public surface has no way to get a study's storage or id back from a `Study`, a trial's
storage id from a `Trial`, the ids of trials whose heartbeat is stale without failing them (the
public `optuna.storages.fail_stale_trials` fails them at once, before npas has recorded why), or an
exact hypervolume. npas needs each of these, so they are read here and nowhere else.
`tests/service/test_optuna_adapter.py` pins them to the Optuna range in pyproject.toml: an Optuna upgrade
that moves one fails that test with the name of the accessor, not a search in the field.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import optuna
from optuna.trial import FrozenTrial

SUPPORTED_OPTUNA = (5, 6)  # [major_lo, major_hi): the range pyproject.toml allows ("optuna>=5.0,<6")


def storage_of(study: optuna.Study) -> optuna.storages.BaseStorage:
    """The storage a study reads and writes through (Optuna wraps an RDBStorage in a cache)."""
    return study._storage


def study_id(study: optuna.Study | optuna.study.FrozenStudy) -> int:
    return study._study_id


def trial_id(trial: optuna.Trial | FrozenTrial) -> int:
    return trial._trial_id


def stale_trial_ids(study: optuna.Study) -> set[int]:
    """RUNNING trials whose last heartbeat is older than the storage's grace period.

    Both times are the database server's clock (`now()` in SQL), so drivers on hosts with different
    clocks or time zones agree on what is stale. Empty for a storage without heartbeats.
    """
    storage = storage_of(study)
    check = getattr(storage, "_get_stale_trial_ids", None)
    if check is None or not storage.get_heartbeat_interval():
        return set()
    return set(check(study_id(study)))


def record_heartbeat(study: optuna.Study, trial: optuna.Trial | FrozenTrial | int) -> None:
    """Public on RDBStorage (`BaseHeartbeat.record_heartbeat`); reached through the study's storage."""
    tid = trial if isinstance(trial, int) else trial_id(trial)
    storage_of(study).record_heartbeat(tid)


def hypervolume(points: Sequence[Sequence[float]] | np.ndarray, reference: Sequence[float] | np.ndarray) -> float:
    """Exact hypervolume of minimisation `points` against `reference` (what
    `optuna.visualization.plot_hypervolume_history` computes); Optuna has no public function for it."""
    from optuna._hypervolume import compute_hypervolume

    pts = np.asarray(points, dtype=float)
    if pts.size == 0:
        return 0.0
    return float(compute_hypervolume(pts, np.asarray(reference, dtype=float)))
