"""A search-space file's YAML read and checked whole, into the fields of a `Space`.

Why a module of its own: a space file is user input, so reading checks everything before anything
is sampled and reports every problem at once (one `SpaceError`), while `npas.allocation.space` only
samples and fits what reading let through. The knobs' names, kinds and bounds come from one table,
`npas.allocation.knob_table`, which reading and sampling both read. It sits below `Space`, which
re-reads its own file against a starting checkpoint's chassis (`pin_chassis`);
`npas.allocation.space_parser.parse_space` makes the `Space`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from npas.allocation.budget import reference_params
from npas.allocation.budget_scope import below_embeddings, parse_budget
from npas.allocation.config import Chassis
from npas.allocation.knob_table import (
    CHASSIS_KEYS,
    FAMILY_KEYS,
    FIT_KEYS,
    KNOB_SECTIONS,
    KNOBS,
    REQUIRED,
    SECTION_KEYS,
    SETTINGS,
    KnobSpec,
)
from npas.allocation.knobs import Knob, check_keys, parse_knob
from npas.errors import BudgetError, ConfigError, SpaceError

OBJECTIVES = ("val_loss", "val_bpc", "val_bpb", "param_bytes", "train_memory_bytes", "inference_bytes", "flops_per_token",
              "peak_memory_bytes", "kv_cache_bytes_per_token")
LOSS_OBJECTIVES = ("val_loss", "val_bpc", "val_bpb")  # val_bpb: bits per byte, comparable across tokenizers
TOP_KEYS = ("name", "description", "chassis", "budget", "budget_scope", "dtype", "objectives", "recipe", "fit", "knobs")


def read_space(text: str, source: str = "<space>") -> dict[str, Any]:
    """The fields of a `Space` from a search-space file's text, once every problem in it is ruled out; else
    one SpaceError listing them all."""
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
    for spec in KNOBS:
        if spec.section != "chassis" or (spec.key in FAMILY_KEYS and spec.key not in raw_chassis):
            continue  # a family key left out stays out: Chassis' own default (classic) applies
        if spec.key not in raw_chassis and spec.default is REQUIRED:
            if "chassis" in data:
                problems.append(f"chassis.{spec.key}: missing")
            continue
        kn = _parse_spec(spec, raw_chassis.get(spec.key, spec.default), problems)
        if kn is not None:
            chassis[spec.key] = kn
    complete = set(CHASSIS_KEYS) - set(FAMILY_KEYS) <= set(chassis)
    if complete:
        problems.extend(Chassis(**{k: kn.default for k, kn in chassis.items()}).problems())

    fit_raw = data.get("fit") or {}
    if not isinstance(fit_raw, dict):
        problems.append(f"space.fit: must be a mapping of {', '.join(FIT_KEYS)}")
        fit_raw = {}
    check_keys("fit", fit_raw, FIT_KEYS, problems)
    settings: dict[str, Any] = {}
    for spec in SETTINGS:
        body = fit_raw if spec.section == "fit" else data
        kn = _parse_spec(spec, body.get(spec.key, spec.default), problems)
        settings[spec.name] = kn.default if kn is not None else spec.default
    objectives = data.get("objectives", ["val_loss", "train_memory_bytes"])
    if not isinstance(objectives, list) or not objectives:
        problems.append(f"space.objectives: must be a list, e.g. [val_loss, train_memory_bytes]; got {objectives!r}")
        objectives = ["val_loss"]
    if len(set(map(repr, objectives))) != len(objectives):
        problems.append(f"space.objectives: each objective once, got {objectives!r}")
    for o in objectives:
        if not isinstance(o, str):
            problems.append(f"space.objectives: {o!r} is not an objective name; allowed: {', '.join(OBJECTIVES)}")
        elif o not in OBJECTIVES:
            parse_knob("space.objectives", o, problems, kind=str, allowed=OBJECTIVES)
    if not any(o in LOSS_OBJECTIVES for o in objectives):
        problems.append(f"space.objectives: needs a loss ({' or '.join(LOSS_OBJECTIVES)}), got {objectives!r}")

    knobs, extras = _parse_knobs(data.get("knobs") or {}, chassis, problems)
    if "templates" in knobs and max(knobs["templates"].options()) > settings["max_templates"]:
        problems.append(f"knobs.pools.templates: up to {max(knobs['templates'].options())} exceeds "
                        f"fit.max_templates={settings['max_templates']}; lower it or raise fit.max_templates")
    if "experts_per_layer" in knobs and any(e > 0 for e in knobs["experts_per_layer"].options()) \
            and "pools" in knobs and False not in knobs["pools"].options():
        problems.append("knobs.experts with knobs.pools.enabled always true: Shapeshifter pools and expert pools "
                        "both pool the MLP weights, so no candidate could have experts; use pools.enabled: "
                        "[false] (or [false, true] to compare them), or drop knobs.experts")
    if "n_atoms" in knobs and "atoms_fraction" in knobs:
        problems.append("knobs.atoms: give count or fraction, not both (count is K itself, fraction is K / n_layers)")
    for key in ("name", "description", "recipe"):
        if key in data and not isinstance(data[key], str):
            problems.append(f"space.{key}: must be text, got {data[key]!r}")

    budget_spec = str(data.get("budget", "1x"))
    try:  # syntax always; feasibility against the reference only when the chassis is valid
        chassis_ok = complete and not any(p.startswith("chassis") for p in problems)
        ref_chassis = Chassis(**{k: kn.default for k, kn in chassis.items()}) if chassis_ok else None
        cap = parse_budget(budget_spec, reference_params(ref_chassis) if ref_chassis else 10**9)
        if ref_chassis and settings["budget_scope"] == "all" and (
                short := below_embeddings(ref_chassis, budget_spec, cap)):
            problems.append(f"space.budget: {short}")
    except BudgetError as e:
        problems.append(f"space.budget: {e}")
    if problems:
        raise SpaceError(source, problems)
    return dict(
        name=str(data.get("name") or Path(source).stem), text=text, source=source, chassis=chassis,
        budget_spec=budget_spec, dtype=settings["dtype"], objectives=tuple(objectives),
        recipe=str(data.get("recipe", "proxy")), knobs=knobs, width_fit=settings["width_fit"],
        max_width_scale=float(settings["max_width_scale"]), max_templates=int(settings["max_templates"]),
        description=str(data.get("description", "")), budget_scope=settings["budget_scope"], **extras,
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
    # an n_layers that is missing or invalid is reported on its own; it bounds nothing else
    L = max(chassis["n_layers"].options()) if "n_layers" in chassis else None
    knobs: dict[str, Knob] = {}
    for spec in KNOBS:
        if spec.section == "chassis":
            continue
        body = raw if spec.section == "" else sections[spec.section]
        if spec.key in body:
            kn = _parse_spec(spec, body[spec.key], problems, {"n_layers": L} if L else {})
            if kn is not None:
                knobs[spec.name] = kn
    extras: dict[str, Any] = {}
    per_position = sections["relaxation"].get("per_position", False)
    if not isinstance(per_position, bool):
        problems.append(f"knobs.relaxation.per_position: {per_position!r} is not true/false")
    extras["per_position"] = bool(per_position)
    depths = chassis["n_layers"].options() if "n_layers" in chassis else []
    for key, path in (("tying", "knobs.tying.mode"), ("bank_rule", "knobs.pools.rule")):
        if key in knobs and "learned" in knobs[key].options() and len(depths) > 1:
            problems.append(f"{path}: learned groups cluster the layers of one trained model, but chassis.n_layers "
                            f"is searched over {depths}; give n_layers one value")
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
        if L is None:  # the depth is itself invalid (reported above): nothing to check the groups against
            continue
        if sec == "tying" and sorted(flat) != list(range(L)):
            problems.append(f"knobs.tying.groups: must cover each of the {L} layers exactly once, got {groups!r}")
        depths = chassis["n_layers"].options() if "n_layers" in chassis else [L]
        if sec == "tying" and chosen is not None and need in chosen.options() and len(depths) > 1:
            problems.append(f"knobs.tying.groups: explicit groups list the layers of one depth, but chassis.n_layers "
                            f"is searched over {depths}; give n_layers one value")
        if sec == "pools" and flat and max(flat) >= L:
            problems.append(f"knobs.pools.groups: block {max(flat)} does not exist; a candidate has at most {L} "
                            f"blocks (one per layer), numbered from 0")
        extras[dest] = tuple(tuple(g) for g in groups)
    return knobs, extras


def _parse_spec(spec: KnobSpec, raw: Any, problems: list[str], bounds: dict[str, int] | None = None) -> Knob | None:
    """Parse one table entry's YAML value; a bound named by a chassis key resolves through `bounds`."""
    high = (bounds or {}).get(spec.high) if isinstance(spec.high, str) else spec.high
    return parse_knob(spec.path, raw, problems, kind=spec.kind, allowed=spec.allowed, low=spec.low, high=high,
                      fixed_only=not spec.searchable)


def pin_chassis(text: str, source: str, chassis: Chassis) -> dict[str, Knob]:
    """The chassis knobs of the space file `text` fixed to `chassis` (a starting checkpoint's, see `Space.bind`), or a
    one-line `ConfigError` naming each knob of the file that cannot hold it and the fix.

    Why a re-parse: the knobs were checked against the file's chassis (a tying group of 4 blocks, a
    K/V group, explicit layer groups are bounded by its n_layers; the budget by its embeddings), and
    the same checks, in the same words, must hold against the chassis the search will really use."""
    data = yaml.safe_load(text)
    data["chassis"] = {k: getattr(chassis, k) for k in CHASSIS_KEYS}  # every key: the family's too
    try:
        pinned = read_space(yaml.safe_dump(data, sort_keys=False), source)
    except SpaceError as err:
        keys = ("n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff", "vocab_size", "context")
        shown = ", ".join(f"{k}={chassis.to_dict()[k]}" for k in keys if k in chassis.to_dict())
        raise ConfigError(f"{source}: the starting checkpoint fixes the search's chassis ({shown}), and the "
                          f"space's knobs do not fit it: {'; '.join(err.problems)}; change those knobs for this "
                          "chassis, or start from another checkpoint") from None
    return pinned["chassis"]
