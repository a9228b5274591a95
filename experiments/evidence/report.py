"""What the evidence scripts print and write: fixed-width tables (``format_table``, the harness's), the
JSON of a report (non-finite floats as null) and its matplotlib figure."""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the bench harness, when a script runs from experiments/evidence
    sys.path.insert(0, str(ROOT))

from experiments.harness.report import format_table  # noqa: E402  (the harness's, used by every evidence table)

if TYPE_CHECKING:
    from common import Setup


def fmt_interval(interval) -> str:
    """`+0.0123 [-0.0040, +0.0286]`, or the mean alone without an interval."""
    if interval.value is None:
        return "-"
    if interval.low is None:
        return f"{interval.value:+.4f} [no interval]"
    return f"{interval.value:+.4f} [{interval.low:+.4f}, {interval.high:+.4f}]"


def fmt_pm(m: float, s: float, digits: int = 4) -> str:
    if math.isnan(m):
        return "-"
    return f"{m:.{digits}f} ± {s:.{digits}f}" if not math.isnan(s) else f"{m:.{digits}f} ± -"


def result_table(summary: list[dict[str, Any]], acc: dict[str, dict[str, Any]], ref: str | None,
                 extra: dict[str, dict[str, str]] | None = None) -> str:
    """The main table: config, stored params, FLOPs ratio, val loss mean +- std, paired delta to ref."""
    extra = extra or {}
    extra_cols = sorted({k for v in extra.values() for k in v})
    headers = ["config", *extra_cols, "stored params", "FLOPs xref", "val loss (nats)", f"Δ vs {ref or '-'}",
               "wins", "seeds", "s/run"]
    rows = []
    for r in summary:
        a = acc.get(r["name"], {})
        delta = fmt_pm(r.get("delta_mean", math.nan), r.get("delta_std", math.nan)) if ref and r["name"] != ref \
            else "-"
        wins = f"{r.get('wins', 0)}/{r['n']}" if ref and r["name"] != ref and "wins" in r else "-"
        rows.append([r["name"], *(extra.get(r["name"], {}).get(k, "") for k in extra_cols),
                     f"{a.get('stored_params', 0):,}", f"{a.get('flops_ratio', math.nan):.3f}",
                     fmt_pm(r["mean"], r["std"]), delta, wins, r["n"], f"{r['wall_s']:.0f}"])
    return format_table(headers, rows)


def print_results(setup: Setup, results: list[dict[str, Any]], names: Sequence[str], ref: str,
                  acc: dict[str, dict[str, Any]], extra: dict[str, dict[str, str]] | None = None) -> list[dict[str, Any]]:
    """An experiment's main table under its legend: ``stats.summarize`` of ``results`` over ``names``, each
    paired to ``ref`` (``result_table``'s columns, with ``extra``'s); returns the summary."""
    import stats  # stats formats its intervals with this module: imported here, not at the top

    summary = stats.summarize(results, names, ref)
    print(f"\nresults: val loss after {setup.recipe.steps} steps, mean ± std over {len(setup.seeds)} seed(s); "
          f"Δ is the paired same-seed difference to {ref} (negative = better)")
    print(result_table(summary, acc, ref, extra))
    return summary


def save_json(setup: Setup, payload: dict[str, Any]) -> Path:
    path = setup.out_dir / f"{setup.name}{'_quick' if setup.quick else ''}.json"
    payload = {"experiment": setup.name, "quick": setup.quick, "chassis": setup.chassis.to_dict(),
               "recipe": setup.recipe.to_dict(), "seeds": list(setup.seeds), "wall_s": round(setup.elapsed(), 1),
               "cpu_count": os.cpu_count(), **payload}
    path.write_text(json.dumps(json_safe(payload), indent=1, default=str, allow_nan=False))
    print(f"wrote {path}")
    return path


def json_safe(o: Any) -> Any:
    """JSON-safe copy: non-finite floats become null, tuples lists, keys strings."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {str(k): json_safe(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [json_safe(v) for v in o]
    return o


def figure_path(setup: Setup) -> Path:
    return setup.fig_dir / f"{setup.name}{'_quick' if setup.quick else ''}.png"


def save_figure(setup: Setup, fig) -> Path:
    path = figure_path(setup)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")
    return path


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def loss_bars(ax, setup: Setup, summary: Sequence[dict[str, Any]]) -> None:
    """Mean val loss per config as bars (± std over seeds), each seed's loss as a dot, the y axis
    zoomed to the seeds' range: the comparison panel several scripts draw."""
    names = [r["name"] for r in summary]
    ax.bar(names, [r["mean"] for r in summary], yerr=[0 if r["std"] != r["std"] else r["std"] for r in summary],
           capsize=4, color=[f"C{k}" for k in range(len(names))])
    for r in summary:
        for v in r["per_seed"].values():
            ax.plot(names.index(r["name"]), v, "k.", ms=4)
    vals = [v for r in summary for v in r["per_seed"].values()]
    if vals:
        lo, hi = min(vals), max(vals)
        ax.set_ylim(lo - 0.3 * (hi - lo + 1e-3), hi + 0.3 * (hi - lo + 1e-3))
    ax.set(ylabel="val loss (nats/char)",
           title=f"{setup.recipe.steps} steps, {len(setup.seeds)} seed(s): mean ± std, dots = seeds")
    if sum(len(n) for n in names) > 40:  # arm names like "scratch_lineage" would overlap side by side
        ax.tick_params(axis="x", labelrotation=20)
        for label in ax.get_xticklabels():
            label.set_horizontalalignment("right")


def claim_bars(ax, claims: Sequence[dict[str, Any]], reproduced: Sequence[bool], labels: Sequence[str],
               margin: float | None = None, fontsize: float | None = None) -> None:
    """The claims panel several scripts draw: each claim's paired interval as a horizontal error bar on row
    k (orange when reproduced, red otherwise; a claim without an interval is left out), labelled
    ``labels[k]``, with the zero line, a parity ``margin`` line when given, and the axis titles."""
    for k, (c, ok) in enumerate(zip(claims, reproduced, strict=True)):
        iv = c["interval"]
        if iv["value"] is None:
            continue
        err = [[iv["value"] - iv["low"]], [iv["high"] - iv["value"]]] if iv["low"] is not None else None
        ax.errorbar([iv["value"]], [k], xerr=err, fmt="o", capsize=4, color="C1" if ok else "C3")
    ax.axvline(0, color="k", lw=1)
    if margin is not None:
        ax.axvline(margin, color="k", lw=1, ls=":", label=f"parity margin +{margin}")
    ax.set_yticks(range(len(labels)), labels, fontsize=fontsize)
    ax.set(xlabel="paired Δ val loss (nats/char), 95% t-interval", title="claims (orange: reproduced)")


def finish(setup: Setup) -> None:
    print(f"wall: {setup.elapsed():.1f} s ({setup.name}, {'quick' if setup.quick else 'full'})", flush=True)


