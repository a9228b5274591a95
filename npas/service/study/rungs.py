"""A study's rungs read back from its trials: how many reached the top rung T, and how well each rung's
order foretold the next one's (the free certificate every promotion gives).

Every promotion gives a candidate's loss at two rungs (its trial's ``rung_losses``), so the study itself
holds a rung-to-rung rank correlation among the trials it moved on: Kendall tau with its bootstrap
interval and n, suppressed below ``ladder.MIN_TAU_PAIRS`` trials, and the rank flips among them. The
ladder is rebuilt from what the trials stored (``Ladder.rebuild``) and scored by ``ladder.agreement``:
the same code the search decides with, so what `npas front` and the dashboard show is what the
search saw. This module only reads; ``record`` stores the summary on the study (user attr
``rung_agreement``) for readers with plain Optuna.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from npas.service.study.ladder import MIN_TAU_PAIRS, Ladder, RungAgreement, agreement
from npas.service.study.record import StudyAttr, TrialAttr
from npas.service.study.studies import counts_toward_target, is_full_fidelity, status, was_evaluated

RUNG_AGREEMENT_ATTR = "rung_agreement"  # study user attr: RungSummary.to_dict(), written by `record`
NOT_RESULTS = ("duplicate", "surplus", "infeasible")  # their rung losses repeat another trial's, or are none
RETRIED = ("interrupted", "orphaned")  # stopped with their driver: the re-enqueued retry reports their rungs again


def rung_losses(t: FrozenTrial) -> dict[int, float]:
    """The finished-at-t losses a trial stored, finite ones only (a diverged rung is None there)."""
    raw = t.user_attrs.get(TrialAttr.RUNG_LOSSES) or {}
    out = {}
    for k, v in raw.items():
        try:
            t_, loss = int(k), float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(loss):
            out[t_] = loss
    return out


def lr_factor(t: FrozenTrial) -> float:
    """The trial's located learning-rate factor; 1.0 for a trial (or a study) from before it was located."""
    f = t.user_attrs.get(TrialAttr.LR_FACTOR)
    return 1.0 if f is None else float(f)


def top_steps(study: optuna.Study) -> int | None:
    """T: the steps the study's recipe asks for (the top rung), or None when it records no recipe."""
    steps = (study.user_attrs.get(StudyAttr.RECIPE) or {}).get("steps")
    return int(steps) if isinstance(steps, int | float) and not isinstance(steps, bool) else None


@dataclass(frozen=True)
class RungSummary:
    """What the study's trials say about its rungs."""

    top: int | None  # T, the top rung (the recipe's steps)
    reached: int  # evaluated trials that reached T: what the front is read from
    trials: int  # trials that ran or run a proxy (`counts_toward_target`)
    running: int  # of those, still running or paused at a lower rung
    agreements: tuple[RungAgreement, ...]  # rung -> next rung, ascending; empty without rung losses

    def reached_line(self) -> str:
        top = "T" if self.top is None else f"T = {self.top:,} steps"
        more = f" ({self.running} still running or paused below it)" if self.running else ""
        return f"{self.reached} of {self.trials} trials reached {top}{more}"

    def agreement_lines(self) -> list[str]:
        return [describe(a) for a in self.agreements]

    def to_dict(self) -> dict[str, Any]:
        return {"top": self.top, "reached": self.reached, "trials": self.trials, "running": self.running,
                "min_pairs": MIN_TAU_PAIRS,
                "agreements": [{"rung": a.rung, "next_rung": a.next_rung, "n": a.n,
                                "kendall_tau": None if a.tau is None else a.tau.to_dict(),
                                "flips": a.flips, "pairs": a.pairs} for a in self.agreements]}


def describe(a: RungAgreement) -> str:
    """One line: the rung-to-rung tau with its interval and n, or why it is not shown, and the flips."""
    head = f"rung {a.rung:,} -> {a.next_rung:,}:"
    flips = f"{a.flips} of {a.pairs} pairs of them flipped order" if a.pairs else "no pair to compare"
    if a.tau is None:
        return (f"{head} {a.n} trial(s) with a loss at both (Kendall tau shown from {MIN_TAU_PAIRS}); {flips}")
    if a.tau.value is None:
        return f"{head} Kendall tau undefined (tied losses), n={a.n}; {flips}"
    iv = "" if a.tau.low is None else f" [{a.tau.low:.2f}, {a.tau.high:.2f}]"
    return f"{head} Kendall tau {a.tau.value:.2f}{iv} over n={a.n} promoted trials; {flips}"


def ladder_of(study: optuna.Study) -> Ladder | None:
    """The study's ladder rebuilt from its trials' rung losses; None when no trial stored any."""
    losses = {t.number: rung_losses(t) for t in study.get_trials(deepcopy=False)
              if status(t) not in (*NOT_RESULTS, *RETRIED)}
    losses = {n: d for n, d in losses.items() if d}
    if not losses:
        return None
    rungs = sorted({r for d in losses.values() for r in d})
    return Ladder.rebuild(rungs, losses)


def summary(study: optuna.Study) -> RungSummary:
    trials = study.get_trials(deepcopy=False)
    counted = [t for t in trials if counts_toward_target(t)]
    reached = sum(1 for t in trials if is_full_fidelity(t))
    running = sum(1 for t in counted if t.state == TrialState.RUNNING and not was_evaluated(t))
    ladder = ladder_of(study)
    agreements: tuple[RungAgreement, ...] = ()
    if ladder is not None:
        agreements = tuple(a for r in ladder.rungs[:-1] if (a := _agreement(ladder, r)) is not None)
    return RungSummary(top_steps(study), reached, len(counted), running, agreements)


_SEEN: dict[tuple, RungAgreement | None] = {}  # (rung, next rung, its pairs) -> agreement: see _agreement


def _agreement(ladder: Ladder, rung: int) -> RungAgreement | None:
    """``ladder.agreement``, remembered for the same pairs of losses: its bootstrap takes about a second
    at 200 pairs, and a search refreshes the summary after every trial while the pairs change only
    when a trial is promoted."""
    key = (rung, ladder.next_rung(rung), tuple(ladder.rung_pairs(rung)))
    if key not in _SEEN:
        if len(_SEEN) >= 64:
            _SEEN.clear()
        _SEEN[key] = agreement(ladder, rung)
    return _SEEN[key]


def record(study: optuna.Study) -> RungSummary:
    """Store the summary on the study (user attr ``rung_agreement``), for plain-Optuna readers; a
    search refreshes it as results arrive (`npas search`/`resume` after every finished trial). A study
    whose trials stored no rung losses (a cosine recipe) has nothing to certify and is left as it was."""
    s = summary(study)
    if s.agreements:
        study.set_user_attr(RUNG_AGREEMENT_ATTR, s.to_dict())
    return s
