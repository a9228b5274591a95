"""`npas front` and the end of `npas search | resume`: a study's Pareto front printed, with the trials that
fill less of the budget and the rungs the front was read from."""

from __future__ import annotations

import json
import math


def print_front(study, fmt: str = "table") -> None:
    """The study's Pareto front as a table (csv, json), its under-filled trials, and the rungs it was read from."""
    from npas.presentation.cli.units import humanize
    from npas.service.study.studies import front_frame

    df = front_frame(study)
    if fmt == "csv":
        print(df.to_csv(index=False), end="")
    elif fmt == "json":
        print(json.dumps(json.loads(df.to_json(orient="records")), indent=2))
    elif df.empty:
        print(f"study {study.study_name}: no complete full-fidelity trial within budget yet")
        _print_rungs(study)
    else:
        print(f"Pareto front of study {study.study_name} ({len(df)} trials):")
        shown = _mean_pm_std(df).drop(columns=["hash", "loss_std", "seeds", "under_filled", "short"])
        if "lr_factor" in shown.columns:  # a factor of the fair rate: x2, x0.5
            shown["lr_factor"] = [f"×{v:g}" for v in shown["lr_factor"]]
        shown["fill"] = [_fill_cell(f, under) for f, under in zip(df["fill"], df["under_filled"], strict=True)]
        print(humanize(shown).to_string(index=False))
        for line in _under_filled_lines(df):
            print(line)
        seeds = int(df["seeds"].min())
        print(f"loss: mean ± std over {seeds} seeds per trial" if seeds > 1 else
              "loss: one seed per trial, so its seed noise is unknown (—); search with --repeats 2 or more to see it")
        if "lr_factor" in df.columns:
            print("lr_factor: each trial's learning rate located at the ladder's locating rung (the highest at or "
                  "below T/4, else the first), as a factor of the recipe's fair rate; `npas export` writes it and "
                  "`npas train` applies it")
        _print_rungs(study)


def _print_rungs(study) -> None:
    """How many trials the front is read from, the rung-to-rung agreement of the promoted ones, and for
    a ladder search how many went on at each rung and what it spent (a multiple of N·T)."""
    from npas.service.study.compute import ladder_compute
    from npas.service.study.rungs import summary

    s = summary(study)
    print(f"front read at the top rung: {s.reached_line()}")
    for line in s.agreement_lines():
        print(line)
    if (spent := ladder_compute(study)) is not None:
        print(spent.line())


def _fill_cell(fill: float | None, under: bool) -> str:
    """Stored / budget to three decimals, marked `!` under the fill target."""
    if fill is None or not math.isfinite(fill):
        return "—"
    return f"{fill:.3f}" + (" !" if under else "")


def _under_filled_lines(df) -> list[str]:
    """One line per front trial under the fill target: it competes with less of the budget than the
    others, and says why (its shapes, or an older fit that sampled it)."""
    from npas.allocation.fill import FILL_TARGET, FIT_VERSION, fill_note

    out = []
    for rec in df[df["under_filled"]].to_dict("records"):
        # the fit_version column is there only when some front trial was sampled by an older fit
        why = fill_note(rec["fill"], int(rec.get("fit_version", FIT_VERSION)), rec["short"])
        out.append(f"! trial {rec['trial']} stores {rec['fill']:.1%} of the budget (under {FILL_TARGET:g}): {why}")
    return out


def _mean_pm_std(df):
    """The table's loss column as `mean ± std` over each trial's seeds, `mean ± —` with one seed
    (csv and json keep the mean and `loss_std` as separate numbers)."""
    from npas.allocation.space import LOSS_OBJECTIVES

    out = df.copy()
    loss = next((c for c in out.columns if c in LOSS_OBJECTIVES), None)
    if loss is not None:
        out[loss] = [f"{m:.4f} ± " + ("—" if s is None or not math.isfinite(s) else f"{s:.4f}")
                     for m, s in zip(out[loss], out["loss_std"], strict=True)]
    return out
