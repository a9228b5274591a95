"""docs/python-api.md's reference: every name in `npas.__all__`, with its signature and docstring.

Read from the source, not imported: a name is found through `npas/__init__.py`'s imports and its lazy
table, then followed through re-exports to the `def` or `class` that
defines it. So rendering the page loads neither torch nor Ray, and a signature reads as written.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import npas

ROOT = Path(npas.__file__).resolve().parent
_GROUP = re.compile(r"^\s*# (.+)$")  # the comment lines above each group of __all__ become headings


@cache
def _tree(module: str) -> ast.Module:
    parts = module.split(".")[1:]
    path = ROOT.joinpath(*parts, "__init__.py") if ROOT.joinpath(*parts).is_dir() else \
        ROOT.joinpath(*parts[:-1], f"{parts[-1]}.py") if parts else ROOT / "__init__.py"
    return ast.parse(path.read_text(encoding="utf-8"))


def _lazy_table() -> dict[str, str]:
    """npas/__init__.py's `_LAZY` mapping: name -> module (``module:attr`` where the name differs)."""
    for node in _tree("npas").body:
        if isinstance(node, ast.AnnAssign | ast.Assign) and "_LAZY" in ast.unparse(node):
            return ast.literal_eval(node.value)  # type: ignore[arg-type]
    raise ValueError("npas/__init__.py has no _LAZY table")


def _definition(module: str, name: str) -> tuple[str, ast.AST]:
    """(module, node) of the def, class or assignment that defines `name`, following re-exports."""
    for node in _tree(module).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name == name:
            return module, node
        if isinstance(node, ast.Assign | ast.AnnAssign) and name in {
                t.id for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                if isinstance(t, ast.Name)}:
            return module, node
    for node in _tree(module).body:
        if isinstance(node, ast.ImportFrom) and node.module and any(a.name == name for a in node.names):
            return _definition(node.module, name)
    raise LookupError(f"{name} is not defined in {module}")


def locate(name: str) -> tuple[str, ast.AST]:
    lazy = _lazy_table()
    if name in lazy:
        module, _, attr = lazy[name].partition(":")
        return _definition(module, attr or name)
    return _definition("npas", name)


def groups() -> list[tuple[str, list[str]]]:
    """(heading, names) in `npas.__all__`'s order, headed by the comments that group them there."""
    source = (ROOT / "__init__.py").read_text(encoding="utf-8")
    block = source[source.index("__all__ = ["):]
    block = block[:block.index("]\n") + 1]
    out: list[tuple[str, list[str]]] = []
    for line in block.splitlines()[1:]:
        if m := _GROUP.match(line):
            out.append((m.group(1), []))
        elif out:
            out[-1][1].extend(re.findall(r'"(\w+)"', line))
    if [n for _, names in out for n in names] != list(npas.__all__):
        raise ValueError("npas/__init__.py: __all__ must be one list of quoted names under '# heading' comments")
    return out


def _is_dataclass(node: ast.ClassDef) -> bool:
    return any("dataclass" in ast.unparse(d) for d in node.decorator_list)


def _params(node: ast.FunctionDef | ast.ClassDef) -> tuple[list[str], str]:
    """The parameters as written, and the return annotation (a class: its constructor's)."""
    if isinstance(node, ast.ClassDef):
        if _is_dataclass(node):
            fields = [n for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                      and "ClassVar" not in ast.unparse(n.annotation)]
            return [ast.unparse(f) for f in fields], ""
        init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        if init is None:
            return [], ""
        params, _ = _params(init)
        return params[1:], ""  # without self
    args = ast.unparse(node.args)
    parts, depth, cur = [], 0, ""
    for ch in args:  # the commas between parameters, not those inside brackets or quotes
        depth += 1 if ch in "([{" else -1 if ch in ")]}" else 0
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return [_spaced(p) for p in parts], (f" -> {ast.unparse(node.returns)}" if node.returns is not None else "")


def _spaced(param: str) -> str:
    """`pick: str='knee'` as PEP 8 writes an annotated default: `pick: str = 'knee'`."""
    name, colon, rest = param.partition(": ")
    if not colon:
        return param
    depth = 0
    for i, ch in enumerate(rest):
        depth += 1 if ch in "([{" else -1 if ch in ")]}" else 0
        if ch == "=" and depth == 0:
            return f"{name}: {rest[:i]} = {rest[i + 1:]}"
    return param


def _call(name: str, node: ast.FunctionDef | ast.ClassDef) -> str:
    """`name(params) -> returns` on one line, or one parameter a line when that is long."""
    params, ret = _params(node)
    one = f"{name}({', '.join(params)}){ret}"
    return one if len(one) <= 100 else f"{name}(\n" + "".join(f"    {p},\n" for p in params) + f"){ret}"


def _doc(node: ast.AST) -> str:
    doc = ast.get_docstring(node) if isinstance(node, ast.FunctionDef | ast.ClassDef) else None  # type: ignore[arg-type]
    return (doc or "").replace("``", "`")


def _members(node: ast.ClassDef) -> list[str]:
    """Public methods and properties the class defines, one line each; an enum's members by name."""
    out = []
    constants = [t.id for n in node.body if isinstance(n, ast.Assign) for t in n.targets
                 if isinstance(t, ast.Name) and t.id.isupper()]
    if constants and any("Enum" in ast.unparse(b) for b in node.bases):
        out.append("Members: " + ", ".join(f"`{c}`" for c in constants) + ".")
    for n in node.body:
        if not isinstance(n, ast.FunctionDef) or n.name.startswith("_"):
            continue
        deco = [ast.unparse(d) for d in n.decorator_list]
        kind = "property" if any(d in ("property", "cached_property") for d in deco) else \
            "class method" if "classmethod" in deco else "static method" if "staticmethod" in deco else "method"
        first = " ".join((ast.get_docstring(n) or "").split("\n\n")[0].split()).replace("``", "`")
        out.append(f"- `{n.name}` ({kind}){': ' + first if first else ''}")
    return out


def render() -> str:
    out = []
    for heading, names in groups():
        out += [f"### {heading[:1].upper() + heading[1:]}", ""]
        for name in names:
            module, node = locate(name)
            out += [f"#### `npas.{name}`", ""]
            if isinstance(node, ast.ClassDef) and any(ast.unparse(b).endswith(("Error", "Exception", "Interrupted"))
                                                      for b in node.bases):
                bases = ", ".join(ast.unparse(b) for b in node.bases)
                out += [f"*exception* ({bases}; `{module}`). {_doc(node)}", ""]
                continue
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
                enum = isinstance(node, ast.ClassDef) and any("Enum" in ast.unparse(b) for b in node.bases)
                out += [] if enum else ["```python", _call(name, node), "```", ""]
                out += [f"*{'enum' if enum else kind}* (`{module}`). {_doc(node)}", ""]
                if isinstance(node, ast.ClassDef) and (members := _members(node)):
                    out += [*members, ""]
            else:
                out += ["```python", f"{name} = {ast.unparse(node.value)}", "```", "", f"*value* (`{module}`).", ""]
    return "\n".join(out)
