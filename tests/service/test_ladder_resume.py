"""A ladder search's driver stopped between rungs (Ctrl-C, or killed), then `npas resume`: nothing completed runs again, and
a trial that had reported a rung continues from its checkpoint there, not from step 0 (real processes,
as a user runs them; the study is read back with plain Optuna)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from npas.service.study.record import TrialAttr
from npas.service.study.studies import status
from tests.conftest import ROOT
from tests.service.test_faults import check_final, trials, wait_until

pytestmark = pytest.mark.slow
TINY = str(ROOT / "tests" / "data" / "tiny.yaml")


def npas_run(*args: str, cwd: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this tree's npas, run from a scratch directory
    return subprocess.Popen([sys.executable, "-m", "npas", *args], cwd=cwd, stdout=log.open("w"),
                            stderr=subprocess.STDOUT, env=env, start_new_session=True)


def paused_or_between_rungs(url: str, name: str) -> list[optuna.trial.FrozenTrial]:
    """RUNNING trials that reported a rung and hold a checkpoint there."""
    return [t for t in trials(url, name) if t.state == TrialState.RUNNING
            and t.user_attrs.get(TrialAttr.LADDER_CHECKPOINT) and Path(t.user_attrs[TrialAttr.LADDER_CHECKPOINT]).is_dir()]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_a_ladder_driver_stopped_between_rungs_resumes_from_the_checkpoints(tmp_path, sig):
    import npas
    from npas.allocation.config import ArchConfig
    from npas.service.study.studies import read_record
    from npas.training import climb
    from npas.training.data import load_corpus
    from npas.training.recipe import Recipe, load_recipe

    recipe = {**load_recipe(ROOT / "tests" / "data" / "fast.yaml").to_dict(), "name": "slow-ladder",
              "schedule": "wsd", "steps": 160, "horizon": 160, "rungs": [40, 160], "eval_every": 40}
    path = tmp_path / "slow-ladder.yaml"
    path.write_text(json.dumps(recipe))
    url, name, target = f"sqlite:///{tmp_path}/npas.db", "lad", 6
    proc = npas_run("search", TINY, "--recipe", str(path), "--trials", str(target), "--study", name,
                    "--storage", url, "--workers", "1", "--sampler", "random", cwd=tmp_path, log=tmp_path / "s.log")
    try:
        wait_until(lambda: paused_or_between_rungs(url, name), 240, "a trial holding a rung checkpoint")
    finally:
        if sig == signal.SIGINT:
            proc.send_signal(sig)
        else:  # the driver and everything it started, like a lost machine
            os.killpg(proc.pid, sig)
    assert proc.wait(timeout=120) == (130 if sig == signal.SIGINT else -sig), (tmp_path / "s.log").read_text()
    log = (tmp_path / "s.log").read_text()
    assert "promotion ladder at rungs 40, 160" in log
    before = {t.number: (t.values, t.user_attrs) for t in trials(url, name) if t.state == TrialState.COMPLETE}
    # SIGINT: the driver re-enqueued them itself; SIGKILL: they are left RUNNING, orphans for the resume
    held = {t.number: t.user_attrs[TrialAttr.LADDER_CHECKPOINT] for t in trials(url, name)
            if (status(t) == "interrupted" or t.state == TrialState.RUNNING)
            and t.user_attrs.get(TrialAttr.LADDER_CHECKPOINT)}
    assert held, "the interrupt found no trial between rungs: the resume below would prove nothing"
    assert all(Path(p).is_dir() for p in held.values())  # kept for the resume

    out = subprocess.run([sys.executable, "-m", "npas", "resume", name, "--storage", url, "--workers", "1"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "ladder (rungs 40, 160; eta 4): rung 40 -> 1 of 6 went on" in out.stdout  # floor(6 / 4) = 1
    ts = check_final(url, name, target)  # target reached, nothing left RUNNING, no allocation run twice
    by_number = {t.number: t for t in ts}
    for number, (values, attrs) in before.items():  # completed trials untouched
        assert by_number[number].values == values and by_number[number].user_attrs == attrs
    study = optuna.load_study(study_name=name, storage=url)
    rec = Recipe.from_dict(dict(read_record(study).recipe))
    corpus = load_corpus(None, rec.val_fraction, rec.test_fraction)
    reference = npas.load_space(TINY).bind(vocab_size=corpus.vocab_size).reference_chassis
    for number, ckpt in held.items():
        rerun = [t for t in ts if t.user_attrs.get(TrialAttr.RETRY_OF) == number]
        assert len(rerun) == 1 and rerun[0].state == TrialState.COMPLETE
        t = rerun[0]
        assert t.user_attrs[TrialAttr.PROXY]["resumed_at"][0] == 40  # from the checkpoint at rung 40, not step 0
        assert not Path(ckpt).exists()  # the old checkpoint is gone once the trial resumed
        top = t.user_attrs[TrialAttr.FIDELITY]
        straight = climb.start(ArchConfig.from_dict(t.user_attrs[TrialAttr.ALLOC]), rec, corpus, device="cpu",
                               reference=reference)
        straight.climb(until=top)
        # no step trained twice, and the steps the first attempt trained past its checkpoint are counted
        lost = t.user_attrs.get(TrialAttr.LOST_STEPS, 0)
        assert t.user_attrs[TrialAttr.TRAINED_STEPS] == straight.trained_steps + lost and lost >= 0
        assert t.values[0] == straight.rung_losses[top]  # bitwise, across two drivers
    assert not list((tmp_path / "trials").rglob("checkpoint_*")), "checkpoints left after the resumed search"


def test_steps_a_killed_driver_trained_past_the_last_rung_are_counted_by_the_retry(tmp_path):
    """kill -9 while the promoted trial climbs a long segment (1,160 steps from rung 40): its progress
    report is on record, the resume restarts it from rung 40 and counts the lost steps in trained_steps."""
    import npas
    from npas.allocation.config import ArchConfig
    from npas.service.execution.climber import PROGRESS_EVERY_S
    from npas.training import climb
    from npas.training.data import load_corpus
    from npas.training.recipe import Recipe, load_recipe

    recipe = {**load_recipe(ROOT / "tests" / "data" / "fast.yaml").to_dict(), "name": "long-ladder",
              "schedule": "wsd", "steps": 1200, "horizon": 1200, "rungs": [40, 1200], "eval_every": 40}
    path = tmp_path / "long-ladder.yaml"
    path.write_text(json.dumps(recipe))
    url, name = f"sqlite:///{tmp_path}/npas.db", "lost"
    proc = npas_run("search", TINY, "--recipe", str(path), "--trials", "4", "--study", name, "--storage", url,
                    "--workers", "1", "--sampler", "random", cwd=tmp_path, log=tmp_path / "s.log")

    def climbing_past_40() -> list:  # a RUNNING trial whose last progress report lies past its rung-40 steps
        return [t for t in trials(url, name) if t.state == TrialState.RUNNING
                and t.user_attrs.get(TrialAttr.TRAINED_STEPS, 0) > 60]

    try:
        wait_until(climbing_past_40, 240 + 2 * PROGRESS_EVERY_S, "a trial reporting its steps past rung 40")
        (victim,) = climbing_past_40()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    reported = victim.user_attrs[TrialAttr.TRAINED_STEPS]
    out = subprocess.run([sys.executable, "-m", "npas", "resume", name, "--storage", url, "--workers", "1"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=900,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stdout + out.stderr
    (retry,) = [t for t in trials(url, name) if t.user_attrs.get(TrialAttr.RETRY_OF) == victim.number]
    assert retry.state == TrialState.COMPLETE and retry.user_attrs[TrialAttr.PROXY]["resumed_at"] == [40]
    rec = Recipe.from_dict(recipe)
    corpus = load_corpus(None, rec.val_fraction, rec.test_fraction)
    reference = npas.load_space(TINY).bind(vocab_size=corpus.vocab_size).reference_chassis
    cfg = ArchConfig.from_dict(retry.user_attrs[TrialAttr.ALLOC])
    to_40 = climb.start(cfg, rec, corpus, device="cpu", reference=reference)
    to_40.climb(until=40)
    lost = retry.user_attrs[TrialAttr.LOST_STEPS]
    assert lost == reported - to_40.trained_steps > 0  # what the killed attempt trained past its checkpoint
    top = retry.user_attrs[TrialAttr.FIDELITY]
    straight = climb.start(cfg, rec, corpus, device="cpu", reference=reference)
    straight.climb(until=top)
    assert retry.user_attrs[TrialAttr.TRAINED_STEPS] == straight.trained_steps + lost
    assert retry.values[0] == straight.rung_losses[top]  # still bitwise: the lost steps were retrained
