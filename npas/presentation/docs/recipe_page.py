"""docs/recipes.md's reference: every recipe key, from the `Recipe` dataclass (type, default and the
comment written beside the field), and the shipped recipes."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import tokenize
import typing

import yaml

from npas.builtin import shipped
from npas.presentation.docs.cli_page import cell
from npas.training import recipe as recipe_module
from npas.training.recipe import Recipe, load_recipe

# The fields whose line in recipe.py carries no comment: said here. A field without either stops the
# page from rendering, so a new key is documented when it is added.
UNCOMMENTED = {
    "name": "the recipe's name (default: the file's stem); studies and caches record it",
    "betas": "AdamW's two momentum coefficients, each in [0, 1)",
    "version": "the recipe format's version; a newer one than this npas understands is refused",
}


def field_comments() -> dict[str, str]:
    """Field name -> the comment at the end of its line in `Recipe`'s source."""
    source = inspect.getsource(recipe_module)
    comments = {tok.start[0]: tok.string.lstrip("# ").strip()
                for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT}
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "Recipe")
    return {n.target.id: comments[n.lineno] for n in cls.body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.lineno in comments}


def _kind(hint: object) -> str:
    """A field's type in a YAML writer's words."""
    if typing.get_origin(hint) is typing.Literal:
        return "one of " + ", ".join(f"`{a}`" for a in typing.get_args(hint))
    names = {int: "integer", float: "number", str: "string", type(None): "null",
             tuple[float, float]: "two numbers", tuple[int, ...]: "list of integers"}
    if hint in names:
        return names[hint]
    return " or ".join(names.get(a, str(a)) for a in typing.get_args(hint))


def render_keys() -> str:
    comments = {**UNCOMMENTED, **field_comments()}
    hints = typing.get_type_hints(Recipe)
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(Recipe):
        if f.name not in comments:
            raise ValueError(f"Recipe.{f.name} has no comment in recipe.py and no line in recipe_page.UNCOMMENTED")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        shown = "null" if default is None else list(default) if isinstance(default, tuple) else default
        kind = _kind(hints[f.name])
        rows.append(f"| `{f.name}` | {cell(kind)} | `{shown}` | {cell(comments[f.name])} |")
    return "\n".join(rows)


def render_shipped() -> str:
    rows = ["| recipe | what it is for | steps x tokens | schedule | rate | horizon |", "|---|---|---|---|---|---|"]
    for name, path in shipped("recipes").items():
        r = load_recipe(path)
        header = [line[1:].strip() for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("#")]
        purpose = " ".join(header).split(". ")[0].split(": ", 1)[-1]
        sched = f"wsd, rungs {', '.join(map(str, r.fork_rungs()))}" if r.schedule == "wsd" else "cosine"
        assert yaml.safe_load(path.read_text(encoding="utf-8"))["name"] == name
        rows.append(f"| `{name}` | {cell(purpose)} | {r.steps:,} x {r.tokens_per_step:,} | {sched} | "
                    f"{r.lr:g} | {r.horizon:,} |")
    return "\n".join(rows)
