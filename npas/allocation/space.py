"""Search spaces: YAML files saying where and how parameters may be shared, and sampling from them.

`load_space(path)` validates the whole file and raises one `SpaceError` listing every problem.
`space.sample(trial)` maps an Optuna trial (define-by-run) to a `Candidate`: the knob values, and
the allocation fitted to the budget by construction, or the reason nothing fits. Sampling never
builds a model; it only counts.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import optuna
import yaml

from npas.allocation.budget import parse_budget, reference_params
from npas.allocation.config import DTYPE_BYTES, ArchConfig, Chassis
from npas.allocation.fit import (
    BANK_RULES,
    GENERATORS,
    TAPERS,
    TYING,
    Fit,
    bank_members,
    fit_banks,
    fit_width,
    taper_profile,
    tying_map,
)
from npas.allocation.knobs import Knob, check_keys, parse_knob
from npas.errors import BudgetError, SpaceError

OBJECTIVES = ("val_loss", "val_bpc", "param_bytes", "train_memory_bytes", "inference_bytes", "flops_per_token",
              "peak_memory_bytes")
LOSS_OBJECTIVES = ("val_loss", "val_bpc")
TOP_KEYS = ("name", "description", "chassis", "budget", "dtype", "objectives", "recipe", "fit", "knobs")
CHASSIS_KEYS = ("vocab_size", "context", "d_model", "n_layers", "n_heads", "d_ff", "activation")
KNOB_SECTIONS = ("taper", "tying", "pools", "relaxation", "untied_norms")
SECTION_KEYS = {
    "taper": ("schedule", "ratio"),
    "tying": ("mode", "unique_blocks", "groups"),
    "pools": ("enabled", "rule", "banks", "generator", "templates", "groups"),
    "relaxation": ("rank", "targets", "per_position"),
}
LORA_TARGETS = ("attn", "mlp", "both")
BASELINES: dict[str, dict[str, Any]] = {
    # hand-crafted sharing every front is compared against: what sharing by hand gives at the same budget
    "narrow_untied": {"taper": "uniform", "tying": "none", "pools": False, "width_fit": "all"},
    "full_tying": {"taper": "uniform", "tying": "all", "pools": False, "lora_rank": 0, "untied_norms": True},
    "cycle_tying": {"taper": "uniform", "tying": "cycle", "pools": False, "lora_rank": 0, "untied_norms": True},
}


@dataclass(frozen=True)
class Candidate:
    """A sampled point: its knob values and the fitted allocation (or why none fits)."""

    values: dict[str, Any]
    fit: Fit
    budget: int

    @property
    def feasible(self) -> bool:
        return self.fit.config is not None

    @property
    def config(self) -> ArchConfig | None:
        return self.fit.config

    @property
    def reason(self) -> str | None:
        return self.fit.reason

    @property
    def fill(self) -> float:
        """stored / budget: how much of the budget the fitted allocation uses."""
        return self.fit.stored / self.budget if self.feasible else 0.0


@dataclass(frozen=True)
class Space:
    """A validated search space. Plain data plus `sample`; see search_spaces/*.yaml for the format."""

    name: str
    text: str  # the YAML as written, stored in the study so a resume can check it is unchanged
    source: str
    chassis: dict[str, Knob]
    budget_spec: str
    dtype: str
    objectives: tuple[str, ...]
    recipe: str
    knobs: dict[str, Knob]
    width_fit: str = "all"
    max_width_scale: float = 4.0
    max_templates: int = 64
    tying_groups: tuple[tuple[int, ...], ...] | None = None
    bank_groups: tuple[tuple[int, ...], ...] | None = None
    per_position: bool = False
    description: str = ""
    overrides: dict[str, Any] = field(default_factory=dict)  # vocab_size / budget bound at launch

    # ---- reference and budget ----------------------------------------------------------------
    @property
    def reference_chassis(self) -> Chassis:
        return Chassis(**{k: kn.default for k, kn in self.chassis.items()})

    @cached_property
    def reference_params(self) -> int:
        return reference_params(self.reference_chassis)

    @cached_property
    def budget_params(self) -> int:
        """The cap in stored parameters (relative budgets resolve against the reference model)."""
        return parse_budget(self.budget_spec, self.reference_params)

    @property
    def hash(self) -> str:
        """Hash of the file text plus launch overrides: what a resume must find unchanged."""
        key = self.text + repr(sorted(self.overrides.items()))
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    def bind(self, *, vocab_size: int | None = None, budget: str | None = None) -> Space:
        """A copy bound to a corpus vocabulary and/or a budget given on the command line."""
        chassis, over, spec = dict(self.chassis), dict(self.overrides), self.budget_spec
        if vocab_size is not None:
            chassis["vocab_size"] = Knob("fixed", values=(int(vocab_size),))
            over["vocab_size"] = int(vocab_size)
        if budget is not None:
            parse_budget(budget, self.reference_params)  # fail now, with the budget's own message
            spec = str(budget)
            over["budget"] = spec
        bound = replace(self, chassis=chassis, budget_spec=spec, overrides=over)
        if short := below_embeddings(bound.reference_chassis, spec, bound.budget_params):
            raise BudgetError(short)
        return bound

    # ---- sampling ----------------------------------------------------------------------------
    def sample(self, trial: optuna.Trial, fixed: dict[str, Any] | None = None) -> Candidate:
        """Define-by-run: suggest each knob that applies (values in `fixed` are used as given)."""
        fixed = fixed or {}
        values: dict[str, Any] = {}

        def pick(name: str, knob: Knob | None, default: Any = None) -> Any:
            if name in fixed:
                values[name] = fixed[name]
            elif knob is None:
                values[name] = default
            else:
                values[name] = knob.suggest(trial, name)
            return values[name]

        for name, knob in self.chassis.items():
            pick(name, knob)
        L = values["n_layers"]
        if pick("taper", self.knobs.get("taper"), "uniform") != "uniform":
            pick("taper_ratio", self.knobs.get("taper_ratio"), 2.0)
        mode = pick("tying", self.knobs.get("tying"), "none")
        if mode in ("sequential", "cycle", "middle_loop"):
            pick("unique_blocks", self.knobs.get("unique_blocks"), max(3 if mode == "middle_loop" else 2, L // 2))
        if mode != "none":
            if self.per_position:
                for i in range(L):
                    pick(f"lora_rank_{i}", self.knobs.get("lora_rank"), 0)
            else:
                pick("lora_rank", self.knobs.get("lora_rank"), 0)
            if any(values.get(k) for k in values if k.startswith("lora_rank")):
                pick("lora_targets", self.knobs.get("lora_targets"), "both")
            pick("untied_norms", self.knobs.get("untied_norms"), True)
        if pick("pools", self.knobs.get("pools"), False):
            pick("bank_rule", self.knobs.get("bank_rule"), "by_type")
            pick("n_banks", self.knobs.get("n_banks"), 1)
            if pick("generator", self.knobs.get("generator"), "template_mix") == "template_mix":
                pick("templates", self.knobs.get("templates"), 2)
        if "width_fit" in fixed:
            values["width_fit"] = fixed["width_fit"]
        return self.candidate(values)

    def candidate(self, values: dict[str, Any]) -> Candidate:
        """Pure: knob values -> fitted allocation. Same values, same allocation, on any machine."""
        budget = self.budget_params
        try:
            chassis = Chassis(**{k: values[k] for k in CHASSIS_KEYS})
            problems = chassis.problems()
            if problems:
                return Candidate(values, Fit(None, "; ".join(problems)), budget)
            L = chassis.n_layers
            profile = taper_profile(values["taper"], L, float(values.get("taper_ratio", 1.0)))
            groups = [list(g) for g in self.tying_groups] if self.tying_groups else None
            blocks = tying_map(values["tying"], L, int(values.get("unique_blocks") or 1), groups)
        except ValueError as e:
            return Candidate(values, Fit(None, str(e)), budget)
        shared = [blocks.count(b) > 1 for b in blocks]
        targets = values.get("lora_targets", "both")
        ranks = [int(values.get(f"lora_rank_{i}", values.get("lora_rank", 0)) or 0) if shared[i] else 0
                 for i in range(L)]
        lora_attn = tuple(r if targets in ("attn", "both") else 0 for r in ranks)
        lora_mlp = tuple(r if targets in ("mlp", "both") else 0 for r in ranks)

        def make(ch: Chassis, widths: tuple[int, ...]) -> ArchConfig:
            return ArchConfig(chassis=ch, mlp_widths=widths, block_of_layer=blocks, lora_attn=lora_attn,
                              lora_mlp=lora_mlp, untied_norms=bool(values.get("untied_norms", True)),
                              dtype=self.dtype)

        if not values.get("pools"):
            fit = fit_width(make, chassis, profile, budget, values.get("width_fit", self.width_fit),
                            self.max_width_scale)
            return Candidate(values, fit, budget)
        base = make(chassis, tuple(max(1, round(chassis.d_ff * p)) for p in profile))
        try:
            groups = [list(g) for g in self.bank_groups] if self.bank_groups else None
            members = bank_members(base, values["bank_rule"], int(values["n_banks"]), groups)
        except ValueError as e:
            return Candidate(values, Fit(None, str(e)), budget)
        fit = fit_banks(base, members, values["generator"], budget, int(values.get("templates") or 2),
                        self.max_templates)
        return Candidate(values, fit, budget)

    def baselines(self) -> dict[str, dict[str, Any]]:
        """Knob values of the hand-crafted baselines, completed for this space's depth."""
        L = self.reference_chassis.n_layers
        out = {}
        for name, vals in BASELINES.items():
            vals = dict(vals)
            if vals["tying"] == "cycle":
                if L < 4:
                    continue
                vals["unique_blocks"] = L // 2
            out[name] = vals
        return out


# ---- loading --------------------------------------------------------------------------------
def load_space(path: str | Path) -> Space:
    """Read and validate a search-space file; every problem is reported at once in a SpaceError."""
    p = Path(path)
    if not p.is_file():
        raise SpaceError(str(p), ["no such file; the shipped spaces are in search_spaces/ (e.g. search_spaces/full.yaml)"])
    return parse_space(p.read_text(encoding="utf-8"), str(p))


def below_embeddings(ch: Chassis, spec: str, cap: int) -> str | None:
    """Why a budget cannot fit anything, or None: embeddings are never shared or narrowed below
    d_model, so a cap at or under them leaves every candidate infeasible."""
    floor = ch.vocab_size * ch.d_model + ch.context * ch.d_model + ch.d_model
    if cap > floor:
        return None
    return (f"budget {spec} is {cap:,} params, not more than the {floor:,} the embeddings alone need at "
            f"d_model={ch.d_model}; raise the budget or lower d_model")


def parse_space(text: str, source: str = "<space>") -> Space:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SpaceError(source, [f"YAML does not parse: {' '.join(str(e).split())}"]) from None
    if not isinstance(data, dict):
        raise SpaceError(source, [f"the top level must be a mapping of {', '.join(TOP_KEYS)}"])
    problems: list[str] = []
    check_keys("space", data, TOP_KEYS, problems)
    for key in ("chassis", "budget"):
        if key not in data:
            problems.append(f"space.{key}: missing; every space needs a chassis and a budget")

    chassis: dict[str, Knob] = {}
    raw_chassis = data.get("chassis") or {}
    if not isinstance(raw_chassis, dict):
        problems.append("space.chassis: must be a mapping of " + ", ".join(CHASSIS_KEYS))
        raw_chassis = {}
    check_keys("chassis", raw_chassis, CHASSIS_KEYS, problems)
    for key in CHASSIS_KEYS:
        if key == "activation":
            kn = parse_knob("chassis.activation", raw_chassis.get(key, "gelu"), problems, kind=str,
                            allowed=("gelu", "swiglu"))
        elif key not in raw_chassis:
            if "chassis" in data:
                problems.append(f"chassis.{key}: missing")
            continue
        else:
            kn = parse_knob(f"chassis.{key}", raw_chassis[key], problems, kind=int, low=1)
        if kn is not None:
            chassis[key] = kn
    if len(chassis) == len(CHASSIS_KEYS):
        problems.extend(Chassis(**{k: kn.default for k, kn in chassis.items()}).problems())

    dtype = data.get("dtype", "float32")
    if dtype not in DTYPE_BYTES:
        problems.append(f"space.dtype: unknown value {dtype!r}; allowed: {', '.join(DTYPE_BYTES)}")
    objectives = data.get("objectives", ["val_loss", "train_memory_bytes"])
    if not isinstance(objectives, list) or not objectives:
        problems.append(f"space.objectives: must be a list, e.g. [val_loss, train_memory_bytes]; got {objectives!r}")
        objectives = ["val_loss"]
    for o in objectives:
        if o not in OBJECTIVES:
            parse_knob("space.objectives", o, problems, kind=str, allowed=OBJECTIVES)
    if not any(o in LOSS_OBJECTIVES for o in objectives):
        problems.append(f"space.objectives: needs a loss ({' or '.join(LOSS_OBJECTIVES)}), got {objectives!r}")

    fit_raw = data.get("fit") or {}
    if not isinstance(fit_raw, dict):
        problems.append("space.fit: must be a mapping of width, max_width_scale, max_templates")
        fit_raw = {}
    check_keys("fit", fit_raw, ("width", "max_width_scale", "max_templates"), problems)
    width_fit = fit_raw.get("width", "all")
    parse_knob("fit.width", width_fit, problems, kind=str, allowed=("mlp", "all"))
    parse_knob("fit.max_width_scale", fit_raw.get("max_width_scale", 4.0), problems, kind=float, low=1.0, high=64.0)
    parse_knob("fit.max_templates", fit_raw.get("max_templates", 64), problems, kind=int, low=1, high=4096)

    knobs, extras = _parse_knobs(data.get("knobs") or {}, chassis, problems)

    budget_spec = str(data.get("budget", "1x"))
    try:  # syntax always; feasibility against the reference only when the chassis is valid
        chassis_ok = len(chassis) == len(CHASSIS_KEYS) and not any(p.startswith("chassis") for p in problems)
        ref_chassis = Chassis(**{k: kn.default for k, kn in chassis.items()}) if chassis_ok else None
        cap = parse_budget(budget_spec, reference_params(ref_chassis) if ref_chassis else 10**9)
        if ref_chassis and (short := below_embeddings(ref_chassis, budget_spec, cap)):
            problems.append(f"space.budget: {short}")
    except BudgetError as e:
        problems.append(f"space.budget: {e}")
    if problems:
        raise SpaceError(source, problems)
    return Space(
        name=str(data.get("name") or Path(source).stem), text=text, source=source, chassis=chassis,
        budget_spec=budget_spec, dtype=dtype, objectives=tuple(objectives), recipe=str(data.get("recipe", "proxy")),
        knobs=knobs, width_fit=width_fit, max_width_scale=float(fit_raw.get("max_width_scale", 4.0)),
        max_templates=int(fit_raw.get("max_templates", 64)), description=str(data.get("description", "")), **extras,
    )


def _parse_knobs(raw: Any, chassis: dict[str, Knob], problems: list[str]) -> tuple[dict[str, Knob], dict]:
    if not isinstance(raw, dict):
        problems.append(f"space.knobs: must be a mapping of {', '.join(KNOB_SECTIONS)}")
        return {}, {}
    check_keys("knobs", raw, KNOB_SECTIONS, problems)
    sections = {}
    for sec, keys in SECTION_KEYS.items():
        body = raw.get(sec) or {}
        if not isinstance(body, dict):
            problems.append(f"knobs.{sec}: must be a mapping of {', '.join(keys)}")
            body = {}
        check_keys(f"knobs.{sec}", body, keys, problems)
        sections[sec] = body
    L = max(chassis["n_layers"].options()) if "n_layers" in chassis else 1
    specs = {  # knob name -> (section, key, kind, allowed, low, high)
        "taper": ("taper", "schedule", str, TAPERS, None, None),
        "taper_ratio": ("taper", "ratio", float, None, 1.0, 16.0),
        "tying": ("tying", "mode", str, TYING, None, None),
        "unique_blocks": ("tying", "unique_blocks", int, None, 1, L),
        "pools": ("pools", "enabled", bool, None, None, None),
        "bank_rule": ("pools", "rule", str, BANK_RULES, None, None),
        "n_banks": ("pools", "banks", int, None, 1, 1024),
        "generator": ("pools", "generator", str, GENERATORS, None, None),
        "templates": ("pools", "templates", int, None, 1, 4096),
        "lora_rank": ("relaxation", "rank", int, None, 0, 1024),
        "lora_targets": ("relaxation", "targets", str, LORA_TARGETS, None, None),
    }
    knobs: dict[str, Knob] = {}
    for name, (sec, key, kind, allowed, lo, hi) in specs.items():
        if key in sections[sec]:
            kn = parse_knob(f"knobs.{sec}.{key}", sections[sec][key], problems, kind=kind, allowed=allowed,
                            low=lo, high=hi)
            if kn is not None:
                knobs[name] = kn
    if "untied_norms" in raw:
        kn = parse_knob("knobs.untied_norms", raw["untied_norms"], problems, kind=bool)
        if kn is not None:
            knobs["untied_norms"] = kn
    extras: dict[str, Any] = {}
    per_position = sections["relaxation"].get("per_position", False)
    if not isinstance(per_position, bool):
        problems.append(f"knobs.relaxation.per_position: {per_position!r} is not true/false")
    extras["per_position"] = bool(per_position)
    for sec, dest, need in (("tying", "tying_groups", "explicit"), ("pools", "bank_groups", "explicit")):
        groups = sections[sec].get("groups")
        chosen = knobs.get("tying" if sec == "tying" else "bank_rule")
        if groups is None:
            if chosen is not None and need in chosen.options():
                problems.append(f"knobs.{sec}.groups: needed when {need!r} can be chosen; give lists of indices")
            continue
        if not (isinstance(groups, list) and groups and all(
                isinstance(g, list) and g and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                  for i in g) for g in groups)):
            problems.append(f"knobs.{sec}.groups: must be a list of non-empty lists of indices, got {groups!r}")
            continue
        flat = [i for g in groups for i in g]
        if len(flat) != len(set(flat)):
            problems.append(f"knobs.{sec}.groups: an index appears twice in {groups!r}")
        if sec == "tying" and sorted(flat) != list(range(L)):
            problems.append(f"knobs.tying.groups: must cover each of the {L} layers exactly once, got {groups!r}")
        extras[dest] = tuple(tuple(g) for g in groups)
    return knobs, extras
