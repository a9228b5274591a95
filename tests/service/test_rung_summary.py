"""The rung-to-rung certificate read back from a study's trials (issue #34 item 5): Kendall tau with its
interval and n between consecutive rungs over the trials promoted between them, suppressed below 10,
and the rank flips among them; `npas front` prints it with how many trials reached T and each front
trial's located lr_factor, and `rungs.record` stores it on the study for plain-Optuna readers."""

from __future__ import annotations

import optuna
from scipy import stats

from npas.presentation.cli import main
from npas.service.study import rungs, studies
from npas.service.study.ladder import MIN_TAU_PAIRS
from tests import rung_study as R


def test_tau_flips_and_n_between_rungs_from_the_stored_losses(tmp_path):
    study = R.make(f"sqlite:///{tmp_path}/npas.db")
    s = rungs.summary(study)
    assert (s.top, s.reached, s.trials, s.running) == (R.T, 4, R.N, 0)
    low, high = s.agreements
    assert (low.rung, low.next_rung, low.n, low.flips, low.pairs) == (10, 40, 12, 2, 66)
    x = [R.losses(i)[10] for i in R.ORDER_40]
    y = [R.losses(i)[40] for i in R.ORDER_40]
    assert low.tau.value == stats.kendalltau(x, y).statistic
    assert abs(low.tau.value - (66 - 2 * 2) / 66) < 1e-12
    assert low.tau.low is not None and low.tau.low <= low.tau.value <= low.tau.high <= 1.0 and low.tau.n == 12
    assert (high.rung, high.next_rung, high.n, high.flips, high.pairs) == (40, R.T, 4, 1, 6)
    assert high.n < MIN_TAU_PAIRS and high.tau is None  # four pairs of losses: not shown


def test_npas_front_prints_the_rungs_the_front_and_its_located_rates(tmp_path, capsys):
    url = f"sqlite:///{tmp_path}/npas.db"
    R.make(url)
    assert main(["front", "ladder", "--storage", url]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "Pareto front of study ladder (2 trials):"  # 1 dominates 0, 3 dominates 2
    header, *rows = out[1:4]
    assert "lr_factor" in header.split()
    assert [(r.split()[0], [w for w in r.split() if w.startswith("×")]) for r in rows] == [("1", ["×0.5"]),
                                                                                          ("3", ["×4"])]
    assert "front read at the top rung: 4 of 16 trials reached T = 160 steps" in out
    tau = (66 - 4) / 66
    line = next(ln for ln in out if ln.startswith("rung 10 -> 40:"))
    assert f"Kendall tau {tau:.2f} [" in line and "n=12 promoted trials" in line and "2 of 66 pairs" in line
    line = next(ln for ln in out if ln.startswith("rung 40 -> 160:"))
    assert "4 trial(s) with a loss at both (Kendall tau shown from 10)" in line and "1 of 6 pairs" in line

    assert main(["front", "ladder", "--storage", url, "--format", "csv"]) == 0
    csv = capsys.readouterr().out.splitlines()
    assert csv[0].split(",")[:6] == ["trial", "val_loss", "train_memory_bytes", "loss_std", "seeds", "lr_factor"]
    assert [ln.split(",")[5] for ln in csv[1:]] == ["0.5", "4.0"]  # raw numbers for machines


def test_record_stores_the_summary_on_the_study(tmp_path):
    url = f"sqlite:///{tmp_path}/npas.db"
    R.make(url)
    rungs.record(optuna.load_study(study_name="ladder", storage=url))
    stored = optuna.load_study(study_name="ladder", storage=url).user_attrs[rungs.RUNG_AGREEMENT_ATTR]
    assert stored["top"] == R.T and stored["reached"] == 4 and stored["min_pairs"] == MIN_TAU_PAIRS
    low, high = stored["agreements"]
    assert low["n"] == 12 and low["flips"] == 2 and abs(low["kendall_tau"]["value"] - 62 / 66) < 1e-12
    assert high["kendall_tau"] is None and high["flips"] == 1


def test_a_study_without_rung_losses_has_no_agreement_and_no_rate_column(smoke_study, capsys):
    study, url = smoke_study
    s = rungs.summary(study)
    assert s.agreements == () and (s.reached, s.trials) == (6, 6)
    assert "lr_factor" not in studies.front_frame(study).columns
    assert main(["front", "smoke", "--storage", url]) == 0
    out = capsys.readouterr().out
    assert "6 of 6 trials reached T = 40 steps" in out and "rung " not in out.split("reached T")[1]


def test_record_stores_the_summary_on_a_study_with_rungs_and_leaves_one_without_alone(tmp_path, smoke_study):
    """The searcher of a ladder search calls `record` after every told trial (the API's searches too:
    tests/service/test_ladder_search.py); a study without rungs (a cosine recipe) is left as it was."""
    url = f"sqlite:///{tmp_path}/npas.db"
    R.make(url)
    rungs.record(optuna.load_study(study_name="ladder", storage=url))
    assert optuna.load_study(study_name="ladder", storage=url).user_attrs[rungs.RUNG_AGREEMENT_ATTR]["reached"] == 4
    smoke = rungs.record(smoke_study[0])  # read-only in effect: nothing to certify, nothing written
    assert smoke.agreements == () and rungs.RUNG_AGREEMENT_ATTR not in smoke_study[0].user_attrs
