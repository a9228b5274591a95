"""A ladder search after its driver died or stopped: a retry resumes from the newest whole checkpoint in
its earlier attempt's directory (one written just before a crash is recorded nowhere else), counts the
steps that attempt trained past it, the clean-up finds checkpoints wherever the trials recorded them,
and a resumed search's progress line starts from the study's finished trials.

Real checkpoints of real (tiny) climbs on disk, a real Optuna study; no Ray."""

from __future__ import annotations

import math

import optuna
import pytest
from optuna.trial import TrialState

import npas
from npas.service.execution.climb_store import checkpoints_in, count_lost, restore, save_climbs
from npas.service.execution.worker import WorkerSpec
from npas.service.search.ladder_run import pending_checkpoints, sweep
from npas.service.search.samplers import make_sampler
from npas.service.search.searcher import NpasSearcher
from npas.service.study.record import TrialAttr
from npas.training import climb
from npas.training.data import load_corpus
from tests.service.test_ladder_search import TINY, WSD
from tests.training.test_located_rate import REFERENCE, TIED
from tests.training.test_located_rate import WSD as TINY_WSD


@pytest.fixture(scope="module")
def climbing():
    return load_corpus(), WorkerSpec(fingerprint="-", reference=REFERENCE)


def test_a_retry_resumes_from_the_checkpoint_written_just_before_its_driver_died(tmp_path, climbing):
    """Tune writes checkpoint_000001 as the trial reports rung 16; the driver is killed before it hears
    where (it recorded checkpoint_000000, rung 8). The retry takes the newest whole checkpoint in the
    trial's directory, skips one cut short, and counts the steps the attempt trained past it."""
    corpus, spec = climbing
    c = climb.start(TIED, TINY_WSD, corpus, device="cpu", reference=REFERENCE)
    trial_dir = tmp_path / "runs" / "exp" / "trial_0"
    c.step_up()
    save_climbs([c], trial_dir / "checkpoint_000000", {"wall_s": 1.0, "train_s": 1.0})
    c.step_up()
    save_climbs([c], trial_dir / "checkpoint_000001", {"wall_s": 2.0, "train_s": 2.0})
    (trial_dir / "checkpoint_000002" / "seed-0").mkdir(parents=True)  # a copy the crash cut short: no meta
    assert checkpoints_in(str(trial_dir)) == [str(trial_dir / f"checkpoint_00000{i}") for i in (2, 1, 0)]
    config = {"resume_from": str(trial_dir / "checkpoint_000000"), "resume_dir": str(trial_dir),
              "steps_before": c.trained_steps + 5}  # 5 steps past rung 16 when the driver died
    climbs, meta, where = restore(config, TIED, corpus, spec, 1)
    assert where == str(trial_dir / "checkpoint_000001") and climbs[0].rung_losses == c.rung_losses
    assert climbs[0].top == 16 and meta["wall_s"] == 2.0
    assert count_lost(meta, climbs[0].trained_steps, config["steps_before"]) == 5 == meta["lost_steps"]
    assert count_lost(meta, climbs[0].trained_steps + 5, climbs[0].trained_steps) == 5  # nothing more lost
    old = restore({"resume_from": str(trial_dir / "checkpoint_000000")}, TIED, corpus, spec, 1)
    assert old[0][0].top == 8  # a record from before trial directories were kept: its checkpoint only
    assert restore({"resume_dir": str(tmp_path / "gone")}, TIED, corpus, spec, 1) is None  # starts afresh


def _searcher(url: str, target: int = 4) -> tuple[optuna.Study, NpasSearcher]:
    space = npas.load_space(TINY)
    study = optuna.create_study(study_name="s", storage=url, directions=["minimize"] * len(space.objectives),
                                sampler=make_sampler("random", 0, len(space.objectives)), load_if_exists=True)
    searcher = NpasSearcher(study, space, WSD, "fp", target)
    searcher.ladder_objectives = list(space.objectives)
    return study, searcher


def test_a_stopped_trial_hands_its_directory_and_its_steps_to_its_retry(tmp_path):
    study, searcher = _searcher(f"sqlite:///{tmp_path}/s.db")
    number = searcher.suggest("t0")["number"]
    searcher.record_trial_dir("t0", str(tmp_path / "exp" / "trial_0"))  # as Tune starts it
    searcher.on_trial_result("t0", {"val_loss": math.nan, "trained_steps": 23})  # a progress report mid-segment
    running = study.trials[number]
    assert running.user_attrs[TrialAttr.LADDER_DIR] == str(tmp_path / "exp" / "trial_0")
    assert running.user_attrs[TrialAttr.TRAINED_STEPS] == 23  # on record before any rung is reached
    assert str(tmp_path / "exp" / "trial_0") in pending_checkpoints(study) | searcher.recorded_checkpoints()
    searcher.abandon_live("interrupted", "interrupted")  # the driver stops (a crash's recovery does the same)
    again = NpasSearcher(study, npas.load_space(TINY), WSD, "fp", 4)
    config = again.suggest("t1")
    assert config["resume_dir"] == str(tmp_path / "exp" / "trial_0") and config["steps_before"] == 23


def test_the_clean_up_finds_checkpoints_wherever_the_trials_recorded_them(tmp_path):
    """A first driver ran from another working directory and died; this run's storage is elsewhere."""
    study = optuna.create_study(study_name="s", directions=["minimize"])
    elsewhere = tmp_path / "first-driver-cwd" / "trials" / "runs" / "ray" / "s-1700000000"
    done, waiting = elsewhere / "trial_0", elsewhere / "trial_1"
    for d in (done / "checkpoint_000003", waiting / "checkpoint_000001"):
        (d / "seed-0").mkdir(parents=True)
    finished = study.ask()
    finished.set_user_attr(TrialAttr.LADDER_DIR, str(done))
    study.tell(finished, [2.0])
    study.enqueue_trial({}, user_attrs={TrialAttr.LADDER_DIR: str(waiting)})  # a retry will resume from it
    here = tmp_path / "storage"
    unrecorded = here / "s-1700000100" / "trial_9" / "checkpoint_000000"  # reported just as its driver died
    (unrecorded / "seed-0").mkdir(parents=True)
    (here / "other-1700000100" / "trial_0" / "checkpoint_000000").mkdir(parents=True)  # another study's
    removed = sweep(study, str(here), pending_checkpoints(study))
    assert sorted(removed) == sorted([str(done / "checkpoint_000003"), str(unrecorded)])
    assert (waiting / "checkpoint_000001").is_dir() and (here / "other-1700000100" / "trial_0").is_dir()


def test_a_resumed_search_shows_the_studys_finished_trials_and_front(smoke_study):
    study, _ = smoke_study
    space = npas.load_space(TINY)
    searcher = NpasSearcher(study, space, dict(study.user_attrs["recipe"]), "fp", 8)
    done = [t for t in study.trials if t.state == TrialState.COMPLETE and t.user_attrs.get("npas_status") == "ok"]
    p = searcher.progress
    assert p.done == len(done) > 0 and p.front_size == len(study.best_trials) > 0
    assert p.best_loss == min(t.user_attrs[TrialAttr.PROXY]["val_loss"] for t in done)
    assert p.study_counted == len(done) and p.eta() is None  # its own pace is unknown until it finishes one
