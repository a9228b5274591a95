"""experiments/located_rate.py's held-candidate rows (item 4 on the 8 held, from the hold runs alone): truth at
each one's best rate is the lowest of its holds, truth at the fair rate its x1 hold, and Delta tau
compares the rung-T/4 score at the located factor with the score at x1 against the first."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from experiments import located_rate as lr


def _bench(grids: dict[str, dict[float, float]], holds: dict[str, dict[float, float]]) -> SimpleNamespace:
    cands = [SimpleNamespace(name=n) for n in grids]

    def record(job: lr.Job) -> dict | None:
        v = holds.get(job.cand.name, {}).get(job.factor)
        return None if v is None else {"status": "ok", "test_loss": v}

    return SimpleNamespace(cands=cands, held=list(grids), rung=400, record=record)


@pytest.mark.slow  # reads the committed located_rate and proxy_fidelity caches
def test_held_rows_read_truth_at_best_and_fair_rate(capsys):
    # a, b, c, d: the x1 score orders them d < c < b < a, the located score a < b < c < d, and at T their
    # best rates order them a < b < c < d: the located score is right, x1 reversed (Delta tau = +2)
    grids = {"a": {0.5: 2.2, 1.0: 2.04, 2.0: 1.80, 4.0: 2.3},
             "b": {0.5: 2.2, 1.0: 2.03, 2.0: 1.85, 4.0: 2.3},
             "c": {0.25: 2.0, 0.5: 1.86, 1.0: 1.90, 2.0: 2.10},
             "d": {0.25: 2.0, 0.5: 1.87, 1.0: 1.89, 2.0: 2.10},
             "e": {0.5: 2.2, 1.0: 2.10, 2.0: 2.00, 4.0: 1.95, 8.0: 2.5}}  # located x4: no x1 hold, left out
    holds = {"a": {1.0: 1.60, 2.0: 1.40, 4.0: 1.45}, "b": {1.0: 1.58, 2.0: 1.45, 4.0: 1.50},
             "c": {0.25: 1.56, 0.5: 1.47, 1.0: 1.50}, "d": {0.25: 1.57, 0.5: 1.48, 1.0: 1.55},
             "e": {2.0: 1.40, 4.0: 1.30, 8.0: 1.35}}
    rows = lr.held_at_best(_bench(grids, holds), grids)
    out = capsys.readouterr().out
    assert rows is not None and rows["n"] == 4, out
    assert "4 of 5 complete" in out
    assert rows["located_vs_truth_best"]["tau"] == pytest.approx(1.0)
    assert rows["fair_vs_truth_best"]["tau"] == pytest.approx(-1.0)
    assert rows["delta"]["delta"] == pytest.approx(2.0)
    assert rows["delta"]["verdict"] == "INCOMPLETE"  # e has no x1 hold: 4 of the 5 held
    # truth at x1 orders them c < d < b < a (1.50, 1.55, 1.58, 1.60): 1 of 6 pairs as at the best rates
    assert rows["fair_vs_best_at_T"]["tau"] == pytest.approx(-2 / 3)


def test_held_rows_need_three_complete_candidates(capsys):
    grids = {"a": {0.5: 2.2, 1.0: 2.0, 2.0: 2.1}, "b": {0.5: 2.2, 1.0: 2.0, 2.0: 2.1}}
    holds = {"a": {0.5: 1.6, 1.0: 1.5, 2.0: 1.55}, "b": {0.5: 1.6, 1.0: 1.5}}  # b lacks its 2f hold
    assert lr.held_at_best(_bench(grids, holds), grids) is None
    assert "1 of 2 complete" in capsys.readouterr().out
