"""The dashboard's rung panel and located rates (issues #34 item 4, #35 item 1): loss at each rung per
trial, promotions drawn as lines from rung to rung, the front at T marked with its lr factor, the
rung-to-rung tau in the header and caption, and an `lr factor` column in the trials table."""

from __future__ import annotations

import json
import re

import pytest

from npas.presentation.dashboard import write_report
from npas.presentation.dashboard.rungs import render_rungs, rungs_info
from npas.service.study import rungs
from tests import rung_study as R
from tests.presentation.test_dashboard import needs_chromium, selfcheck


@pytest.fixture(scope="module")
def ladder(tmp_path_factory):
    return R.make(f"sqlite:///{tmp_path_factory.mktemp('ladder')}/npas.db")


def test_rungs_info_has_each_trials_losses_and_its_promotions(ladder):
    info = rungs_info(ladder)
    assert info.rungs == R.RUNGS and info.top == R.T
    assert [ln.number for ln in info.lines] == list(range(R.N))
    assert all(dict(ln.points) == R.losses(ln.number) for ln in info.lines)
    assert info.promotions == len(R.ORDER_40) + len(R.ORDER_T)  # 10->40 for 12 trials, 40->160 for 4
    assert {ln.number for ln in info.lines if ln.on_front} == {1, 3}
    assert {ln.number: ln.lr_factor for ln in info.lines if ln.on_front} == {1: 0.5, 3: 4.0}
    assert info.reached == "4 of 16 trials reached T = 160 steps"
    assert list(info.agreement) == rungs.summary(ladder).agreement_lines()


def test_the_figure_draws_one_line_per_promoted_trial(ladder):
    fig = render_rungs(rungs_info(ladder))
    ax = fig.axes[0]
    drawn = [tuple(line.get_xdata()) for line in ax.lines]
    assert len(drawn) == len(R.ORDER_40)  # a trial promoted once or twice is one polyline through its rungs
    assert sorted(drawn) == sorted([(10, 40, 160)] * 4 + [(10, 40)] * 8)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["10", "40", "160 = T"]
    assert {t.get_text() for t in ax.texts} == {"#1 (lr ×0.5)", "#3 (lr ×4)"}


def test_the_page_has_the_rung_panel_header_and_lr_factor_column(ladder, tmp_path):
    text = write_report(ladder, tmp_path).read_text(encoding="utf-8")
    section = re.search(r'<section id="rungs">(.*?)</section>', text, re.S).group(1)
    assert '<img src="data:image/png;base64,' in section and "Kendall tau 0.94 [" in section
    header = re.search(r'<p class="meta" id="rung-summary">(.*?)</p>', text, re.S).group(1)
    assert "4 of 16 trials reached T = 160 steps" in header and "rung 10 -&gt; 40: Kendall tau 0.94" in header
    assert "rung 40 -&gt; 160: 4 trial(s) with a loss at both (Kendall tau shown from 10)" in header
    assert 'data-key="lr_factor"' in text
    row = re.search(r"<tr[^>]*><td data-sort=\"1\">.*?</tr>", text).group(0)  # trial 1's row
    assert '<td data-sort="0.5">×0.5</td>' in row


def test_a_study_without_rungs_gets_the_note_and_no_rate_column(smoke_study, tmp_path):
    text = write_report(smoke_study[0], tmp_path).read_text(encoding="utf-8")
    section = re.search(r'<section id="rungs">(.*?)</section>', text, re.S).group(1)
    assert "<img" not in section and "no trial has recorded losses at rungs" in section
    assert 'data-key="lr_factor"' not in text
    assert "6 of 6 trials reached T = 40 steps" in text


@pytest.mark.slow  # a real browser
@needs_chromium
def test_the_ladder_page_loads_in_chromium_with_every_image(ladder, tmp_path):
    page = write_report(ladder, tmp_path / "report")
    check = selfcheck(tmp_path, page)
    assert check.get("done") == "1" and json.loads(check["errors"]) == []
    assert int(check["images"]) >= 4 and check["images-ok"] == check["images"]
