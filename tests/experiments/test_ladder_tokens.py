"""experiments/ladder_tokens.py: three real searches on the same candidates; the ladder and ASHA spend
fewer tokens than every trial trained to T, which trains each candidate's T steps (plus forks)."""

from __future__ import annotations

import pytest

from experiments import ladder_tokens


@pytest.mark.slow
def test_the_three_searches_see_the_same_candidates_and_the_ladder_spends_less_than_all_to_t(capsys):
    assert ladder_tokens.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "candidates: the same 8 in the same order in all three" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if len(line.split()) == 7 and line.split()[0] in ("ladder", "asha", "all-to-T")}
    steps = {arm: int(r[3].replace(",", "")) for arm, r in rows.items()}
    assert int(rows["all-to-T"][2]) == 8 and steps["all-to-T"] >= 8 * 80  # every trial at T
    assert steps["ladder"] < steps["all-to-T"] and steps["asha"] < steps["all-to-T"]
    assert 0 < int(rows["ladder"][2]) < 8  # some trials stopped below T
