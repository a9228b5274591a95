"""Reading an allocation file: strict field types, and the upgrade from older schema versions.

`ArchConfig.from_dict`, `from_json` and `from_yaml` call these; `SCHEMA_VERSION` is the version this
npas writes. A wrongly typed field is refused with its name rather than coerced (`bool("false")` is
True, `int(5.7)` is 5), because a coerced file would build a different model than the one its author
wrote; every problem is collected so one pass fixes a file.
"""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any, get_args

import yaml

from npas.allocation.chassis import CHASSIS_MAX, LLAMA_DEFAULTS, LLAMA_MAX, Chassis
from npas.allocation.lora_sharing import read_sharing_fields
from npas.allocation.parts import (
    DEFAULT_HASH_TILE,
    DEFAULT_LORA_ALPHA,
    DTYPE_BYTES,
    AtomSpec,
    Bank,
    ExpertPool,
    Generator,
    LoraScaling,
)
from npas.allocation.recursion import read_recursion
from npas.errors import ConfigError

SCHEMA_VERSION = 2  # 2: attention as four slots attn_q/k/v/o (1: fused attn_qkv + attn_out); 1 still loads

_OPTIONAL_CHASSIS = ("family", *LLAMA_DEFAULTS)  # chassis keys a file may leave out (classic defaults)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def read_fields(d: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """Typed fields of an allocation mapping; each wrongly typed one appends a problem naming it."""
    out: dict[str, Any] = {}
    ch = d.get("chassis")
    if not isinstance(ch, dict):
        problems.append(f"chassis: must be a mapping of {', '.join(f.name for f in fields(Chassis))}, got {ch!r}")
    else:
        names = [f.name for f in fields(Chassis)]
        optional = ("activation", *_OPTIONAL_CHASSIS)
        extra = sorted(set(ch) - set(names))
        missing = [n for n in names if n not in ch and n not in optional]
        if extra or missing:
            problems.append(f"chassis: unknown keys {extra}, missing keys {missing}; keys are {names}")
        else:
            before = len(problems)
            for n in (*CHASSIS_MAX, *LLAMA_MAX):
                if n in ch and not _is_int(ch[n]):
                    problems.append(f"chassis.{n}: must be an integer, got {ch[n]!r}")
            for n in ("rope_theta", "rms_norm_eps"):
                if n in ch and (not isinstance(ch[n], int | float) or isinstance(ch[n], bool)):
                    problems.append(f"chassis.{n}: must be a number, got {ch[n]!r}")
            if "family" in ch and not isinstance(ch["family"], str):
                problems.append(f"chassis.family: must be classic or llama, got {ch['family']!r}")
            if "tie_embeddings" in ch and not isinstance(ch["tie_embeddings"], bool):
                problems.append(f"chassis.tie_embeddings: must be true or false, got {ch['tie_embeddings']!r}")
            if ch.get("rope_scaling") is not None and (not isinstance(ch["rope_scaling"], dict) or not all(
                    isinstance(v, int | float | str) for v in ch["rope_scaling"].values())):
                problems.append(f"chassis.rope_scaling: must be a mapping of numbers and rope_type, got "
                                f"{ch['rope_scaling']!r}")
            if len(problems) == before:
                out["chassis"] = Chassis(**ch)
    for name in ("mlp_widths", "block_of_layer", "lora_attn", "lora_mlp", "kv_source"):
        v = d.get(name, [])
        if name in ("mlp_widths", "block_of_layer") and name not in d:
            problems.append(f"{name}: missing; give one integer per layer")
        elif not isinstance(v, list | tuple) or not all(_is_int(x) for x in v):
            problems.append(f"{name}: must be a list of integers, got {v!r}")
        else:
            out[name] = tuple(v)
    banks = d.get("banks", [])
    if not isinstance(banks, list | tuple):
        problems.append(f"banks: must be a list of mappings, got {banks!r}")
        banks = []
    out["banks"] = tuple(b for k, raw in enumerate(banks) if (b := read_bank(k, raw, problems)) is not None)
    alpha = d.get("lora_alpha", DEFAULT_LORA_ALPHA)
    if not isinstance(alpha, int | float) or isinstance(alpha, bool):
        problems.append(f"lora_alpha: must be a number, got {alpha!r}")
    out["lora_alpha"] = float(alpha) if isinstance(alpha, int | float) else alpha
    if not isinstance(d.get("lora_scaling", "standard"), str):
        problems.append(f"lora_scaling: must be one of {list(get_args(LoraScaling))}, got {d['lora_scaling']!r}")
    out["lora_scaling"] = d.get("lora_scaling", "standard")
    if not isinstance(d.get("untied_norms", True), bool):
        problems.append(f"untied_norms: must be true or false, got {d['untied_norms']!r}")
    out["untied_norms"] = d.get("untied_norms", True)
    if not isinstance(d.get("dtype", "float32"), str):
        problems.append(f"dtype: must be one of {list(DTYPE_BYTES)}, got {d['dtype']!r}")
    out["dtype"] = d.get("dtype", "float32")
    if not isinstance(d.get("kv_mode", "kv"), str):
        problems.append(f"kv_mode: must be kv or v, got {d['kv_mode']!r}")
    out["kv_mode"] = d.get("kv_mode", "kv")
    atoms = d.get("atoms", [])
    if not isinstance(atoms, list | tuple):
        problems.append(f"atoms: must be a list of mappings, got {atoms!r}")
        atoms = []
    out["atoms"] = tuple(a for k, raw in enumerate(atoms) if (a := read_atoms(k, raw, problems)) is not None)
    if d.get("experts") is not None:
        out["experts"] = read_experts(d["experts"], problems)
    out.update(read_sharing_fields(d, problems))
    if d.get("recursion") is not None:
        out["recursion"] = read_recursion(d["recursion"], problems)
    version = d.get("version", SCHEMA_VERSION)
    if version not in (1, SCHEMA_VERSION) or not _is_int(version):
        problems.append(f"version: {version!r} is not a schema version this npas reads (1 or {SCHEMA_VERSION})")
    out["version"] = version
    return out


def read_bank(k: int, raw: Any, problems: list[str]) -> Bank | None:
    where = f"banks[{k}]"
    keys = ("members", "generator", "size", "templates", "tile", "seed")
    if not isinstance(raw, dict) or sorted(set(raw) - set(keys)) or not {"members", "generator", "size"} <= set(raw):
        problems.append(f"{where}: must be a mapping of members, generator, size (templates, tile, seed optional), "
                        f"got {raw!r}")
        return None
    before = len(problems)
    members = raw["members"]
    if not isinstance(members, list | tuple) or not all(
            isinstance(m, list | tuple) and len(m) == 2 and _is_int(m[0]) and isinstance(m[1], str) for m in members):
        problems.append(f"{where}.members: must be a list of [block, slot] pairs, got {members!r}")
    if not isinstance(raw["generator"], str):
        problems.append(f"{where}.generator: must be one of {list(get_args(Generator))}, got {raw['generator']!r}")
    for key in ("size", "templates", "tile", "seed"):
        if key in raw and not _is_int(raw[key]):
            problems.append(f"{where}.{key}: must be an integer, got {raw[key]!r}")
    if len(problems) > before:
        return None
    hashed = raw["generator"] == "hash"  # tile and seed are hash's alone; a hash bank's tile defaults
    return Bank(tuple((b, s) for b, s in members), raw["generator"], raw["size"], raw.get("templates", 1),
                raw.get("tile", DEFAULT_HASH_TILE if hashed else 0), raw.get("seed", 0))


def read_atoms(k: int, raw: Any, problems: list[str]) -> AtomSpec | None:
    where = f"atoms[{k}]"
    if not isinstance(raw, dict) or set(raw) - {"slot", "n_atoms", "scope"} or not {"slot", "n_atoms"} <= set(raw):
        problems.append(f"{where}: must be a mapping of slot, n_atoms (scope optional), got {raw!r}")
        return None
    if not isinstance(raw["slot"], str) or not _is_int(raw["n_atoms"]) or not isinstance(raw.get("scope", ""), str):
        problems.append(f"{where}: slot and scope must be text, n_atoms an integer, got {raw!r}")
        return None
    return AtomSpec(raw["slot"], raw["n_atoms"], raw.get("scope", "layer"))


def read_experts(raw: Any, problems: list[str]) -> ExpertPool | None:
    keys = ("pool_sizes", "pool_of_layer", "d_expert", "top_k", "router", "balance_weight")
    if not isinstance(raw, dict) or set(raw) - set(keys) or not {"pool_sizes", "pool_of_layer", "d_expert"} <= set(raw):
        problems.append(f"experts: must be a mapping of {', '.join(keys)} (the first three required), got {raw!r}")
        return None
    before = len(problems)
    for key in ("pool_sizes", "pool_of_layer"):
        if not isinstance(raw[key], list | tuple) or not all(_is_int(v) for v in raw[key]):
            problems.append(f"experts.{key}: must be a list of integers, got {raw[key]!r}")
    for key in ("d_expert", "top_k"):
        if key in raw and not _is_int(raw[key]):
            problems.append(f"experts.{key}: must be an integer, got {raw[key]!r}")
    if not isinstance(raw.get("router", ""), str):
        problems.append(f"experts.router: must be per_layer or shared, got {raw['router']!r}")
    bw = raw.get("balance_weight", 0.01)
    if not isinstance(bw, int | float) or isinstance(bw, bool):
        problems.append(f"experts.balance_weight: must be a number, got {bw!r}")
    if len(problems) > before:
        return None
    return ExpertPool(tuple(raw["pool_sizes"]), tuple(raw["pool_of_layer"]), raw["d_expert"], raw.get("top_k", 1),
                      raw.get("router", "per_layer"), float(bw))


def upgrade_v1(kw: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 -> 2 with the same stored parameter count and function, or a ConfigError naming the fix.

    A v1 bank member `attn_qkv` (one fused 3d x d matrix) becomes the members attn_q, attn_k, attn_v
    (d x d each: the same elements, so a tie/slice/tile bank keeps its size and count), and attn_out
    is renamed attn_o. What cannot keep its count is refused: template_mix learns one coefficient per
    member and template, and attention LoRA relaxed two matrices per layer where schema 2 has four.
    Schema 1 had no LoRA scale (B @ A as is): one MLP rank r maps to lora_alpha = r (scale 1).
    """
    rename = {"attn_out": ("attn_o",), "attn_qkv": ("attn_q", "attn_k", "attn_v")}
    banks = []
    for k, bank in enumerate(kw["banks"]):
        if bank.generator == "template_mix" and any(s == "attn_qkv" for _, s in bank.members):
            raise ConfigError(
                f"banks[{k}]: a version 1 template_mix bank generating attn_qkv cannot keep its parameter count in "
                f"version 2 (q, k and v each learn their own coefficients); replace each [b, attn_qkv] member by "
                f"[b, attn_q], [b, attn_k], [b, attn_v] and set version: 2")
        members = tuple((b, new) for b, s in bank.members for new in rename.get(s, (s,)))
        banks.append(Bank(members, bank.generator, bank.size, bank.templates))
    if any(kw.get("lora_attn", ())):
        raise ConfigError(
            "lora_attn: version 1 relaxed the fused attn_qkv and attn_out (6*r*d_model params per layer), version 2 "
            "relaxes attn_q, attn_k, attn_v and attn_o separately (8*r*d_model); set version: 2 to accept the "
            "larger relaxation, or lora_attn to zeros")
    mlp_ranks = {r for r in kw.get("lora_mlp", ()) if r}
    if len(mlp_ranks) > 1:
        raise ConfigError(
            f"lora_mlp: version 1 LoRA deltas were unscaled and version 2 scales them by lora_alpha / r, which no "
            f"single alpha makes 1 for ranks {sorted(mlp_ranks)}; set version: 2 to accept the scaled deltas")
    if mlp_ranks:  # alpha = r makes the scale exactly 1: the same function as the unscaled v1 delta
        kw = {**kw, "lora_alpha": float(mlp_ranks.pop()), "lora_scaling": "standard"}
    return {**kw, "banks": tuple(banks), "version": SCHEMA_VERSION}


def read_allocation(d: Any, known: list[str]) -> dict[str, Any]:
    """An allocation mapping's keyword arguments (`ArchConfig.from_dict`), read strictly: an unknown key
    or a wrongly typed field is refused, every problem named at once; schema 1 is upgraded. `known`: the
    allocation's field names."""
    if not isinstance(d, dict):
        raise ConfigError(f"an allocation must be a mapping, got {type(d).__name__}")
    unknown = sorted(set(d) - set(known))
    if unknown:
        raise ConfigError(f"unknown allocation keys {unknown}; allowed: {sorted(known)}")
    problems: list[str] = []
    kwargs = read_fields(d, problems)
    if problems:
        raise ConfigError("invalid allocation: " + "; ".join(problems))
    if kwargs["version"] == 1:
        kwargs = upgrade_v1(kwargs)
    return kwargs


def json_mapping(text: str) -> Any:
    """What an allocation's JSON text holds, for `read_allocation` to check."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"allocation JSON does not parse: {e}") from None


def yaml_mapping(text: str) -> Any:
    """What an allocation's YAML text holds, for `read_allocation` to check: the file itself, or the
    `allocation` of an export that writes its metrics beside it."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"allocation YAML does not parse: {e}") from None
    if isinstance(data, dict) and "allocation" in data:  # an export with metrics beside it
        data = data["allocation"]
    return data
