"""The smoke study as a fixture file: one real search's study, stored as JSON and rebuilt into SQLite.

Tests that only READ a finished study (the dashboard, picks, the front, export) need a study that a real
search wrote, not a search of their own: running one costs a Ray start and ~15 s of training per test
session. tests/data/smoke_study.json is that study (tiny space, fast recipe, 6 trials, seed 1: the search
`run_smoke_search` makes), written by `python -m tests.study_fixture`. JSON rather than the SQLite file
itself: it survives an Optuna schema migration, and a diff shows what changed. `rebuild` writes it into a
fresh database with Optuna's own API, so readers see what `optuna.load_study` would show them of the
original. tests/service/test_study_fixture.py (slow tier) runs the search again and fails when today's
code writes a study whose keys (attributes, parameters, states) differ from the stored one: the fixture
cannot silently rot; regenerate it with the command above.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import distribution_to_json, json_to_distribution
from optuna.trial import TrialState, create_trial

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "data" / "smoke_study.json"
TINY = ROOT / "tests" / "data" / "tiny.yaml"
FAST = str(ROOT / "tests" / "data" / "fast.yaml")
NAME = "smoke"


def run_smoke_search(url: str) -> optuna.Study:
    """The real search the fixture is taken from (real Ray, real SQLite). Needs Ray up, or starts one."""
    import npas
    from npas.service.search.driver import search
    from npas.service.search.launch import Launch

    return search(npas.load_space(TINY), trials=6, study=NAME, storage=url, recipe=FAST, seed=1,
                  launch=Launch(workers=2, early_stop=False))


def _time(t: dt.datetime | None) -> str | None:
    return None if t is None else t.isoformat()


def dump(study: optuna.Study) -> dict[str, Any]:
    """Everything Optuna keeps of the study, as JSON-ready data (trials in number order)."""
    storage = study._storage
    return {
        "name": study.study_name,
        "directions": [d.name for d in study.directions],
        "user_attrs": study.user_attrs,
        "system_attrs": storage.get_study_system_attrs(study._study_id),
        "trials": [{
            "number": t.number, "state": t.state.name, "values": t.values,
            "params": t.params, "distributions": {k: distribution_to_json(d) for k, d in t.distributions.items()},
            "user_attrs": t.user_attrs, "system_attrs": t.system_attrs,
            "intermediate_values": {str(k): v for k, v in t.intermediate_values.items()},
            "datetime_start": _time(t.datetime_start), "datetime_complete": _time(t.datetime_complete),
        } for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)],
    }


def rebuild(data: dict[str, Any], url: str) -> optuna.Study:
    """A new study in the database at `url` holding exactly the dumped study (same numbers, states,
    values, attributes and curves)."""
    study = optuna.create_study(study_name=data["name"], storage=url,
                                directions=[optuna.study.StudyDirection[d] for d in data["directions"]])
    storage = study._storage
    for k, v in data["system_attrs"].items():
        storage.set_study_system_attr(study._study_id, k, v)
    for k, v in data["user_attrs"].items():
        study.set_user_attr(k, v)
    for t in data["trials"]:
        study.add_trial(create_trial(
            state=TrialState[t["state"]], values=t["values"], params=t["params"],
            distributions={k: json_to_distribution(d) for k, d in t["distributions"].items()},
            user_attrs=t["user_attrs"], system_attrs=t["system_attrs"],
            intermediate_values={int(k): v for k, v in t["intermediate_values"].items()}))
    # create_trial stamps the times now; keep the search's own (durations are shown by the dashboard)
    for t, stored in zip(study.get_trials(deepcopy=False), data["trials"], strict=True):
        _restore_times(storage, t._trial_id, stored)
    return optuna.load_study(study_name=data["name"], storage=url)


def _restore_times(storage: Any, trial_id: int, stored: dict[str, Any]) -> None:
    from optuna.storages._rdb import models

    backend = getattr(storage, "_backend", storage)  # RDBStorage under Optuna's cache
    session = backend.scoped_session()  # Optuna's own session factory and table model
    try:
        row = session.query(models.TrialModel).filter(models.TrialModel.trial_id == trial_id).one()
        for field in ("datetime_start", "datetime_complete"):
            value = stored[field]
            setattr(row, field, None if value is None else dt.datetime.fromisoformat(value))
        session.commit()
    finally:
        session.close()


def load(path: Path = FIXTURE) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def shape(data: dict[str, Any]) -> dict[str, Any]:
    """What must not drift between the fixture and what today's code writes: the names and kinds of what
    is stored (not the values, which the training's numerics and Ray's scheduling may move)."""
    trials = data["trials"]
    return {
        "name": data["name"], "directions": data["directions"],
        "study_user_attrs": sorted(data["user_attrs"]), "study_system_attrs": sorted(data["system_attrs"]),
        "n_trials": len(trials),
        "states": sorted({t["state"] for t in trials}),
        "params": sorted({k for t in trials for k in t["params"]}),
        "distributions": sorted({(k, json.loads(d)["name"]) for t in trials for k, d in t["distributions"].items()}),
        "trial_user_attrs": sorted({k for t in trials for k in t["user_attrs"]}),
        "trial_system_attrs": sorted({k for t in trials for k in t["system_attrs"]}),
        "n_values": sorted({len(t["values"] or []) for t in trials}),
        "curves": any(t["intermediate_values"] for t in trials),
    }


def main() -> None:
    """Regenerate tests/data/smoke_study.json from a real search (a private Ray, a scratch database)."""
    import tempfile

    import ray

    out = Path(sys.argv[1]) if len(sys.argv) > 1 else FIXTURE
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            study = run_smoke_search(f"sqlite:///{tmp}/npas.db")
            out.write_text(json.dumps(dump(study), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    finally:
        ray.shutdown()
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
