"""The promotion ladder's row of ``bench/proxy_fidelity.py`` (issue #34 item 7), replayed from cached runs.

A ladder trial at rung ``t`` computes exactly what the candidate's one WSD run to T computes at its
cooldown fork ``t`` (``npas.training.climb`` climbs with the same ``forks.advance`` and ``fork_loss``,
bit for bit: tests/training/test_checkpoint.py), and a promoted trial resumes from its checkpoint
without retraining a step. So the losses a ladder over the 24 frozen candidates would see are the
``rung_losses`` already cached on each candidate's WSD run (seed 0, validation split): what is left
to decide is *which* rungs each candidate would reach. That is the ladder's rule itself
(``npas.Ladder``: asynchronous successive halving, non-dominated ranking; no search-wide cap: a replay has no target),
replayed here on an event clock with ``WORKERS`` workers that run the scheduler's order
(``npas/service/search/ladder_scheduler.py``): promoted paused trials resume first, then new
trials in the sampler's order; a trial promoted at its own report continues on its worker; when
nothing is left to run, paused trials that were not promoted stop. A segment's duration is its
optimizer steps x the candidate's forward FLOPs per token (every step has the same tokens).

Held equal: stored parameters (the 24 candidates sit at the space's budget), seed 0, the fair
rate, the WSD recipe's rungs. The ranking objective is the rung loss alone: the candidates' other
objective in a search (training memory) would promote some of them for memory rather than loss,
which a row about the fidelity of the *loss* ranking must not mix in.

The ladder's final ranking orders candidates by rung reached, then loss at that rung. Its compute
counts every optimizer step it would run: the stable run to the fork point of the highest rung
reached (or to T), plus every fork's decay -- against N x T for training every candidate to T.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any

import npas

WORKERS = 2  # the README's search runs two workers; the rule is asynchronous, so the count moves promotions a little


@dataclass
class Replay:
    """What a replayed ladder did: each candidate's top rung and its losses there, the steps it trained,
    and the order the rule ranked them in."""

    rungs: tuple[int, ...]
    reached: dict[str, int] = field(default_factory=dict)  # candidate -> highest rung scored
    losses: dict[str, dict[int, float]] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=dict)  # optimizer steps trained, forks included
    ladder: Any = None

    def score(self) -> dict[str, float]:
        """A number per candidate whose order is the ladder's ranking: rung reached, then loss there."""
        top = len(self.rungs) - 1
        return {c: 1000.0 * (top - self.rungs.index(t)) + self.losses[c][t] for c, t in self.reached.items()}

    @property
    def total_steps(self) -> int:
        return sum(self.steps.values())


def rung_losses_of(rec: dict | None, top: int) -> dict[int, float]:
    """A cached WSD run's finished-at-t losses by rung: its recorded forks' losses, and its own end as the
    top rung when the run finished (a run record may carry ``rung_losses`` without the top)."""
    got = {int(t): float(v) for t, v in ((rec or {}).get("rung_losses") or {}).items() if v is not None}
    if rec is not None and rec.get("status") == "ok" and top not in got and rec.get("val_loss") is not None:
        got[top] = float(rec["val_loss"])
    return got


def segment_steps(recipe: Any, rungs: tuple[int, ...], i: int) -> int:
    """Optimizer steps from rung ``i - 1``'s pause point to rung ``i``'s score: the stable segment, plus
    the fork's decay below the top rung (the top rung decays the stable run itself)."""
    start = 0 if i == 0 else recipe.decay_start(rungs[i - 1])
    t = rungs[i]
    if t == rungs[-1]:
        return t - start
    return (recipe.decay_start(t) - start) + (t - recipe.decay_start(t))


def replay(order: list[str], rung_losses: dict[str, dict[int, float]], recipe: Any, flops: dict[str, int],
           eta: int | None = None, workers: int = WORKERS) -> Replay:
    """Run the ladder's rule over ``order`` (candidate names, the sampler's order) with the losses each
    candidate's WSD run recorded at every rung; see the module docstring."""
    rungs = tuple(recipe.fork_rungs())
    ladder = npas.Ladder(rungs) if eta is None else npas.Ladder(rungs, eta)
    out = Replay(rungs, ladder=ladder)
    new = list(order)
    resume: list[str] = []  # promoted and paused, in promotion order
    paused: set[str] = set()
    clock: list[tuple[float, int, str, int]] = []  # (finish time, tie-break, candidate, rung index)
    seq = 0

    def start(c: str, i: int, now: float) -> None:
        nonlocal seq
        steps = segment_steps(recipe, rungs, i)
        out.steps[c] = out.steps.get(c, 0) + steps
        heapq.heappush(clock, (now + steps * flops[c], seq, c, i))
        seq += 1

    now, busy = 0.0, 0
    while True:
        while busy < workers and (resume or new):
            c = resume.pop(0) if resume else new.pop(0)
            paused.discard(c)
            start(c, 0 if c not in out.reached else rungs.index(out.reached[c]) + 1, now)
            busy += 1
        if not clock:
            break
        now, _, c, i = heapq.heappop(clock)
        busy -= 1
        t = rungs[i]
        loss = rung_losses[c][t]
        out.reached[c], out.losses.setdefault(c, {})[t] = t, loss
        decision = ladder.report(t, npas.RungResult(c, loss if math.isfinite(loss) else math.nan))
        if t == rungs[-1]:
            continue
        promoted = list(decision.promote)
        if c in promoted:  # goes on at once, on its own worker
            promoted.remove(c)
            start(c, i + 1, now)
            busy += 1
        else:
            paused.add(c)
        resume += [p for p in promoted if p in paused and p not in resume]
    return out
