"""The dashboard's rung panel: every trial's loss at each rung it reached, its
promotions drawn as lines from rung to rung, the front at the top rung marked, and the rung-to-rung
agreement (Kendall tau with its interval and n, rank flips) and the ladder's spend (how many went on at
each rung, compute as a multiple of N·T: `npas.service.study.compute`) in the caption.

`rungs_info` is pure (numbers from the study, tested as numbers); `render_rungs` draws them with the
same conventions as `render.py`. A study whose trials stored no `rung_losses` (a cosine recipe, or one
from before WSD) gets the panel's note instead of a figure.
"""

from __future__ import annotations

from dataclasses import dataclass

import optuna
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, NullLocator

from npas.presentation.dashboard.info import label
from npas.presentation.dashboard.render import FRONT, SEARCHED, STOPPED, new_figure
from npas.service.study import rungs as study_rungs
from npas.service.study.compute import ladder_compute
from npas.service.study.record import TrialAttr
from npas.service.study.studies import front_trials, status


@dataclass(frozen=True)
class RungLine:
    number: int
    label: str
    points: tuple[tuple[int, float], ...]  # (rung, finished-at-rung loss), ascending rung
    on_front: bool
    lr_factor: float | None  # the trial's located factor; None: it located none


@dataclass(frozen=True)
class RungsInfo:
    rungs: tuple[int, ...]  # every rung some trial reached, ascending
    top: int | None  # T
    lines: tuple[RungLine, ...]  # one per trial with rung losses, by trial number
    reached: str  # "k of n trials reached T = ..."
    agreement: tuple[str, ...]  # one line per rung pair (`npas.service.study.rungs.describe`)
    note: str | None = None
    compute: str | None = None  # `LadderCompute.line()`; None for a study not searched under the ladder

    @property
    def promotions(self) -> int:
        """Rung-to-rung moves drawn: one per consecutive pair of a trial's rungs."""
        return sum(max(0, len(ln.points) - 1) for ln in self.lines)


def rungs_info(study: optuna.Study) -> RungsInfo:
    summary = study_rungs.summary(study)
    front = {t.number for t in front_trials(study)}
    lines = []
    for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        if status(t) in study_rungs.NOT_RESULTS:
            continue
        pts = study_rungs.rung_losses(t)
        if pts:
            f = t.user_attrs.get(TrialAttr.LR_FACTOR)
            lines.append(RungLine(t.number, label(t), tuple(sorted(pts.items())), t.number in front,
                                  None if f is None else float(f)))
    rungs = tuple(sorted({r for ln in lines for r, _ in ln.points}))
    note = None if lines else ("no trial has recorded losses at rungs (a WSD recipe's cooldown forks write "
                               "them); nothing to draw")
    spent = ladder_compute(study)
    return RungsInfo(rungs, summary.top, tuple(lines), summary.reached_line(), tuple(summary.agreement_lines()),
                     note, None if spent is None else spent.line())


def render_rungs(info: RungsInfo) -> Figure | None:
    if not info.lines:
        return None
    fig = new_figure(11, 5.2)
    ax = fig.add_subplot()
    top = info.top if info.top is not None else info.rungs[-1]
    for ln in info.lines:
        xs, ys = zip(*ln.points, strict=True)
        finished = xs[-1] == top
        colour = FRONT if ln.on_front else (SEARCHED if finished else STOPPED)
        if len(xs) > 1:  # promoted: a line from each rung to the next one it reached
            ax.plot(xs, ys, color=colour, lw=2.0 if ln.on_front else 1.0, alpha=0.9 if ln.on_front else 0.55,
                    zorder=3 if ln.on_front else 2)
        ax.scatter(xs, ys, s=50 if ln.on_front else 22, zorder=4 if ln.on_front else 2.5,
                   c=colour if finished else "none", edgecolors=colour)
        if ln.on_front:
            rate = "" if ln.lr_factor is None else f" (lr ×{ln.lr_factor:g})"
            ax.annotate(ln.label + rate, (xs[-1], ys[-1]), xytext=(6, 0), textcoords="offset points",
                        fontsize=9, color=FRONT, fontweight="bold", va="center")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(list(info.rungs)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([f"{r:,}" + (" = T" if r == top else "") for r in info.rungs])
    ax.set_xlabel("rung: length of the WSD run whose finished loss is read (steps)")
    ax.set_ylabel("validation loss at the rung (nats/token)  → less is better")
    ax.set_title(f"Loss at each rung ({info.reached}; {info.promotions} promotions drawn)", fontsize=12, loc="left")
    ax.grid(alpha=0.3)
    handles = [Line2D([], [], color=FRONT, marker="o", lw=2, label="front at T (with its located lr factor)"),
               Line2D([], [], color=SEARCHED, marker="o", lw=1, label="reached T, dominated"),
               Line2D([], [], color=STOPPED, marker="o", mfc="none", lw=1, label="stopped below T"),
               Line2D([], [], color="0.4", lw=1, label="a line: promoted to the next rung")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)
    return fig


def caption(info: RungsInfo) -> str:
    text = ("Each trial's validation loss at every rung it reached (a finished WSD run of that length, read from "
            "its cooldown fork); a line joins the rungs of a trial that was promoted, so where lines cross the upper "
            "rung reordered the lower one's ranking. Filled points reached the top rung T, hollow ones stopped below "
            "it; red is the front, read at T only. ")
    if info.agreement:
        text += "Rung-to-rung agreement among the promoted trials: " + "; ".join(info.agreement) + ". "
    if info.compute:
        text += "The search's spend: " + info.compute + "."
    return text.rstrip()
