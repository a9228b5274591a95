"""docs/search-spaces.md's reference: the file's keys, every knob and setting from the knob table, and
the shipped spaces with their hand-crafted baselines as `npas count` fits them."""

from __future__ import annotations

from typing import Any

import yaml

from npas.allocation.knob_table import KNOBS, REQUIRED, SETTINGS, KnobSpec
from npas.allocation.space import OBJECTIVES
from npas.allocation.space_parser import TOP_KEYS, parse_space
from npas.builtin import shipped
from npas.presentation.docs.cli_page import cell

# What each top-level key of a space file means. Written here, beside the parser's TOP_KEYS: a key the
# parser learns without a line here stops the page from rendering (`render_file_keys`).
FILE_KEYS: dict[str, str] = {
    "name": "the space's name: the default study is NAME-DATE-TIME (default: the file's stem)",
    "description": "one line shown by `npas count`, the dashboard and `npas studies`",
    "chassis": "the reference model every relative budget is measured against; its dimensions may be knobs "
               "too (a list or range searches them); see the `chassis.*` rows below",
    "budget": "the stored-parameter cap: absolute (`1.5M`, `250k`) or relative to the reference (`0.25x`, `2x`)",
    "budget_scope": "`all` (every stored parameter) or `non_embedding` (all but the token and position "
                    "embeddings); see `space.budget_scope` below",
    "dtype": "dtype of stored and exported weights; see `space.dtype` below",
    "objectives": "what the search minimises, the first being the proxy's loss: a list drawn from "
                  + ", ".join(f"`{o}`" for o in OBJECTIVES),
    "recipe": "the proxy recipe a search trains with unless `--recipe` says otherwise (a name or a path)",
    "fit": "how a candidate is fitted to the budget: `fit.width`, `fit.max_width_scale`, `fit.max_templates` below",
    "knobs": "the searched mechanisms, by section (`taper`, `tying`, `pools`, `relaxation`, `kv_sharing`, "
             "`atoms`, `experts`, `untied_norms`): every knob below",
}


def render_example() -> str:
    """The smallest shipped space, as its file holds it (the header's commands left out)."""
    text = shipped("spaces")["taper"].read_text(encoding="utf-8")
    body = [line for line in text.splitlines() if not line.startswith(("# Run:", "# Count:"))]
    return "```yaml\n" + "\n".join(body) + "\n```"


def render_file_keys() -> str:
    unknown = [k for k in TOP_KEYS if k not in FILE_KEYS]
    if unknown or len(FILE_KEYS) != len(TOP_KEYS):
        raise ValueError(f"space_page.FILE_KEYS must describe exactly the parser's TOP_KEYS; missing {unknown}")
    rows = ["| key | meaning |", "|---|---|"]
    rows += [f"| `{k}` | {FILE_KEYS[k]} |" for k in TOP_KEYS]
    return "\n".join(rows)


def _num(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) and abs(v) >= 10_000 else str(v)


def _values(s: KnobSpec) -> str:
    if s.allowed is not None:
        shown = [a for a in s.allowed if a != "none"] if len(s.allowed) > 8 else list(s.allowed)
        more = " (and every other subset of q, k, v, o in that order; `none` = off)" if len(shown) < len(s.allowed) \
            else ""
        return ", ".join(f"`{a}`" for a in shown[:8]) + (", ..." if len(shown) > 8 else "") + more
    if s.kind is bool:
        return "`true`, `false`"
    kind = {int: "integer", float: "number"}[s.kind]
    high = f"`chassis.{s.high}`" if isinstance(s.high, str) else _num(s.high)
    return f"{kind}, {_num(s.low)} to {high}"


def _default(s: KnobSpec) -> str:
    if s.default is REQUIRED:
        return "required"
    if callable(s.default):
        return cell((s.default.__doc__ or "").split("\n")[0])
    if isinstance(s.default, bool):
        return f"`{str(s.default).lower()}`"
    return f"`{_num(s.default)}`"


def _table(specs: tuple[KnobSpec, ...]) -> str:
    rows = ["| written as | values | default | applies when | meaning |", "|---|---|---|---|---|"]
    for s in specs:
        meaning = cell(s.help) + ("" if s.searchable else " (a fixed value: not searched)")
        if s.per_layer:
            meaning += " (with `relaxation.per_position: true`, one rank per layer)"
        when = "" if s.when == "always" else cell(s.when)
        rows.append(f"| `{s.path}` | {_values(s)} | {_default(s)} | {when} | {meaning} |")
    return "\n".join(rows)


def render_knobs() -> str:
    return _table(KNOBS)


def render_settings() -> str:
    return _table(SETTINGS)


def _baselines(space) -> list[str]:
    """Each hand-crafted baseline of the space fitted to its budget, as `npas count SPACE` prints it."""
    out = []
    for name, vals in space.baselines().items():
        cand = space.candidate({**{k: kn.default for k, kn in space.chassis.items()}, **vals})
        out.append(f"{name} {cand.fit.stored:,} (fill {cand.fill:.4f}, {cand.config.summary()})" if cand.feasible
                   else f"{name}: infeasible ({cand.reason})")
    return out


def render_shipped() -> str:
    rows = ["| space | what it searches | budget | reference | hand-crafted baselines (stored params) |",
            "|---|---|---|---|---|"]
    for name, path in shipped("spaces").items():
        text = path.read_text(encoding="utf-8")
        space = parse_space(text, f"search_spaces/{path.name}")
        desc = yaml.safe_load(text).get("description", "")
        budget = f"{space.budget_spec} = {space.budget_params:,}"
        ref = f"{space.reference_params:,} params"
        rows.append(f"| `{name}` | {cell(desc)} | {budget} | {ref} | {'; '.join(map(cell, _baselines(space)))} |")
    return "\n".join(rows)
