"""The golden numerics (npas.conversion.numerics): this code's trainings give the recorded values, and the
comparison tells another machine's rounding from a change of the numerics."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

from npas.conversion import numerics
from npas.training import proxy
from npas.training.data import load_corpus
from npas.training.recipe import Recipe

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "numerics_golden.json"


@pytest.fixture(scope="module")
def recorded() -> dict:
    return json.loads(GOLDEN.read_text())


@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


def test_the_golden_runs_give_the_recorded_values(recorded, corpus):
    """Every golden training re-run here: a change that moves them must bump NUMERICS_VERSION (every bench
    cache is keyed by it) and re-record the file; the message says both."""
    measured = numerics.measure(corpus)
    assert set(measured["runs"]) == set(numerics.golden_names()) and len(measured["runs"]) >= 10
    problem = numerics.check(recorded, measured)
    assert problem is None, problem


def _subset(values: dict, names: list[str]) -> dict:
    return {**values, "runs": {k: v for k, v in values["runs"].items() if k in names}}


def _scaled(values: dict, rel: float, where=lambda path: True) -> dict:
    """A copy with the numbers at the paths `where` accepts (a path's first elements: group, run...) moved by `rel`."""
    out = copy.deepcopy(values)

    def walk(v, path):
        if isinstance(v, dict):
            return {k: walk(x, (*path, k)) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x, (*path, i)) for i, x in enumerate(v)]
        return v * (1 + rel) if isinstance(v, float) and where(path) else v

    return walk(out, ())


def test_a_moved_value_names_the_constant_to_bump_and_the_command_that_re_records(recorded):
    moved = _scaled(recorded, 1e-4, lambda p: p[:4] == ("runs", "banks", "losses", "val"))
    problem = numerics.check(recorded, moved)
    assert problem is not None and "runs.banks.losses" in problem
    assert "bump NUMERICS_VERSION in npas/conversion/numerics.py" in problem
    assert numerics.RECORD_COMMAND in problem and "tests/data/numerics_golden.json" in numerics.RECORD_COMMAND
    older = {**recorded, "numerics_version": numerics.NUMERICS_VERSION - 1}
    assert "re-record" in numerics.check(older, recorded)


def _moments(values: dict, run: str) -> list[tuple]:
    name = "tensors" if "tensors" in values["runs"][run] else "model"
    tensors = values["runs"][run][name]
    return [("runs", run, name, k) for k in tensors] if isinstance(tensors, dict) else [("runs", run, name)]


def test_another_machines_rounding_matches(recorded):
    """Measured between an AMD and an Intel host (2-step trainings): every value within ~1e-7, a few
    moments (Adam's sign flips) off by up to 4.1e-5. Here: every number x (1 + 1e-7), and in every
    run with per-tensor moments one tensor's three moments by 4.1e-5 (at most 1% of them may be)."""
    elsewhere = _scaled(recorded, 1e-7)
    for run, values in recorded["runs"].items():
        if "tensors" in values:
            first = sorted(values["tensors"])[0]
            n = sum(len(v) for v in values["tensors"].values())
            assert 3 <= math.ceil(numerics.OUTLIER_FRACTION * n) * 3  # a tensor's 3 moments fit the allowance
            elsewhere["runs"][run]["tensors"][first][0] *= 1 + 4.1e-5
    assert numerics.mismatch(recorded, elsewhere) is None


def test_many_moment_outliers_one_large_one_or_a_loss_beyond_rtol_do_not_match(recorded):
    tensors = recorded["runs"]["tied-lora"]["tensors"]
    many = copy.deepcopy(recorded)
    for name in sorted(tensors)[:max(2, len(tensors) // 10)]:  # ~10% of one run's tensors
        many["runs"]["tied-lora"]["tensors"][name] = [x * (1 + 4.1e-5) for x in tensors[name]]
    assert "runs.tied-lora.moments" in numerics.mismatch(recorded, many)
    large = copy.deepcopy(recorded)
    large["runs"]["atoms"]["tensors"][sorted(tensors)[0]][1] *= 1 + 5 * numerics.RTOL_MAX
    assert "runs.atoms.moments" in numerics.mismatch(recorded, large)
    one_loss = _scaled(recorded, 2 * numerics.RTOL, lambda p: p[:4] == ("runs", "cosine-smoke", "losses", "test"))
    assert "runs.cosine-smoke.losses" in numerics.mismatch(recorded, one_loss)
    missing = copy.deepcopy(recorded)
    del missing["runs"]["experts-wsd"]
    assert "runs.experts-wsd" in numerics.mismatch(recorded, missing)


@pytest.mark.parametrize("factor", [1.5, 1.001])  # x1.001: 41% of a 2-step probe's values moved beyond 1e-5
def test_a_changed_parameterization_rule_moves_the_short_runs(recorded, corpus, monkeypatch, factor):
    names = ["tied-lora", "experts-wsd"]
    assert numerics.mismatch(_subset(recorded, names), numerics.measure(corpus, names)) is None
    real = proxy.optimizer_groups

    def scaled(*a, **k):  # one parameterization rule's rate multiplier changed (the first group's)
        groups = real(*a, **k)
        groups[0]["lr_mult"] *= factor
        return groups

    monkeypatch.setattr(proxy, "optimizer_groups", scaled)
    moved = numerics.mismatch(_subset(recorded, names), numerics.measure(corpus, names))
    assert moved is not None and "runs.tied-lora" in moved and "runs.experts-wsd" in moved


def test_a_schedule_edit_past_the_trained_lengths_moves_the_schedules(recorded, corpus, monkeypatch):
    real = Recipe.lr_at
    monkeypatch.setattr(Recipe, "lr_at", lambda self, s, length=None: real(self, s, length)
                        * (0.5 if s == (length or self.steps) - 1 and s > 1000 else 1.0))
    moved = numerics.mismatch(_subset(recorded, []), numerics.measure(corpus, []))
    assert moved is not None and moved.startswith("schedules:")


@pytest.mark.slow
def test_a_change_acting_only_in_the_last_steps_moves_the_full_length_runs(recorded, corpus, monkeypatch):
    """A 2-step probe is blind past its steps; the golden runs to the smoke recipes' 200 steps are not:
    the last 5% of every run at half its rate moves both schedules' full-length runs."""
    real = Recipe.lr_at
    monkeypatch.setattr(Recipe, "lr_at", lambda self, s, length=None: real(self, s, length)
                        * (0.5 if s >= 0.95 * (length or self.steps) else 1.0))
    names = ["cosine-smoke", "wsd-smoke"]
    moved = numerics.mismatch(_subset(recorded, names), {**numerics.measure(corpus, names),
                                                          "schedules": recorded["schedules"]})
    assert moved is not None and "runs.cosine-smoke.losses" in moved and "runs.wsd-smoke.losses" in moved


def test_record_refuses_other_values_for_the_same_version(recorded, tmp_path, monkeypatch, capsys):
    """A change of the numerics is a new version, never a quiet rewrite of the old one's values."""
    path = tmp_path / "golden.json"
    monkeypatch.setattr(numerics, "measure", lambda corpus=None, only=None: copy.deepcopy(recorded))
    path.write_text(json.dumps(_scaled(recorded, 1e-3)))
    before = path.read_text()
    assert numerics.main(["record", str(path)]) == 2
    assert path.read_text() == before and "bump NUMERICS_VERSION" in capsys.readouterr().err
    assert numerics.main(["check", str(path)]) == 1
    path.write_text(json.dumps({**recorded, "numerics_version": numerics.NUMERICS_VERSION - 1}))
    assert numerics.main(["record", str(path)]) == 0
    assert numerics.mismatch(recorded, json.loads(path.read_text())) is None
    assert numerics.main(["check", str(tmp_path / "absent.json")]) == 2
