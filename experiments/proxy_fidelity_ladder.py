"""The promotion ladder replayed from cached runs: the rows of ``experiments/proxy_fidelity.py`` and
``experiments/ladder_orders.py`` (issues #34 item 7, #52).

A ladder trial at rung ``t`` computes exactly what the candidate's one WSD run to T computes at its
cooldown fork ``t`` (``npas.training.climb`` climbs with the same ``forks.advance`` and ``fork_loss``,
bit for bit: tests/training/test_checkpoint.py), and a promoted trial resumes from its checkpoint
without retraining a step. So the losses a ladder over the 24 frozen candidates would see are the
``rung_losses`` already cached on each candidate's WSD run (seed 0, validation split): what is left
to decide is *which* rungs each candidate would reach. That is the product's rule itself
(``npas.Ladder``, whose module docstring states it: the k-th rung promotes at most floor(N / eta**k)
trials in the search, each only while in the top floor(n / eta) of the n results at that rung so
far; non-dominated ranking on (rung loss, the study's other objectives), then loss), replayed on an
event clock with ``WORKERS`` workers that run the scheduler's order
(``npas/service/search/ladder_scheduler.py`` and ``ladder_run.py``): promoted paused trials resume
first, then new trials in the sampler's order; a trial promoted at its own report continues on its
worker; one that reports at a rung that has promoted its cap stops there, the others pause. When the
order is exhausted and nothing runs, the lowest rung holding paused trials is closed
(``Ladder.close``: if it promoted nobody, its best waiting trial goes on) and its other paused trials
stop; a rung above is closed once what the closed rung sent up has run -- as ``_stop_stranded`` does
once the searcher is finished. A segment's duration is its optimizer steps x the candidate's forward
FLOPs per token (every step has the same tokens).

``target`` is the search's N (the rungs' caps); ``objectives`` the study's other objectives per
candidate, lower better (the product ranks on the rung loss and, for ``full.yaml``, the analytic
training memory). Without a target the replay is the pre-cap rule (no cap, no close: paused trials
not promoted stop when nothing runs), which ``experiments/located_rate.py`` still replays.

The noise-tie variant (``tie_width``, a bench-only rule the product dropped): at a rung below the
top whose quota q = floor(n / eta) is at least 1, the one trial ranked right after the quota (rank
q + 1) is eligible with the top q when its rung loss is within ``tie_width`` nats of the q-th one's
(both finite); promotions still go best first and never beyond the rung's cap.

The ladder's final ranking orders candidates by rung reached, then loss at that rung. Its compute
counts every optimizer step it would run: the stable run to the fork point of the highest rung
reached (or to T), plus every fork's decay -- against N x T for training every candidate to T.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from npas.service.study.ladder import Decision, Ladder, RungResult, decide, rank

WORKERS = 2  # the README's search runs two workers; the rule is asynchronous, so the count moves promotions a little


class TieLadder(Ladder):
    """``npas.Ladder`` with the noise-tie variant (module docstring): the trial just outside a rung's
    quota is eligible when its loss is within ``tie_width`` of the last one inside; the cap holds."""

    def __init__(self, rungs: tuple[int, ...], eta: int, target: int | None, tie_width: float) -> None:
        super().__init__(rungs, eta, target)
        self.tie_width = tie_width

    def decide(self, rung: int) -> Decision:
        results = self.results.get(rung, [])
        if rung == self.top:
            return super().decide(rung)
        order = rank(results)
        quota = len(order) // self.eta
        d = decide(results, self.promoted.get(rung, []), self.eta, self.cap(rung))
        chosen = list(d.promote)
        cap = self.cap(rung)
        room = math.inf if cap is None else cap - len(self.promoted.get(rung, [])) - len(chosen)
        if quota >= 1 and quota < len(order) and room > 0:
            last, nxt = order[quota - 1], order[quota]
            done = set(self.promoted.get(rung, [])) | set(chosen)
            if (math.isfinite(last.loss) and math.isfinite(nxt.loss) and nxt.trial not in done
                    and abs(nxt.loss - last.loss) <= self.tie_width):
                chosen.append(nxt.trial)
        self.promoted.setdefault(rung, []).extend(chosen)
        return Decision(tuple(chosen), quota, d.ranking, cap)


@dataclass
class Replay:
    """What a replayed ladder did: each candidate's top rung and its losses there, the steps it trained,
    and the order the rule ranked them in."""

    rungs: tuple[int, ...]
    reached: dict[str, int] = field(default_factory=dict)  # candidate -> highest rung scored
    losses: dict[str, dict[int, float]] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=dict)  # optimizer steps trained, forks included
    flops: dict[str, float] = field(default_factory=dict)  # steps x forward FLOPs per token
    closed: list[tuple[int, tuple[Hashable, ...]]] = field(default_factory=list)  # (rung, sent on) per close
    ladder: Any = None

    def score(self) -> dict[str, float]:
        """A number per candidate whose order is the ladder's ranking: rung reached, then loss there."""
        top = len(self.rungs) - 1
        return {c: 1000.0 * (top - self.rungs.index(t)) + self.losses[c][t] for c, t in self.reached.items()}

    def pick(self) -> str | None:
        """The trial a user takes: the lowest loss at the top rung (None if nobody reached it)."""
        top = self.rungs[-1]
        at_top = [c for c, t in self.reached.items() if t == top and math.isfinite(self.losses[c][t])]
        return min(at_top, key=lambda c: self.losses[c][top]) if at_top else None

    @property
    def total_steps(self) -> int:
        return sum(self.steps.values())

    @property
    def total_flops(self) -> float:
        return sum(self.flops.values())


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


def replay(order: list[str], rung_losses: dict[str, dict[int, float]], recipe: Any, flops: dict[str, float],
           eta: int | None = None, workers: int = WORKERS, target: int | None = None,
           objectives: dict[str, tuple[float, ...]] | None = None, tie_width: float | None = None) -> Replay:
    """Run the ladder's rule over ``order`` (candidate names, the sampler's order) with the losses each
    candidate's WSD run recorded at every rung; see the module docstring."""
    rungs = tuple(recipe.fork_rungs())
    eta = Ladder(rungs).eta if eta is None else eta
    ladder = Ladder(rungs, eta, target) if tie_width is None else TieLadder(rungs, eta, target, tie_width)
    out = Replay(rungs, ladder=ladder)
    segments = [segment_steps(recipe, rungs, i) for i in range(len(rungs))]
    new = list(order)
    resume: list[str] = []  # promoted and paused, in promotion order
    paused: dict[str, int] = {}  # candidate -> the rung index it waits at
    clock: list[tuple[float, int, str, int]] = []  # (finish time, tie-break, candidate, rung index)
    seq = 0

    def start(c: str, i: int, now: float) -> None:
        nonlocal seq
        steps = segments[i]
        out.steps[c] = out.steps.get(c, 0) + steps
        out.flops[c] = out.flops.get(c, 0.0) + steps * flops[c]
        heapq.heappush(clock, (now + steps * flops[c], seq, c, i))
        seq += 1

    def queue(promoted: Iterable[Hashable]) -> None:
        resume.extend(p for p in promoted if p in paused and p not in resume)

    now, busy = 0.0, 0
    while True:
        while busy < workers and (resume or new):
            c = resume.pop(0) if resume else new.pop(0)
            i = paused.pop(c, -1) + 1
            start(c, i, now)
            busy += 1
        if clock:
            now, _, c, i = heapq.heappop(clock)
            busy -= 1
            t = rungs[i]
            loss = rung_losses[c][t]
            out.reached[c], out.losses.setdefault(c, {})[t] = t, loss
            objs = tuple((objectives or {}).get(c, ()))
            decision = ladder.report(t, RungResult(c, loss if math.isfinite(loss) else math.nan, objs))
            if t == rungs[-1]:
                continue
            promoted = list(decision.promote)
            if c in promoted:  # goes on at once, on its own worker
                promoted.remove(c)
                start(c, i + 1, now)
                busy += 1
            elif target is None or not ladder.is_full(t):
                paused[c] = i  # a rung that has promoted its cap stops it instead
            queue(promoted)
            continue
        waiting = [c for c in paused if c not in resume]
        if target is None or not waiting:
            break
        # the order is exhausted and nothing runs: close the lowest rung holding paused trials
        low = min(paused[c] for c in waiting)
        here = [c for c in waiting if paused[c] == low]
        closed = ladder.close(rungs[low], here)
        out.closed.append((rungs[low], closed.promote))
        for c in here:
            if c not in closed.promote:
                del paused[c]
        queue(closed.promote)
    return out
