"""Study dashboards: a static HTML report (`write_report`) and, optionally, live optuna-dashboard.

`info` and `allocations` compute what each figure shows (pure, tested), `render` draws it with matplotlib (Agg),
`report` assembles one self-contained HTML page with the figures embedded as base64 PNG.
"""

from __future__ import annotations

from npas.presentation.dashboard.allocations import AllocationInfo, TaperInfo, allocation_info, taper_info
from npas.presentation.dashboard.info import (
    CurvesInfo,
    HypervolumeInfo,
    ImportanceInfo,
    ParetoInfo,
    ReferenceMark,
    SummaryInfo,
    curves_info,
    hypervolume_info,
    importance_info,
    pareto_info,
    summary_info,
    trials_frame,
)
from npas.presentation.dashboard.report import report_html, write_report

__all__ = [
    "AllocationInfo",
    "CurvesInfo",
    "HypervolumeInfo",
    "ImportanceInfo",
    "ParetoInfo",
    "ReferenceMark",
    "SummaryInfo",
    "TaperInfo",
    "allocation_info",
    "curves_info",
    "hypervolume_info",
    "importance_info",
    "pareto_info",
    "report_html",
    "summary_info",
    "taper_info",
    "trials_frame",
    "write_report",
]
