"""docs/python-api.md's reference: every name in `npas.__all__`, with its signature and docstring."""

from __future__ import annotations

import inspect
import re

import npas

# the comment lines above each group in npas/__init__.py's __all__ become the page's headings
_GROUP = re.compile(r"^\s*# (.+)$")


def groups() -> list[tuple[str, list[str]]]:
    """(heading, names) in `npas.__all__`'s order, headed by the comments that group them there."""
    source = inspect.getsource(npas)
    block = source[source.index("__all__ = ["):]
    block = block[:block.index("]\n") + 1]
    out: list[tuple[str, list[str]]] = []
    for line in block.splitlines()[1:]:
        if m := _GROUP.match(line):
            out.append((m.group(1), []))
        else:
            out[-1][1].extend(re.findall(r'"(\w+)"', line))
    listed = [n for _, names in out for n in names]
    if listed != list(npas.__all__):
        raise ValueError("npas/__init__.py: __all__ must be one list of quoted names under '# heading' comments")
    return out


def _signature(obj: object) -> str:
    try:
        sig = str(inspect.signature(obj))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return ""
    sig = re.sub(r" at 0x[0-9a-f]+", "", sig)  # a default's repr must not carry an address
    return re.sub(r"(: |-> )'([^']*)'", r"\1\2", sig)  # annotations read as written, not as strings


def _call(name: str, sig: str) -> str:
    """`name(sig)` on one line, or one parameter a line when that is long."""
    if len(name) + len(sig) <= 100 or not sig.startswith("("):
        return name + sig
    inner, _, ret = sig[1:].rpartition(")")
    params, depth, cur = [], 0, ""
    for ch in inner:  # split on the commas between parameters, not those inside brackets or quotes
        depth += ch in "([{" and 1 or ch in ")]}" and -1 or 0
        if ch == "," and depth == 0:
            params.append(cur.strip())
            cur = ""
        else:
            cur += ch
    params.append(cur.strip())
    return name + "(\n" + "".join(f"    {p},\n" for p in params if p) + ")" + ret


def _doc(obj: object) -> str:
    doc = inspect.getdoc(obj) or ""
    return doc.replace("``", "`")


def _methods(cls: type) -> list[str]:
    """Public methods and properties the class itself defines, one line each."""
    out = []
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        fn = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
        if not callable(fn) and not isinstance(member, property):
            continue
        first = (inspect.getdoc(fn) or "").split("\n\n")[0]
        first = " ".join(first.split()).replace("``", "`")
        kind = "property" if isinstance(member, property) else "method"
        out.append(f"- `{name}` ({kind}){': ' + first if first else ''}")
    return out


def render() -> str:
    out = []
    for heading, names in groups():
        out += [f"### {heading[:1].upper() + heading[1:]}", ""]
        for name in names:
            obj = getattr(npas, name)
            if inspect.isclass(obj) and issubclass(obj, BaseException):
                bases = ", ".join(b.__name__ for b in obj.__bases__)
                out += [f"#### `npas.{name}`", "", f"Exception ({bases}). {_doc(obj)}", ""]
                continue
            kind = "class" if inspect.isclass(obj) else "function" if callable(obj) else "value"
            out += [f"#### `npas.{name}`", "", "```python", _call(name, _signature(obj)) if kind != "value"
                    else f"{name} = {obj!r}", "```", "", f"*{kind}*. {_doc(obj)}", ""]
            if inspect.isclass(obj):
                methods = _methods(obj)
                if methods:
                    out += [*methods, ""]
    return "\n".join(out)
