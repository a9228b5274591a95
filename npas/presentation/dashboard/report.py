"""The HTML report: one self-contained file, figures embedded as base64 PNG, no network needed.

`write_report(study, out_dir)` is cheap enough to call after every trial (about a second for fifty
trials): importances are skipped below `IMPORTANCE_MIN_TRIALS`, and the file is replaced
atomically, so a browser reloading mid-search never reads half a page.
"""

from __future__ import annotations

import base64
import html
import logging
import math
import os
import time
from pathlib import Path

import optuna

from npas.allocation.fill import fill_note
from npas.presentation.dashboard import allocations as A
from npas.presentation.dashboard import info as I
from npas.presentation.dashboard import render as R
from npas.presentation.dashboard import rungs as G
from npas.version import __version__

log = logging.getLogger(__name__)


def write_report(study: optuna.Study, out_dir: str | Path) -> Path:
    """Write `out_dir/index.html` for `study` and return its path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "index.html"
    tmp = out / f".index.html.{os.getpid()}.tmp"
    tmp.write_text(report_html(study), encoding="utf-8")
    os.replace(tmp, path)
    return path


def snapshot(study: optuna.Study) -> optuna.Study:
    """An in-memory copy of the study: one database read instead of one per figure (a storage
    read of every trial is the largest cost of a report), and a consistent view while trials finish."""
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "study created in memory" line per report
    try:
        copy = optuna.create_study(study_name=study.study_name, directions=study.directions)
    finally:
        optuna.logging.set_verbosity(verbosity)
    if study.metric_names:
        copy.set_metric_names(list(study.metric_names))
    for k, v in study.user_attrs.items():
        copy.set_user_attr(k, v)
    copy.add_trials(study.get_trials(deepcopy=False))  # numbers are kept: trials come in number order
    return copy


def report_html(study: optuna.Study) -> str:
    t0 = time.perf_counter()
    study = snapshot(study)
    summary = I.summary_info(study)
    pareto, hv = I.pareto_info(study), I.hypervolume_info(study)
    alloc, taper, curves = A.allocation_info(study), A.taper_info(study), I.curves_info(study)
    importance = I.importance_info(study)
    fidelity = I.fidelity_info(study)
    ladder = G.rungs_info(study)
    frame = I.trials_frame(study)
    sections = [
        _section("front", "Pareto front", R.render_pareto(pareto), _pareto_caption(pareto),
                 "no complete trial yet: nothing to plot"),
        _section("hypervolume", "Hypervolume", R.render_hypervolume(hv), _hv_caption(hv), hv.note),
        _section("allocation", "Allocation map", R.render_allocation(alloc), ALLOC_CAPTION, alloc.note),
        _section("taper", "MLP taper", R.render_taper(taper),
                 "MLP hidden width of each layer for the front trials; the dashed line is the uniform width of "
                 "the reference chassis. Tapers keep the mean width; narrower chassis show up as lower lines.",
                 taper.note),
        _section("importance", "Parameter importance", R.render_importance(importance),
                 _importance_caption(importance), "; ".join(sorted(set(importance.notes.values()))) or None),
        _section("curves", "Learning curves", R.render_curves(curves),
                 "Validation loss at each evaluation of the front trials, as recorded in their `curve` attribute.",
                 curves.note),
        _section("rungs", "Rungs", G.render_rungs(ladder), G.caption(ladder), ladder.note),
        _section("fidelity", "Proxy vs validated", R.render_fidelity(fidelity),
                 "Each point is a trial retrained by `npas validate` with a longer recipe on fresh seeds: its proxy "
                 "loss against its validated seed-mean loss with a 95% t-interval over seeds. Points in the proxy's "
                 "order rise left to right; error bars that overlap cannot be told apart. An SNR near 1 means the "
                 "differences are seed noise.", fidelity.note),
        _table_section(frame, pareto.front, summary.objectives),
    ]
    log.debug("report for %s built in %.2fs", study.study_name, time.perf_counter() - t0)
    return PAGE.format(title=_e(f"npas · {summary.study_name}"), style=STYLE, head_script=HEAD_SCRIPT,
                       header=_header(summary, ladder), nav=_nav(), body="\n".join(sections), script=SCRIPT)


# ---- pieces of the page ----------------------------------------------------------------------
def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


def _img(fig, alt: str) -> str:
    data = base64.b64encode(R.png(fig)).decode("ascii")
    w, h = (int(v * fig.dpi) for v in fig.get_size_inches())
    return f'<img src="data:image/png;base64,{data}" alt="{_e(alt)}" width="{w}" height="{h}">'


def _section(anchor: str, title: str, fig, caption: str, note: str | None) -> str:
    parts = [f'<section id="{anchor}"><h2>{_e(title)}</h2>']
    if fig is not None:
        parts.append(f'<p class="caption">{_e(caption)}</p>')
        parts.append(_img(fig, title))
    elif note:  # nothing to draw: say why instead
        parts.append(f'<p class="note">{_e(note)}</p>')
    parts.append("</section>")
    return "".join(parts)


def _header(s: I.SummaryInfo, ladder: G.RungsInfo | None = None) -> str:
    facts = [f"space <b>{_e(s.space_name)}</b>", "objectives " + ", ".join(f"<b>{_e(o)}</b>" for o in s.objectives)]
    if s.budget_params is not None:
        ratio = f" = {s.budget_params / s.reference_params:.2f}× the reference" if s.reference_params else ""
        facts.append(f"budget <b>{s.budget_params:,}</b> params ({_e(s.budget_spec or '')}{ratio})")
    if s.reference_params:
        facts.append(f"reference model {s.reference_params:,} params")
    chips = "".join(f'<span class="chip status-{_e(k)}">{_e(k)} {n}</span>'
                    for k, n in sorted(s.by_status.items(), key=lambda kv: -kv[1]))
    out = [f"<header><h1>npas study <code>{_e(s.study_name)}</code></h1>",
           f'<p class="meta">{" · ".join(facts)}</p>',
           f'<p class="meta">{s.n_trials} trial(s), {s.n_complete} complete, {s.n_front} on the front {chips}</p>',
           *([f'<p class="meta" id="rung-summary">front read at the top rung: {_e(ladder.reached)}'
              + "".join(f"<br>{_e(a)}" for a in ladder.agreement) + "</p>"] if ladder is not None else []),
           f'<p class="meta small">generated {_e(time.strftime("%Y-%m-%d %H:%M:%S"))} by npas {_e(__version__)}</p>']
    if s.empty_note:
        out.append(f'<div class="notice"><b>{_e(s.empty_note)}</b>')
        if s.reasons:
            out.append("<br>Recorded reasons:<ul>" + "".join(
                f"<li>{n} × {_e(why)}</li>" for why, n in sorted(s.reasons.items(), key=lambda kv: -kv[1])[:8])
                + "</ul>")
        out.append("</div>")
    out.append("</header>")
    return "\n".join(out)


def _nav() -> str:
    links = [("front", "Pareto front"), ("hypervolume", "Hypervolume"), ("allocation", "Allocation map"),
             ("taper", "MLP taper"), ("importance", "Importance"), ("curves", "Learning curves"),
             ("rungs", "Rungs"), ("fidelity", "Proxy vs validated"), ("trials", "All trials")]
    return "<nav>" + " · ".join(f'<a href="#{a}">{_e(t)}</a>' for a, t in links) + "</nav>"


def _pareto_caption(p: I.ParetoInfo) -> str:
    text = ("Each point is one trial; lower is better on both axes. Red points joined by the staircase are the "
            "Pareto front (complete, full fidelity, within budget), labelled with their trial number. Diamonds "
            "are the hand-crafted baselines, named; faded hollow points were stopped early, so their loss is "
            "at a lower fidelity.")
    if p.reference is not None:
        text += " The dashed line is what the untied uniform reference model would cost."
    missing = sum(p.no_values.values())
    if missing:
        text += f" {missing} trial(s) have no values and are not plotted (counts in the legend)."
    return text


def _hv_caption(h: I.HypervolumeInfo) -> str:
    if not h.reference_point:
        return ""
    ref = ", ".join(_fmt_value(n, v) for n, v in zip(h.names, h.reference_point, strict=False))
    return ("Share of the box between the best value seen on each objective and the reference point "
            f"(worst value among complete full-fidelity trials × 1.1: {ref}) dominated by the feasible front, "
            "computed with Optuna's exact hypervolume. Flat stretches are trials that did not improve the front.")


def _fmt_value(name: str, v: float) -> str:
    label, div = R.axis(name)
    unit = label.rsplit("(", 1)[-1].rstrip(")") if "(" in label else ""
    return f"{name} {v / div:,.4g} {unit}".rstrip()


ALLOC_CAPTION = (
    "One row per front trial (best loss first), one column per layer. Colour: stored parameters attributed to "
    "the layer (weights shared by several layers are split evenly between them). In each cell: the tying group "
    "(the same block letter in a row means the same weights), the MLP width, the parameter banks the block's "
    "weights are generated from (hatched //), the attention projections made from shared matrix atoms and the "
    "atom count K (dotted frame, e.g. \"atoms qkvo K=3\"), cross-layer KV sharing (\"KV source → 1,2\" on the layer "
    "whose keys and values later layers reuse, \"KV ← layer 0\" on each of those; V instead of KV when only "
    "values are shared; a red bar joins each group), and the LoRA rank on attention/MLP.")


def _importance_caption(imp: I.ImportanceInfo) -> str:
    text = (f"How much each searched knob explains each objective, by optuna.importance.get_param_importances "
            f"(PED-ANOVA) on the {imp.n_trials} complete full-fidelity searched trials (baselines excluded).")
    if imp.notes:
        text += " " + "; ".join(f"{k}: {v}" for k, v in imp.notes.items())
    return text


def _table_section(frame, front: list[int], objectives: list[str]) -> str:
    on_front = set(front)
    cols: list[tuple[str, str, bool]] = [("trial", "trial", True), ("status", "status", False)]
    cols += [(o, R.axis(o)[0], True) for o in objectives]
    cols += [("stored_params", "stored params", True), ("budget_margin", "budget", True), ("fill", "fill", True),
             ("fidelity", "fidelity (steps)", True)]
    if "lr_factor" in frame.columns and frame["lr_factor"].notna().any():  # a study that located rates
        cols.append(("lr_factor", "lr factor", True))
    cols += [("baseline", "baseline", False), ("allocation", "allocation", False), ("reason", "failure reason", False)]
    head = "".join(f'<th data-type="{"num" if num else "text"}" data-key="{_e(key)}" title="click to sort">'
                   f'{_e(label)}</th>' for key, label, num in cols)
    rows = []
    for rec in frame.to_dict("records"):
        cells = []
        for key, _, _ in cols:
            sort, shown = _cell(key, rec, objectives)
            cls = f' class="status-{_e(rec["status"])}"' if key == "status" else ""
            title = f' title="{_e(rec["reason"])}"' if key == "reason" and rec["reason"] else ""
            cells.append(f'<td data-sort="{_e(sort)}"{cls}{title}>{shown}</td>')
        tr_cls = ' class="front"' if rec["trial"] in on_front else ""
        rows.append(f"<tr{tr_cls}>{''.join(cells)}</tr>")
    body = "\n".join(rows) if rows else f'<tr><td colspan="{len(cols)}">no trials yet</td></tr>'
    return (f'<section id="trials"><h2>All trials</h2><p class="caption">Click a column header to sort; click '
            f'again to reverse. Bold rows are on the Pareto front.</p>'
            f'<div class="scroll"><table class="sortable" id="trials-table"><thead><tr>{head}</tr></thead>'
            f"<tbody>\n{body}\n</tbody></table></div></section>")


def _cell(key: str, rec: dict, objectives: list[str]) -> tuple[str, str]:
    """(sort key, shown HTML) of one table cell; missing numbers sort last and show a dash."""
    v = rec.get(key)
    missing = v is None or (isinstance(v, float) and math.isnan(v))
    if key in objectives:
        if missing:
            return "", "–"
        _, div = R.axis(key)
        return repr(float(v)), f"{v / div:,.2f}" if div != 1 else f"{v:.4f}"
    if key in ("trial", "stored_params"):
        return ("", "–") if missing else (str(int(v)), f"{int(v):,}")
    if key == "budget_margin":
        if missing:
            return "", "–"
        v = int(v)
        return str(v), f'<span class="ok">✓ {v:,} to spare</span>' if v >= 0 else f'<span class="bad">✗ over by {-v:,}</span>'
    if key == "fill":  # stored / budget; under the target it competes with less of the budget than the rest
        if missing:
            return "", "–"
        f = float(v)
        why = fill_note(f, int(rec.get("fit_version") or 1), rec.get("short") or "")
        if why is None:
            return repr(f), f"{f:.3f}"
        return repr(f), f'<span class="bad under-filled" title="{_e(why)}">{f:.3f} !</span>'
    if key == "lr_factor":  # a factor of the recipe's fair rate; none located reads x1
        f = 1.0 if missing else float(v)
        return repr(f), f"×{f:g}"
    if key == "fidelity":
        if missing:
            return "", "–"
        top = rec.get("max_fidelity")
        return str(int(v)), f"{int(v)}/{int(top)}" if top is not None and not math.isnan(float(top)) else str(int(v))
    text = "" if missing else str(v)
    shown = _e(text if len(text) <= 160 else text[:157] + "…")
    return text.lower(), shown


# ---- static parts ----------------------------------------------------------------------------
PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title><style>{style}</style><script>{head_script}</script></head>
<body>
{header}
{nav}
<main>
{body}
</main>
<div id="npas-selfcheck" hidden></div>
<script>{script}</script>
</body></html>
"""

STYLE = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;margin:0;color:#222;background:#f6f7f9}
header,nav,main{max-width:1240px;margin:0 auto;padding:0 24px}
header{padding-top:20px}h1{font-size:26px;margin:0 0 6px}h1 code{background:#e8ecf2;padding:0 6px;border-radius:4px}
h2{font-size:19px;margin:0 0 4px}.meta{margin:2px 0;color:#444}.small{font-size:12px;color:#777}
nav{padding-top:8px;padding-bottom:8px;font-size:14px}nav a{color:#2a5db0;text-decoration:none}
section{background:#fff;border:1px solid #dde1e7;border-radius:8px;padding:16px 18px;margin:14px 0}
section img{max-width:100%;height:auto;display:block;margin-top:8px}
.caption{color:#555;font-size:13.5px;margin:0}.note{color:#8a5a00;background:#fff8e6;border-left:3px solid #e0a800;padding:8px 12px;margin:8px 0 0}
.notice{background:#fff3f3;border:1px solid #e5a5a5;border-radius:8px;padding:12px 16px;margin:12px 0}
.chip{display:inline-block;font-size:12px;padding:1px 8px;border-radius:10px;background:#e8ecf2;margin-left:6px}
.status-ok{color:#1b7f3b}.status-failed,.status-orphaned{color:#b42318}.status-stopped{color:#6b7280}
.status-infeasible,.status-duplicate,.status-surplus,.status-interrupted{color:#9a6700}
.scroll{overflow-x:auto;margin-top:8px}table{border-collapse:collapse;font-size:13px;width:100%}
th,td{padding:4px 8px;border-bottom:1px solid #e6e8ec;text-align:left;vertical-align:top}
th{background:#eef1f5;cursor:pointer;user-select:none;position:sticky;top:0}
th[data-dir=asc]::after{content:" ▲"}th[data-dir=desc]::after{content:" ▼"}
td[data-sort]{white-space:nowrap}td:last-child,td:nth-last-child(2){white-space:normal;min-width:180px;max-width:360px}
tr.front td{font-weight:600;background:#fff5f5}.ok{color:#1b7f3b}.bad{color:#b42318}
"""

# Runs before anything else: collects script errors and failed loads for the page self-check.
HEAD_SCRIPT = """window.npasErrors=[];window.addEventListener("error",function(e){
window.npasErrors.push(e.message||("failed to load "+((e.target&&(e.target.src||e.target.href))||"?").slice(0,80)));},true);"""

SCRIPT = """
function npasSort(table, col, th) {
  const body = table.tBodies[0], rows = Array.from(body.rows), num = th.dataset.type === "num";
  const asc = th.dataset.dir !== "asc";
  table.querySelectorAll("th").forEach(h => delete h.dataset.dir);
  th.dataset.dir = asc ? "asc" : "desc";
  const key = r => (r.cells[col] ? r.cells[col].dataset.sort : "") || "";
  rows.sort((a, b) => {
    const x = key(a), y = key(b);
    if (x === "" || y === "") return (x === "") - (y === "");  // blanks last either way
    const d = num ? parseFloat(x) - parseFloat(y) : x.localeCompare(y);
    return asc ? d : -d;
  });
  rows.forEach(r => body.appendChild(r));
}
document.querySelectorAll("table.sortable").forEach(table =>
  table.querySelectorAll("th").forEach((th, col) => th.addEventListener("click", () => npasSort(table, col, th))));
window.addEventListener("load", () => {
  const out = document.getElementById("npas-selfcheck"), imgs = Array.from(document.images);
  if (location.hash === "#selfcheck-sort") {  // tests: sort by the first objective, record the order
    const th = document.querySelectorAll("#trials-table th")[2];
    if (th) th.click();
    out.dataset.sorted = Array.from(document.querySelectorAll("#trials-table tbody tr"))
      .map(r => r.cells[0].dataset.sort).join(",");
  }
  out.dataset.images = imgs.length;
  out.dataset.imagesOk = imgs.filter(i => i.complete && i.naturalWidth > 0).length;
  out.dataset.errors = JSON.stringify(window.npasErrors);
  out.dataset.done = "1";
});
"""
