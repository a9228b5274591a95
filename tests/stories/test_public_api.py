"""`npas.__all__` is the whole public API: what a user scripts with (load a space, count, build, plan,
search, resume, export, certify, convert, train, the errors), at most 45 names, every one resolving. A
tool that needs more (the benchmarks, the experiments) imports the module that defines it, one that
docs/architecture.md names, so no second table of names grows beside it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import npas
from tests.conftest import ROOT


def test_all_is_a_user_sized_api_and_every_name_resolves():
    assert 30 <= len(npas.__all__) <= 45, len(npas.__all__)
    assert len(set(npas.__all__)) == len(npas.__all__)
    assert all(getattr(npas, name) is not None for name in npas.__all__)
    assert npas.CertifyOptions.__name__ == "Options"  # a lazy name may differ from its module's


def test_no_name_beyond_all_resolves_lazily():
    from npas import _LAZY

    assert set(_LAZY) <= set(npas.__all__), sorted(set(_LAZY) - set(npas.__all__))
    for internal in ("tying_map", "NpasSearcher", "ENTRY_POINTS", "certificate_table"):
        with pytest.raises(AttributeError, match=internal):
            getattr(npas, internal)


def npas_imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of every npas import in ``path``, a function-level one too: ``("npas", name)`` for
    ``from npas import name`` and ``npas.name``, ``(module, "")`` for an import of a module below npas."""
    found: list[tuple[str, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "npas":
            found += [("npas", a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("npas."):
            found.append((node.module, ""))
        elif isinstance(node, ast.Import):
            found += [(a.name, "") for a in node.names if a.name.startswith("npas.")]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "npas":
            found.append(("npas", node.attr))
    return found


def documented_modules() -> set[str]:
    """The npas modules docs/architecture.md names, each under its package's heading."""
    from tests.docs.test_architecture import sections

    return {f"{package}.{name}" for package, names in sections().items() for name in names} | set(sections())


def test_benchmarks_and_experiments_import_only_public_names_and_documented_modules():
    """A benchmark or experiment uses `npas.__all__` (what a user scripts with) or imports a module docs/architecture.md names:
    a module's move then shows in that page and here, never as a benchmark broken at run time."""
    public, documented = set(npas.__all__), documented_modules()
    bad = sorted({f"{p.relative_to(ROOT).as_posix()}: {module}{'.' + name if name else ''}"
                  for d in ("benchmarks", "experiments") for p in sorted((ROOT / d).rglob("*.py"))
                  for module, name in npas_imports(p)
                  if (module == "npas" and name not in public and name != "__version__")
                  or (module != "npas" and module not in documented)})
    assert bad == [], "not in npas.__all__ nor a module named in docs/architecture.md:\n" + "\n".join(bad)
    assert len(documented) > 80 and ("npas", "Recipe") in npas_imports(ROOT / "experiments" / "harness" / "recipes.py")
