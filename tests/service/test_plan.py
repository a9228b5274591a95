"""`SearchPlan`: every check of a search request runs once, before the database or Ray; a study
written before the plan existed still resumes and exports."""

from __future__ import annotations

import shutil
from collections import Counter

import pytest
import yaml

from tests.conftest import FAST, ROOT, TINY, record_launches

BEFORE_PLAN_DB = ROOT / "tests" / "data" / "study_before_plan.db"  # made by main 4afa1c1's `npas search`


def _count(monkeypatch: pytest.MonkeyPatch, calls: Counter, owner: object, name: str) -> None:
    real = getattr(owner, name)

    def counted(*a, **k):
        calls[name] += 1
        return real(*a, **k)

    monkeypatch.setattr(owner, name, counted)


def test_every_check_of_a_search_runs_once(monkeypatch, tmp_path):
    """`npas search` = plan -> start Ray -> run: the recipe, the corpus, its fit, the space's binding,
    the study name, the counts, the storage URL and the cluster address are each checked once (the
    CLI's preflight and the driver each ran most of them before the plan)."""
    from npas.allocation.space import Space
    from npas.presentation.cli import main
    from npas.service.execution import session as runner
    from npas.service.search import driver, launch, plan
    from npas.training import data

    calls: Counter = Counter()
    for owner, name in ((launch, "check_url"), (plan, "check_inputs"), (plan, "check_repeats"),
                        (plan, "study_name_problem"), (plan, "load_recipe"), (plan, "load_corpus"),
                        (data.Corpus, "check_fits"), (Space, "bind")):
        _count(monkeypatch, calls, owner, name)
    monkeypatch.setattr(runner, "check_address_reachable", lambda *a, **k: calls.update(["address"]))
    monkeypatch.setattr(runner, "start_ray_early", lambda address: calls.update(["start_ray"]))
    monkeypatch.setattr(driver, "_prove_ray", lambda p: calls.update(["prove_ray"]) or p.cpus_per_trial)
    seen = record_launches(monkeypatch)
    url = f"sqlite:///{tmp_path}/npas.db"
    assert main(["search", str(TINY), "--recipe", FAST, "--trials", "2", "--study", "once", "--storage", url,
                 "--ray-address", "127.0.0.1:6379", "--repeats", "2"]) == 0
    assert calls == Counter({"check_url": 1, "check_inputs": 1, "check_repeats": 1, "study_name_problem": 1,
                             "load_recipe": 1, "load_corpus": 1, "check_fits": 1, "bind": 1, "address": 1,
                             "start_ray": 1, "prove_ray": 1})
    assert seen["worker"].repeats == 2 and seen["worker"].corpus is None  # a cluster reloads the corpus


def test_a_plan_is_frozen_and_runs_as_given(tmp_path):
    """The Python API builds the same plan; it cannot be changed after its checks ran."""
    import dataclasses

    import npas
    from npas.service.search.plan import DEFAULT_TRIALS, plan_search

    p = plan_search(npas.load_space(TINY), recipe=FAST, study="frozen", storage=f"sqlite:///{tmp_path}/x.db")
    assert (p.target, p.sampler, p.seed, p.repeats, p.early_stop) == (DEFAULT_TRIALS, "tpe", 0, 1, True)
    assert p.space.budget_params > 0 and p.corpus.vocab_size == p.space.reference_chassis.vocab_size
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.trials = 3  # type: ignore[misc]


def test_a_bad_request_is_refused_before_anything_is_written(tmp_path, capsys):
    """One line, exit 2, no database file: the plan refuses before the storage is opened."""
    from npas.presentation.cli import main

    db = tmp_path / "npas.db"
    assert main(["search", str(TINY), "--recipe", FAST, "--study", "bad name/x", "--storage",
                 f"sqlite:///{db}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "study name" in err[0]
    assert not db.exists()


def test_a_study_from_before_the_plan_exports(tmp_path, capsys):
    """The committed study (made by main before this change) exports the allocation it exported then."""
    from npas.presentation.cli import main

    db = tmp_path / "before.db"
    shutil.copy(BEFORE_PLAN_DB, db)
    out = tmp_path / "best.yaml"
    assert main(["export", "before-plan", "--storage", f"sqlite:///{db}", "--out", str(out)]) == 0
    doc = yaml.safe_load(out.read_text())
    assert (doc["trial"], doc["hash"], doc["study"]) == (0, "c540036547780c8f", "before-plan")
    assert "trial 0 (d=20 L=4 U=4 ff=84)" in capsys.readouterr().out


@pytest.mark.slow  # a real resume: Ray and one more proxy run
def test_a_study_from_before_the_plan_resumes(tmp_path, ray_local):
    from npas.presentation.cli import main
    from npas.service.study.storage import open_storage
    from npas.service.study.studies import load

    db = tmp_path / "before.db"
    shutil.copy(BEFORE_PLAN_DB, db)
    url = f"sqlite:///{db}"
    def ran() -> list:
        study = load("before-plan", open_storage(url, read_only=True))
        return [t for t in study.trials if t.user_attrs.get("seed_losses")]

    before = len(ran())
    assert main(["resume", "before-plan", "--storage", url, "--trials", "4", "--workers", "1"]) == 0
    after = ran()
    assert len(after) == before + 1  # one more trial to the new target
    assert all(len(t.user_attrs["seed_losses"]) == 2 for t in after)  # on the stored --repeats 2
    assert main(["export", "before-plan", "--storage", url, "--out", str(tmp_path / "best.yaml")]) == 0
