"""Knob specs: how a YAML value becomes a fixed value, a categorical choice or a numeric range.

In a search-space file every knob is written one of three ways:
    ratio: 2.0                          fixed (never searched)
    ratio: [1.0, 2.0, 3.0]              categorical choice
    ratio: {low: 1.0, high: 4.0}        range (ints if both bounds are ints; `step`, `log` optional)
Parsing collects problems into a list instead of raising, so a whole file is checked in one pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from npas.errors import closest as closest  # re-exported: recipes and plans name their keys with it

if TYPE_CHECKING:  # optuna only types a trial here; training code imports this module without it
    import optuna


@dataclass(frozen=True)
class Knob:
    """One searchable value. `suggest` maps an Optuna trial to a value (define-by-run)."""

    kind: str  # fixed | choice | int | float
    values: tuple = ()  # fixed: (value,), choice: the choices
    low: float = 0.0
    high: float = 0.0
    step: float | None = None
    log: bool = False

    @property
    def searched(self) -> bool:
        return self.kind != "fixed" and not (self.kind == "choice" and len(self.values) == 1)

    @property
    def default(self) -> Any:
        """The value a reference model uses: the fixed value, the first choice, or the low bound."""
        if self.kind in ("fixed", "choice"):
            return self.values[0]
        return int(self.low) if self.kind == "int" else self.low

    def options(self) -> list[Any]:
        """Every value the knob can take where that is a finite list (choices, int ranges)."""
        if self.kind in ("fixed", "choice"):
            return list(self.values)
        if self.kind == "int":
            return list(range(int(self.low), int(self.high) + 1, int(self.step or 1)))
        return [self.low, self.high]

    def suggest(self, trial: optuna.Trial, name: str) -> Any:
        if not self.searched:
            return self.values[0]
        if self.kind == "choice":
            return trial.suggest_categorical(name, list(self.values))
        if self.kind == "int":
            return trial.suggest_int(name, int(self.low), int(self.high), step=int(self.step or 1), log=self.log)
        return trial.suggest_float(name, self.low, self.high, step=self.step, log=self.log)


def check_keys(where: str, data: dict, allowed: tuple[str, ...], problems: list[str]) -> None:
    """Report every key of `data` that is not in `allowed`, naming the allowed ones and the closest."""
    for key in data:
        if key not in allowed:
            problems.append(f"{where}.{key}: unknown key; allowed: {', '.join(allowed)}{closest(key, allowed)}")


def parse_knob(where: str, raw: Any, problems: list[str], *, kind: type, allowed: tuple | None = None,
               low: float | None = None, high: float | None = None, fixed_only: bool = False) -> Knob | None:
    """Parse one knob; append a problem (naming path, value, allowed values) and return None if bad.

    `fixed_only` knobs are settings, never searched: a list or range is refused rather than read.
    """

    def bad_value(v: Any) -> str | None:
        if kind is bool:
            return None if isinstance(v, bool) else f"{where}: {v!r} is not true/false"
        if kind is str:
            if not isinstance(v, str):
                return f"{where}: {v!r} is not a name"
            if allowed is not None and v not in allowed:
                return f"{where}: unknown value {v!r}; allowed: {', '.join(allowed)}{closest(v, allowed)}"
            return None
        if isinstance(v, bool) or not isinstance(v, int | float) or (kind is int and not isinstance(v, int)):
            return f"{where}: {v!r} is not {'an integer' if kind is int else 'a number'}"
        if not math.isfinite(v):
            return f"{where}: {v!r} is not a finite number"
        if (low is not None and v < low) or (high is not None and v > high):
            return f"{where}: {v!r} is out of range [{low}, {high}]"
        return None

    if fixed_only and isinstance(raw, dict | list):
        problems.append(f"{where}: takes one fixed value, got {raw!r}; it is never searched")
        return None
    if isinstance(raw, dict):
        if kind not in (int, float):
            problems.append(f"{where}: ranges apply to numbers only; list the choices instead")
            return None
        before = len(problems)
        check_keys(where, raw, ("low", "high", "step", "log"), problems)
        if "low" not in raw or "high" not in raw:
            problems.append(f"{where}: a range needs both low and high, got {raw!r}")
            return None
        for bound in ("low", "high"):
            msg = bad_value(raw[bound])
            if msg:
                problems.append(msg)
        if len(problems) > before:
            return None
        if raw["low"] > raw["high"]:
            problems.append(f"{where}: low <= high must hold, got low={raw['low']}, high={raw['high']}")
            return None
        is_int = kind is int or (isinstance(raw["low"], int) and isinstance(raw["high"], int))
        log, step = raw.get("log", False), raw.get("step")
        if not isinstance(log, bool):
            problems.append(f"{where}.log: {log!r} is not true/false")
        elif log and raw["low"] <= 0:
            problems.append(f"{where}: a log range needs low > 0, got {raw['low']}")
        if step is not None:
            if is_int and not (isinstance(step, int) and not isinstance(step, bool) and step >= 1):
                problems.append(f"{where}.step: an integer range needs a whole step >= 1, got {step!r}")
            elif not is_int and (isinstance(step, bool) or not isinstance(step, int | float)
                                 or not math.isfinite(step) or step <= 0):
                problems.append(f"{where}.step: must be a number > 0, got {step!r}")
            elif log is True:
                problems.append(f"{where}: step and log cannot be combined (Optuna samples a log range "
                                f"continuously); drop one")
        if len(problems) > before:
            return None
        return Knob("int" if is_int else "float", low=raw["low"], high=raw["high"], step=step, log=log)
    if isinstance(raw, list):
        if not raw:
            problems.append(f"{where}: an empty list of choices; give at least one value")
            return None
        msgs = [m for m in (bad_value(v) for v in raw) if m]
        problems.extend(msgs)
        if len(set(map(repr, raw))) != len(raw):
            problems.append(f"{where}: duplicate choices in {raw!r}")
            return None
        return None if msgs else Knob("choice", values=tuple(raw))
    msg = bad_value(raw)
    if msg:
        problems.append(msg)
        return None
    return Knob("fixed", values=(raw,))
