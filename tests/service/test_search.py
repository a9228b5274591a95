"""The search service end to end: real Ray (num_cpus=2), real SQLite, the real PostgreSQL server."""

from __future__ import annotations

import logging
import math
import os
import re
import subprocess
import sys
import uuid

import optuna
import pytest
from optuna.trial import TrialState

import npas
from npas.allocation.budget import count
from npas.allocation.config import ArchConfig
from npas.errors import StudyError
from npas.service.export.exporter import export, write_export
from npas.service.export.picks import pick
from npas.service.search.driver import resume, search
from npas.service.search.launch import Launch
from npas.service.study.record import Constraint, StudyAttr, TrialAttr
from npas.service.study.storage import reachable
from npas.service.study.studies import counts_toward_target, front_trials, status
from tests.conftest import ROOT, needs, record_launches

TINY = ROOT / "tests" / "data" / "tiny.yaml"
FAST = str(ROOT / "tests" / "data" / "fast.yaml")
PG_URL = os.environ.get("NPAS_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")

NEEDS_PG = needs(reachable(PG_URL), f"no PostgreSQL server at {PG_URL}")  # probed once, at collection

STORAGES = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql", id="postgresql", marks=[NEEDS_PG, pytest.mark.slow]),  # the slow tier: a real server
]


def storage_url(kind: str, tmp_path) -> str:
    return f"sqlite:///{tmp_path}/npas.db" if kind == "sqlite" else PG_URL


@pytest.mark.parametrize("kind", STORAGES)
def test_search_persists_every_trial_and_plain_optuna_reads_the_front(kind, ray_local, tmp_path):
    url = storage_url(kind, tmp_path)
    name = f"t-{uuid.uuid4().hex[:8]}"
    search(npas.load_space(TINY), trials=4, study=name, storage=url, recipe=FAST, launch=Launch(workers=2))
    plain = optuna.load_study(study_name=name, storage=url)  # no npas involved in reading it back
    counted = [t for t in plain.trials if counts_toward_target(t)]
    assert len(counted) == 4
    assert all(t.state != TrialState.RUNNING for t in plain.trials)
    assert plain.metric_names == ["val_loss", "train_memory_bytes"]
    assert plain.best_trials, "the front is empty"
    for t in plain.best_trials:
        assert t.user_attrs[TrialAttr.FIDELITY] == t.user_attrs[TrialAttr.MAX_FIDELITY] == 40
    assert plain.user_attrs[StudyAttr.SPACE_TEXT] == TINY.read_text()


def test_front_is_feasible_full_fidelity_and_within_budget(smoke_study):
    st, _ = smoke_study
    budget = st.user_attrs[StudyAttr.BUDGET]
    front = front_trials(st)
    assert front
    for t in front:
        cfg = ArchConfig.from_dict(t.user_attrs[TrialAttr.ALLOC])
        assert count(cfg).stored_params <= budget
        assert t.constraints[Constraint.BUDGET] <= 0 and t.constraints.get(Constraint.FIDELITY, 0) <= 0
        assert math.isfinite(t.values[0]) and t.values[0] < math.log(68)
    # the front is non-dominated
    for a in front:
        assert not any(all(x <= y for x, y in zip(b.values, a.values, strict=True)) and b.values != a.values
                       for b in front)


def test_baselines_are_present_and_marked(smoke_study):
    st, _ = smoke_study
    marked = {t.user_attrs.get(TrialAttr.BASELINE): t for t in st.trials if t.user_attrs.get(TrialAttr.BASELINE)}
    assert set(marked) == {"narrow_untied", "full_tying", "cycle_tying"}
    assert marked["full_tying"].user_attrs[TrialAttr.ALLOC]["block_of_layer"] == [0, 0, 0, 0]
    assert min(t.number for t in marked.values()) == 0  # enqueued before the sampler's own trials


def test_export_build_count_matches_the_trial(smoke_study, tmp_path):
    st, _ = smoke_study
    for how in ("knee", "min-loss"):
        cfg = export(st, how)
        trial = pick(st, how)
        out = tmp_path / f"{how}.yaml"
        write_export(st, out, how)
        again = ArchConfig.from_yaml(out.read_text())
        assert again == cfg and again.hash == trial.user_attrs[TrialAttr.HASH]
        model = npas.build_model(again)
        assert model.num_params() == trial.user_attrs[TrialAttr.ACCOUNTING]["stored_params"]


def test_failed_trials_are_recorded_and_the_study_goes_on(ray_local, tmp_path):
    diverge = tmp_path / "diverge.yaml"
    diverge.write_text((ROOT / "tests" / "data" / "fast.yaml").read_text().replace("lr: 1.0e-2", "lr: 1.0e+6")
                       .replace("min_lr: 1.0e-3", "min_lr: 1.0e+5"))
    st = search(npas.load_space(TINY), trials=3, study="nan", storage=f"sqlite:///{tmp_path}/n.db",
                recipe=str(diverge), launch=Launch(workers=2, early_stop=False))
    failed = [t for t in st.trials if status(t) == "failed"]
    assert len(failed) == 3
    assert all(t.user_attrs[TrialAttr.REASON].startswith("non-finite loss") for t in failed)


def npas_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "npas", *args], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env={**os.environ, **(env or {})})


@pytest.mark.slow  # `npas` subprocesses or several real searches
def test_cli_front_studies_export(smoke_study, tmp_path):
    _, url = smoke_study
    out = npas_cli("front", "smoke", "--storage", url, "--format", "csv")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0].startswith("trial,val_loss,train_memory_bytes")
    out = npas_cli("studies", "--storage", url)
    assert "smoke" in out.stdout and "trials" in out.stdout
    out = npas_cli("export", "smoke", "--storage", url, "--pick", "min-loss", "--out", str(tmp_path / "b.yaml"))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "b.yaml").exists()


@pytest.mark.slow  # `npas` subprocesses or several real searches
@pytest.mark.parametrize("args, fragment", [
    (["front", "nope", "--storage", "sqlite:///{tmp}/x.db"], "no database at"),  # read-only: creates nothing
    (["studies", "--storage", "sqlite:///{tmp}/typo/x.db"], "no database at"),
    (["export", "nope", "--out", "{tmp}/b.yaml", "--storage", "sqlite:///{tmp}/x.db"], "no database at"),
    (["studies", "--storage", "postgresql+psycopg://npas@127.0.0.1:1/db?password=s3cr3t&sslpassword=s3cr3t"],
     "cannot open storage"),
    (["studies", "--storage", "postgresql+psycopg://npas:s3cr3t@127.0.0.1:1/db"], "cannot open storage"),
    (["studies", "--storage", "mongodb://h/db"], "unknown storage backend 'mongodb'"),
    (["search", "search_spaces/nope.yaml", "--storage", "sqlite:///{tmp}/x.db"], "no such file"),
    (["search", str(TINY), "--ray-address", "127.0.0.1:1", "--storage", "sqlite:///{tmp}/x.db"],
     "cannot reach Ray at '127.0.0.1:1'"),
    (["search", str(TINY), "--budget", "1000", "--storage", "sqlite:///{tmp}/x.db"],
     "not more than the 4,256 the embeddings alone need"),  # a --budget override is checked like the file's
    (["search", str(TINY), "--checkpoint-storage", "ftp://h/x", "--storage", "sqlite:///{tmp}/x.db"],
     "ftp:// is not a storage Ray Tune reads"),
])
def test_cli_errors_are_one_line_exit_2_and_write_nothing(args, fragment, tmp_path):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    out = npas_cli(*args)
    assert out.returncode == 2, out.stderr
    assert fragment in out.stderr
    assert "s3cr3t" not in out.stderr + out.stdout  # passwords are never printed
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.db").exists() and not (tmp_path / "typo").exists()


@pytest.mark.slow  # `npas` subprocesses or several real searches
def test_cli_search_refreshes_the_dashboard_and_prints_the_front(tmp_path):
    url = f"sqlite:///{tmp_path}/d.db"
    out = npas_cli("search", str(TINY), "--recipe", FAST, "--trials", "2", "--study", "dash", "--storage", url,
                   "--dashboard", str(tmp_path / "report"))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Pareto front of study dash" in out.stdout
    page = (tmp_path / "report" / "index.html").read_text()
    assert "dash" in page and "<img" in page


@pytest.mark.slow  # an `npas` subprocess
def test_front_of_an_unknown_study_lists_what_is_there(smoke_study):
    _, url = smoke_study
    out = npas_cli("front", "nope", "--storage", url)
    assert out.returncode == 2 and "no study 'nope'" in out.stderr and "smoke" in out.stderr


@pytest.mark.slow  # `npas` subprocesses or several real searches
def test_the_final_line_never_shows_a_secret_of_the_url(ray_local, tmp_path):
    """SQLite ignores the query string, so a password there reaches every message that shows the URL."""
    url = f"sqlite:///{tmp_path}/q.db?password=s3cr3t&auth_token=t0k3n"
    out = npas_cli("search", str(TINY), "--recipe", FAST, "--trials", "1", "--study", "q", "--storage", url,
                   "--no-early-stop")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "study q in sqlite:///" in out.stdout
    assert "s3cr3t" not in out.stdout + out.stderr and "t0k3n" not in out.stdout + out.stderr


@pytest.mark.slow  # `npas` subprocesses or several real searches
def test_a_joiner_keeps_the_study_settings_or_is_refused(ray_local, tmp_path, caplog):
    """The stored settings are the truth: a second `search --study` matches them or is refused, and
    the trial target is the study's unless --trials sets it (which is logged)."""
    url, space = f"sqlite:///{tmp_path}/j.db", npas.load_space(TINY)
    search(space, trials=2, study="j", storage=url, recipe=FAST, sampler="random", seed=5,
           launch=Launch(workers=2, early_stop=False))

    def counted() -> int:
        return sum(counts_toward_target(t) for t in optuna.load_study(study_name="j", storage=url).trials)

    n_trials = len(optuna.load_study(study_name="j", storage=url).trials)
    for kwargs, fragment in (({"sampler": "tpe", "recipe": FAST}, "--sampler 'tpe' (the study's is 'random')"),
                             ({"seed": 6}, "--seed 6 (the study's is 5)"),
                             ({"recipe": "smoke"}, "--recipe 'smoke' (the study's is 'fast')")):
        with pytest.raises(StudyError, match=re.escape(fragment)):
            search(space, study="j", storage=url, **{"recipe": FAST, **kwargs}, launch=Launch(workers=2))
    plain = optuna.load_study(study_name="j", storage=url)
    assert len(plain.trials) == n_trials and plain.user_attrs[StudyAttr.TARGET] == 2  # refused: nothing written

    search(space, study="j", storage=url, recipe=FAST, launch=Launch(workers=2))  # no --trials: the study's 2
    assert counted() == 2 and optuna.load_study(study_name="j", storage=url).user_attrs[StudyAttr.TARGET] == 2

    with caplog.at_level(logging.WARNING, logger="npas.service.search.driver"):
        search(space, trials=3, study="j", storage=url, launch=Launch(workers=2))
    assert "trial target set to 3 (was 2)" in caplog.text
    assert counted() == 3 and optuna.load_study(study_name="j", storage=url).user_attrs[StudyAttr.TARGET] == 3


def test_resume_keeps_the_stored_early_stop_setting(ray_local, tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path}/e.db"
    search(npas.load_space(TINY), trials=1, study="e", storage=url, recipe=FAST,
           launch=Launch(workers=1, early_stop=False))
    seen = record_launches(monkeypatch)
    resume("e", storage=url, trials=2, launch=Launch(workers=1))
    assert seen["early_stop"] is False  # the study was created with --no-early-stop
    with pytest.raises(StudyError, match="runs with --no-early-stop"):
        resume("e", storage=url, launch=Launch(workers=1, early_stop=True))
