"""Matplotlib renderers: one per info object, each returning a Figure (Agg canvas, no pyplot state).

Renderers only draw; what to draw was decided in `info.py`. A renderer given an info with nothing
to show returns None and the page prints the info's note instead.
"""

from __future__ import annotations

import io

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.ticker import MaxNLocator

from npas.presentation.dashboard.allocations import AllocationInfo, LayerCell, TaperInfo
from npas.presentation.dashboard.info import (
    CurvesInfo,
    FidelityInfo,
    HypervolumeInfo,
    ImportanceInfo,
    ParetoInfo,
)

MIB = 2**20
FRONT, SEARCHED, STOPPED, OVER, BASELINE = "#d62728", "#4c72b0", "#9aa7b8", "#8c564b", "#2ca02c"
# objective -> (axis label, unit, divisor): bytes read as MiB, FLOPs as millions
_AXES = {
    "val_loss": ("validation loss", "nats/token", 1.0),
    "val_bpc": ("validation loss", "bits/char", 1.0),
    "val_bpb": ("validation loss", "bits/byte", 1.0),
    "train_memory_bytes": ("training memory", "MiB", MIB),
    "peak_memory_bytes": ("peak memory", "MiB", MIB),
    "param_bytes": ("parameter memory", "MiB", MIB),
    "inference_bytes": ("inference memory", "MiB", MIB),
    "flops_per_token": ("forward FLOPs per token", "MFLOP", 1e6),
}


def axis(name: str) -> tuple[str, float]:
    """`training memory (MiB)` and the divisor that turns raw values into those units."""
    text, unit, div = _AXES.get(name, (name.replace("_", " "), "", 1.0))
    if not unit and name.endswith("_bytes"):
        unit, div = "MiB", MIB
    return (f"{text} ({unit})" if unit else text), div


def trial_colours(numbers: list[int]) -> dict[int, str]:
    """The same trial gets the same colour in every figure (front order, tab10 then tab20)."""
    from matplotlib import colormaps

    cmap = colormaps["tab10" if len(numbers) <= 10 else "tab20"]
    return {n: cmap(i % cmap.N) for i, n in enumerate(numbers)}


def new_figure(w: float, h: float) -> Figure:
    fig = Figure(figsize=(w, h), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


# ---- Pareto front ----------------------------------------------------------------------------
def render_pareto(info: ParetoInfo) -> Figure | None:
    if not info.points:
        return None
    yname = info.names[0]
    ylabel, ydiv = axis(yname)
    two = len(info.names) > 1
    xlabel, xdiv = axis(info.names[1]) if two else ("trial number", 1.0)

    def xy(p):
        return (p.values[1] / xdiv if two else p.number), p.values[0] / ydiv

    fig = new_figure(11, 6.2)
    ax = fig.add_subplot()
    groups = {
        "searched": [p for p in info.points if p.full_fidelity and p.within_budget and not p.on_front and not p.baseline],
        "stopped": [p for p in info.points if not p.full_fidelity and not p.on_front and not p.baseline],
        "over": [p for p in info.points if p.full_fidelity and not p.within_budget],
    }
    handles = []
    for key, colour, marker, face, text in (
        ("searched", SEARCHED, "o", None, "searched, dominated"),
        ("stopped", STOPPED, "o", "none", "stopped early (loss at lower fidelity)"),
        ("over", OVER, "X", None, "over the parameter budget"),
    ):
        pts = groups[key]
        if pts:
            xs, ys = zip(*(xy(p) for p in pts), strict=True)
            ax.scatter(xs, ys, s=40, c=colour if face is None else "none", edgecolors=colour, marker=marker,
                       alpha=0.45 if key == "stopped" else 0.85, zorder=2)
            handles.append(Line2D([], [], ls="none", marker=marker, ms=7, color=colour,
                                  mfc="none" if face == "none" else colour, alpha=0.6 if key == "stopped" else 1,
                                  label=f"{text} ({len(pts)})"))
    front = sorted((p for p in info.points if p.on_front), key=lambda p: xy(p)[0])
    if front:
        fx, fy = zip(*(xy(p) for p in front), strict=True)
        ax.step(fx, fy, where="post", color=FRONT, lw=1.5, alpha=0.7, zorder=3)
        plain = [p for p in front if not p.baseline]
        if plain:
            ax.scatter([xy(p)[0] for p in plain], [xy(p)[1] for p in plain], s=90, c=FRONT, edgecolors="black",
                       linewidths=0.8, zorder=4)
        handles.append(Line2D([], [], color=FRONT, marker="o", ms=9, mec="black", label=f"Pareto front ({len(front)})"))
    bases = [p for p in info.points if p.baseline and (p.within_budget or p.on_front)]
    if bases:
        for stopped in (False, True):
            pts = [p for p in bases if p.full_fidelity != stopped]
            if pts:
                ax.scatter([xy(p)[0] for p in pts], [xy(p)[1] for p in pts], s=110, marker="D", zorder=5,
                           c="none" if stopped else [FRONT if p.on_front else BASELINE for p in pts],
                           edgecolors=BASELINE if stopped else "black", linewidths=1.2 if stopped else 0.8,
                           alpha=0.5 if stopped else 1.0)
        handles.append(Line2D([], [], ls="none", marker="D", ms=8, color=BASELINE, mec="black",
                              label=f"hand-crafted baseline ({len(bases)}; red if on the front)"))
    if info.reference is not None and two:
        rx = info.reference.value / xdiv
        ax.axvline(rx, color="0.35", ls="--", lw=1.2, zorder=1)
        unit = xlabel.rsplit("(", 1)[-1].rstrip(")") if "(" in xlabel else ""
        handles.append(Line2D([], [], color="0.35", ls="--",
                              label=f"reference model (1×, {info.reference.params:,} params): {rx:,.2f} {unit}"))
    noisy = [p for p in info.points if p.loss_std is not None and (p.full_fidelity or p.on_front)]
    if noisy:  # --repeats: the noise a user must see before trusting a front point's rank
        ax.errorbar([xy(p)[0] for p in noisy], [xy(p)[1] for p in noisy], yerr=[p.loss_std / ydiv for p in noisy],
                    fmt="none", ecolor="0.25", elinewidth=1, capsize=3, zorder=3.5)
        seeds = sorted({p.n_seeds for p in noisy})
        handles.append(Line2D([], [], color="0.25", marker="|", ms=10,
                              label=f"± std over each trial's {'/'.join(map(str, seeds))} seeds (--repeats)"))
    missing = sum(info.no_values.values())
    if missing:
        detail = ", ".join(f"{n} {s}" for s, n in sorted(info.no_values.items(), key=lambda kv: -kv[1]))
        handles.append(Line2D([], [], ls="none", marker="x", ms=7, color="0.6",
                              label=f"not plotted, no values: {detail}"))
    _label_points(ax, [(xy(p), p.label + ("" if p.full_fidelity else " (stopped)"),
                        FRONT if p.on_front else (BASELINE if p.full_fidelity else STOPPED))
                       for p in [*front, *(b for b in bases if not b.on_front)]])
    if not two:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(xlabel + ("  → less is better" if two else ""))
    ax.set_ylabel(ylabel + "  → less is better")
    title = f"Pareto front: {ylabel.split(' (')[0]} against {xlabel.split(' (')[0]}" if two else ylabel
    ax.set_title(title, fontsize=13, loc="left")
    if info.budget_params is not None:
        spec = f" ({info.budget_spec})" if info.budget_spec else ""
        ax.text(0.99, 0.98, f"parameter budget: {info.budget_params:,}{spec}", transform=ax.transAxes, ha="right",
                va="top", fontsize=9, bbox={"boxstyle": "round", "fc": "white", "ec": "0.7"})
    ax.grid(alpha=0.3)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)
    return fig


def _label_points(ax, items: list[tuple[tuple[float, float], str, str | None]]) -> None:
    """Annotate points, trying a few offsets per label so no two labels overlap (greedy)."""
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    placed = []
    offsets = [(7, 7), (7, -14), (-7, 7), (-7, -14), (10, -3), (-10, -3), (0, 14), (0, -20)]
    for (x, y), text, colour in items:
        best = None
        for dx, dy in offsets:
            ann = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=9,
                              ha="left" if dx >= 0 else "right", color=colour or "0.2", zorder=6,
                              fontweight="bold" if colour == FRONT else "normal")
            box = ann.get_window_extent(renderer)
            if not any(box.overlaps(b) for b in placed):
                best = (ann, box)
                break
            ann.remove()
        if best is None:  # every spot taken: keep the first and accept the overlap
            ann = ax.annotate(text, (x, y), xytext=offsets[0], textcoords="offset points", fontsize=9,
                              color=colour or "0.2", zorder=6)
            best = (ann, ann.get_window_extent(renderer))
        placed.append(best[1])


# ---- hypervolume -----------------------------------------------------------------------------
def render_hypervolume(info: HypervolumeInfo) -> Figure | None:
    if not info.trial_numbers or info.note:
        return None
    fig = new_figure(11, 3.8)
    ax = fig.add_subplot()
    ax.step(info.trial_numbers, info.values, where="post", color=FRONT, lw=2)
    gains = [(n, v) for (n, v), prev in zip(zip(info.trial_numbers, info.values, strict=True),
                                           [0.0, *info.values[:-1]], strict=True) if v > prev]
    if gains:
        ax.scatter(*zip(*gains, strict=True), color=FRONT, s=30, zorder=3, label="a trial improved the front")
        ax.legend(loc="lower right", fontsize=9)
    lo = min(info.values)
    ax.set_ylim(max(0.0, lo - (1.0 - lo) * 0.3 - 0.01), 1.0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("trial number")
    ax.set_ylabel("hypervolume (fraction, ↑ better)")
    ax.set_title("Hypervolume of the feasible front after each complete trial", fontsize=13, loc="left")
    ax.grid(alpha=0.3)
    return fig


# ---- allocation map --------------------------------------------------------------------------
def render_allocation(info: AllocationInfo) -> Figure | None:
    if not info.rows:
        return None
    import numpy as np

    rows, L = info.rows, info.n_layers
    grid = np.full((len(rows), L), np.nan)
    text = [[_cell_lines(c) for c in row.cells] for row in rows]
    for r, row in enumerate(rows):
        for i, c in enumerate(row.cells):
            grid[r, i] = c.stored / 1e3
    most = max((len(lines) for row in text for lines in row), default=1)
    fig = new_figure(min(4 + 1.25 * L, 18), 1.4 + max(0.95, 0.16 * most + 0.15) * len(rows))
    ax = fig.add_subplot()
    im = ax.imshow(grid, cmap="YlGnBu", aspect="auto", vmin=0)
    cmap, norm = im.get_cmap(), im.norm
    for r, row in enumerate(rows):
        for i, c in enumerate(row.cells):
            rgb = to_rgb(cmap(norm(c.stored / 1e3)))
            ink = "white" if 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] < 0.5 else "black"
            ax.text(i, r, "\n".join(text[r][i]), ha="center", va="center", fontsize=8, color=ink, linespacing=1.2)
            if c.banks:
                ax.add_patch(Rectangle((i - 0.5, r - 0.5), 1, 1, fill=False, hatch="//", ec=ink, lw=0, alpha=0.35))
            if c.atoms:  # attention made from atoms: a dotted frame inside the cell
                ax.add_patch(Rectangle((i - 0.44, r - 0.44), 0.88, 0.88, fill=False, ls=":", ec=ink, lw=1.2))
            if c.kv_consumers:  # a KV group: a bar from its source (dot) under every layer reusing its K/V
                ax.plot([i, max(c.kv_consumers)], [r + 0.4, r + 0.4], color="#d62728", lw=2.5, solid_capstyle="butt")
                ax.plot([i], [r + 0.4], "o", color="#d62728", ms=5)
    ax.set_xticks(range(L), [f"layer {i}" for i in range(L)])
    ax.set_yticks(range(len(rows)), [f"{row.label}\n{row.summary}" for row in rows], fontsize=8)
    ax.set_xlabel("depth (input → output)")
    ax.set_title("Where the front trials put their parameters", fontsize=13, loc="left")
    ax.set_xticks(np.arange(-0.5, L, 1), minor=True)
    ax.set_yticks(np.arange(-0.5, len(rows), 1), minor=True)
    ax.set_xlim(-0.5, L - 0.5)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.grid(which="minor", color="white", lw=2)
    ax.tick_params(which="minor", length=0)
    fig.colorbar(im, ax=ax, label="stored parameters per layer (thousands)", shrink=0.9)
    return fig


def _cell_lines(c: LayerCell) -> list[str]:
    """The text of one allocation-map cell: params, tying group, MLP width, then whatever mechanisms
    make this layer's weights (banks, atoms, LoRA) and where its keys and values come from."""
    lines = [f"{c.stored / 1e3:,.1f}k params", f"{_letter(c.block)}{' (shared)' if c.shared else ''}"]
    if c.experts is not None:  # the MLP is a top-k read of a shared pool: which pool, its size, k and width
        pool, size, k, width = c.experts
        lines.append(f"pool {pool}: top-{k} of {size} x ff {width}")
    else:
        lines.append(f"ff {c.width}")
    if c.banks:
        lines.append("bank " + ",".join(str(k) for k, _ in c.banks))
    by_k: dict[int, str] = {}
    for slot, k in c.atoms:
        by_k[k] = by_k.get(k, "") + slot
    lines += [f"atoms {slots} K={k}" for k, slots in by_k.items()]
    shared = "KV" if c.kv_mode == "kv" else "V"
    if c.kv_source is not None:
        lines.append(f"{shared} ← layer {c.kv_source}")
    elif c.kv_consumers:
        lines.append(f"{shared} source → {','.join(map(str, c.kv_consumers))}")
    if c.lora_attn or c.lora_mlp:
        lines.append(f"LoRA {c.lora_attn}/{c.lora_mlp}")
    if c.depth_share is not None:  # per-token recursion: how many of the tokens run this layer
        lines.append(f"runs {c.depth_share:.0%} of tokens")
    return lines


def _letter(block: int) -> str:
    """Tying group as a letter: A, B, ... Z, AA, AB, ..."""
    s = ""
    block += 1
    while block:
        block, rem = divmod(block - 1, 26)
        s = chr(65 + rem) + s
    return "block " + s


# ---- MLP taper -------------------------------------------------------------------------------
def render_taper(info: TaperInfo) -> Figure | None:
    if not info.lines:
        return None
    fig = new_figure(11, 4.2)
    ax = fig.add_subplot()
    colours = trial_colours([n for n, _, _ in info.lines])
    L = max(len(w) for _, _, w in info.lines)
    for n, text, widths in info.lines:
        ax.plot(range(len(widths)), widths, marker="o", lw=2, color=colours[n], label=text)
    if info.reference_width:
        ax.axhline(info.reference_width, color="0.35", ls="--", lw=1.2,
                   label=f"uniform reference (d_ff = {info.reference_width})")
    ax.set_xticks(range(L), [str(i) for i in range(L)])
    ax.set_xlabel("layer (input → output)")
    ax.set_ylabel("MLP width (hidden units)")
    ax.set_ylim(bottom=0)
    ax.set_title("MLP width by depth of the front trials", fontsize=13, loc="left")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)
    return fig


# ---- parameter importance --------------------------------------------------------------------
def render_importance(info: ImportanceInfo) -> Figure | None:
    shown = [(name, imp) for name, imp in info.per_objective if imp]
    if not shown:
        return None
    n_params = max(len(imp) for _, imp in shown)
    fig = new_figure(11, 1.2 + 0.38 * n_params)
    axes = fig.subplots(1, len(shown), squeeze=False)[0]
    for ax, (name, imp) in zip(axes, shown, strict=True):
        items = sorted(imp.items(), key=lambda kv: kv[1])
        ax.barh([info.labels.get(k, k) for k, _ in items], [v for _, v in items], color=SEARCHED)
        for j, (_, v) in enumerate(items):
            ax.text(v, j, f" {v:.2f}", va="center", fontsize=8)
        ax.set_xlim(0, max(v for _, v in items) * 1.2 or 1)
        ax.set_xlabel("importance (PED-ANOVA, sums to 1)")
        ax.set_title(f"for {axis(name)[0]}", fontsize=11, loc="left")
    fig.suptitle(f"Parameter importance ({info.n_trials} full-fidelity searched trials)", fontsize=13, x=0.01, ha="left")
    return fig


# ---- learning curves -------------------------------------------------------------------------
def render_curves(info: CurvesInfo) -> Figure | None:
    if not info.curves:
        return None
    fig = new_figure(11, 4.2)
    ax = fig.add_subplot()
    colours = trial_colours([n for n, _, _, _ in info.curves])
    for n, text, steps, losses in info.curves:
        ax.plot(steps, losses, marker="o", ms=4, lw=1.8, color=colours[n], label=text)
    if info.max_fidelity:
        ax.axvline(info.max_fidelity, color="0.6", ls=":", lw=1, label=f"full fidelity ({info.max_fidelity} steps)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("training step")
    ax.set_ylabel(axis("val_loss")[0])  # the curve attr always records val_loss
    ax.set_title("Learning curves of the front trials", fontsize=13, loc="left")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)
    return fig


def _tau_text(iv: dict | None) -> str:
    if not iv or iv.get("value") is None:
        return "-"
    if iv.get("low") is None:
        return f"{iv['value']:.2f}"
    return f"{iv['value']:.2f} [{iv['low']:.2f}, {iv['high']:.2f}]"


def render_fidelity(info: FidelityInfo) -> Figure | None:
    if not info.points:
        return None
    fig = new_figure(8.5, 5.2)
    ax = fig.add_subplot()
    for front in (False, True):
        pts = [p for p in info.points if p[6] == front]
        if not pts:
            continue
        x = [p[2] for p in pts]
        y = [p[3] for p in pts]
        err = [[p[3] - p[4] if p[4] is not None else 0.0 for p in pts],
               [p[5] - p[3] if p[5] is not None else 0.0 for p in pts]]
        ax.errorbar(x, y, yerr=err, fmt="o", ms=6, capsize=3, color=FRONT if front else SEARCHED,
                    label="front point" if front else "other validated trial")
    _label_points(ax, [((p[2], p[3]), p[1], None) for p in info.points])
    snr = "-" if info.snr is None else f"{info.snr:.2f}"
    ax.set_title(f"Proxy vs validated ({info.recipe}, {info.split} split): Kendall τ all {_tau_text(info.tau_all)}, "
                 f"front {_tau_text(info.tau_front)}; SNR {snr}", fontsize=10, loc="left")
    ax.set_xlabel("proxy loss (search)")
    ax.set_ylabel(f"validated loss, seed mean ± 95% ({info.split} split)")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=9, frameon=False)
    return fig
