"""Two `npas search` drivers on one PostgreSQL study under the promotion ladder, at the same time: each
reads the other's rung results before deciding (npas.service.search.rung_exchange), every trial is
told once, and the front holds only trials that reached T. The decisions themselves are checked one
by one in tests/service/test_rung_exchange.py; this runs the real thing end to end."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import optuna
import pytest
from optuna.trial import TrialState

from npas.service.study.record import TrialAttr
from npas.service.study.storage import reachable
from npas.service.study.studies import front_trials
from tests.conftest import ROOT, needs
from tests.service.test_ladder_search import TINY, wsd_recipe

PG_URL = os.environ.get("NPAS_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
NEEDS_PG = needs(reachable(PG_URL), f"no PostgreSQL server at {PG_URL}")


@pytest.mark.slow
@NEEDS_PG
def test_two_ladder_drivers_share_their_rungs_on_one_postgresql_study(tmp_path):
    name = f"ladder2-{uuid.uuid4().hex[:8]}"
    recipe = wsd_recipe(tmp_path)
    argv = [sys.executable, "-m", "npas", "-v", "search", str(TINY), "--recipe", recipe, "--trials", "12",
            "--study", name, "--storage", PG_URL, "--workers", "1", "--sampler", "random"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    first = subprocess.Popen([*argv, "--seed", "1"], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                             stderr=logs[0].open("w"))
    deadline = time.time() + 120
    while time.time() < deadline:  # the second driver joins the study the first created
        if name in {s.study_name for s in optuna.get_all_study_summaries(PG_URL)}:
            break
        time.sleep(1)
    second = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=logs[1].open("w"))
    try:
        codes = [first.wait(timeout=900), second.wait(timeout=900)]
    finally:
        for p in (first, second):
            if p.poll() is None:
                p.kill()
    text = [log.read_text() for log in logs]
    assert codes == [0, 0], "\n".join(t[-3000:] for t in text)
    study = optuna.load_study(study_name=name, storage=PG_URL)
    told = [t for t in study.trials if t.state == TrialState.COMPLETE and TrialAttr.RUNG_LOSSES in t.user_attrs]
    assert len(told) >= 12 and not [t for t in study.trials if t.state == TrialState.RUNNING]
    drivers = {t.user_attrs[TrialAttr.DRIVER]["pid"] for t in told}
    assert len(drivers) == 2, drivers  # both drivers trained trials
    assert any("rung exchange: merged the rung results" in t for t in text), "no driver read the other's rungs"
    assert all(TrialAttr.LADDER in t.user_attrs for t in told)
    front = front_trials(study)
    assert front and all(t.user_attrs[TrialAttr.FIDELITY] == 40 for t in front)
