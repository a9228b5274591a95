"""The promotion ladder's ranking and bookkeeping: top 1/eta by non-dominated rank then loss, decided
asynchronously as results arrive; the rung-to-rung agreement; the rebuild from recorded rung losses.
The search-wide cap and its other rules: tests/service/test_ladder_rule.py."""

from __future__ import annotations

import math

import pytest

from npas.service.study.ladder import Ladder, RungResult, decide, fronts, rank


def rr(trial: str, loss: float, *objectives: float) -> RungResult:
    return RungResult(trial, loss, tuple(objectives))


def test_non_dominated_rank_comes_before_loss():
    # (loss, stored params): a and b are the front; c has a lower loss than b but a dominates it
    results = [rr("c", 1.1, 20), rr("d", 1.3, 30), rr("b", 1.2, 1), rr("a", 1.0, 10)]
    assert [[r.trial for r in f] for f in fronts(results)] == [["a", "b"], ["c"], ["d"]]
    assert [r.trial for r in rank(results)] == ["a", "b", "c", "d"]
    d = decide(results, [], eta=2)
    assert d.promote == ("a", "b")  # loss alone would have promoted a and c
    single = decide([rr(r.trial, r.loss) for r in results], [], eta=2)
    assert single.promote == ("a", "c")


def test_promotion_is_asynchronous_and_final():
    ladder = Ladder(rungs=(100, 400, 1600), eta=3)
    assert ladder.report(100, rr("t0", 1.0)).promote == ()  # quota 0: t0 waits, paused
    assert ladder.report(100, rr("t1", 2.0)).promote == ()
    third = ladder.report(100, rr("t2", 3.0))
    assert third.quota == 1 and third.promote == ("t0",)  # the paused t0, promoted once the rung has 3
    assert ladder.report(100, rr("t3", 0.5)).promote == ("t3",)  # top 1 of 4 now; t0 stays promoted
    assert ladder.is_promoted("t0", 100) and ladder.is_promoted("t3", 100)
    assert ladder.report(100, rr("t4", 2.5)).promote == ()
    sixth = ladder.report(100, rr("t5", 0.7))  # quota 2: t3 and t5 lead; t0 is already promoted
    assert sixth.quota == 2 and sixth.promote == ("t5",) and not ladder.is_promoted("t1", 100)
    assert ladder.next_rung(100) == 400 and ladder.next_rung(1600) is None
    top = ladder.report(1600, rr("t3", 0.3))
    assert top.promote == () and top.ranking == ("t3",)  # the top rung finishes trials, promotes nobody
    with pytest.raises(ValueError, match="not a rung"):
        ladder.report(200, rr("t9", 1.0))


def test_a_diverged_result_is_never_promoted():
    d = decide([rr("nan", math.nan), rr("b", 2.0), rr("c", 3.0), rr("d", 4.0)], [], eta=2)
    assert d.ranking == ("b", "c", "d", "nan") and d.promote == ("b", "c")
    assert decide([rr("nan", math.nan), rr("b", 2.0)], [], eta=1 + 1).promote == ("b",)


def test_rung_pairs_pair_a_trials_losses_at_consecutive_rungs():
    ladder = Ladder(rungs=(1, 2))
    ladder.report(1, rr("a", 1.0))
    ladder.report(1, rr("b", 2.0))
    ladder.report(2, rr("a", 0.5))
    assert ladder.rung_pairs(1) == [(1.0, 0.5)] and ladder.rung_pairs(2) == []


def test_the_rung_to_rung_agreement_is_suppressed_below_ten_pairs():
    from npas.service.study.ladder import MIN_TAU_PAIRS, agreement

    ladder = Ladder(rungs=(1, 2), eta=2)
    for i in range(MIN_TAU_PAIRS - 1):
        ladder.report(1, rr(f"t{i}", 1.0 + i))
        ladder.report(2, rr(f"t{i}", 0.5 + i if i != 3 else 0.5 + 1.5))  # t3 overtakes t2 at the next rung
    few = agreement(ladder, 1)
    assert few is not None and few.n == MIN_TAU_PAIRS - 1 and few.tau is None and few.flips == 1
    ladder.report(1, rr("t9", 20.0))
    ladder.report(2, rr("t9", 19.0))
    enough = agreement(ladder, 1)
    assert enough.n == MIN_TAU_PAIRS and enough.tau.value == pytest.approx(1 - 2 * 1 / 45)
    assert enough.tau.low is not None and enough.pairs == 45 and agreement(ladder, 2) is None


def test_a_resumed_driver_rebuilds_the_ladder_from_rung_losses_and_reruns_nothing():
    # what the study recorded when the first driver died: a went up to 400, b, c and d paused at 100
    recorded = {"a": {100: 1.0, 400: 0.8}, "b": {100: 1.3}, "c": {100: 1.2}, "d": {100: 1.5}, "e": {100: 1.1}}
    ladder = Ladder.rebuild((100, 400, 1600), recorded, eta=2)
    assert ladder.promoted == {100: ["a"]} and len(ladder.results[100]) == 5
    due = ladder.decide(100)  # five at rung 100: quota 2, a already promoted, e (1.1) is due now
    assert due.promote == ("e",) and ladder.is_promoted("e", 100)
    assert ladder.decide(100).promote == ()  # decided once: deciding again promotes nobody twice
    assert ladder.decide(400).promote == ()  # one trial at 400: quota 0, a waits there
    # a second driver that reads the promotion of e from the record does not make it again
    other = Ladder.rebuild((100, 400, 1600), recorded, eta=2, promoted={"e": [100]})
    assert other.is_promoted("e", 100) and other.decide(100).promote == ()
