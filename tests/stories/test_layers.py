"""The package's imports run one way, as pyproject.toml declares: `lint-imports` keeps every contract there
(the layers presentation > service > conversion > training > allocation > builtin, files > errors, version;
inside service, search | certify > export > execution > study; no circle inside allocation, conversion,
presentation, service or training; presentation's docs > cli > dashboard; counting
free of torch), and an npas module imported inside a function appears only in an entry point (the
package root, the CLI), whose lazy imports keep `import npas` and `npas --help` fast. No module is over
`MAX_LINES` long: one that grows past it holds more than one concept, and the next one moves out.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.conftest import ROOT

NPAS = ROOT / "npas"

# Files outside the entry points that may import npas modules inside functions, with how many: none.
# (The search plan's checks once imported corpora and tokenizers lazily so that a refused input cost no
# torch import; a search loads its corpus with torch before Ray starts anyway, and the CLI, an entry point,
# imports the plan lazily, so `npas --help` stays fast. A count only falls.)
FUNCTION_LEVEL: dict[str, int] = {}

MAX_LINES = 400  # one concept per module; a module this long holds a second one to move into its own


def entry_point(rel: str) -> bool:
    return rel == "npas/__init__.py" or rel.startswith("npas/presentation/cli/")


def function_level_imports(path: Path) -> list[str]:
    """`file:line module` of every import of an npas module inside a function body of `path`."""
    found = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, ast.Import | ast.ImportFrom):
                names = [a.name for a in child.names] if isinstance(child, ast.Import) else [child.module or ""]
                if any(n == "npas" or n.startswith("npas.") for n in names) or getattr(child, "level", 0):
                    found.append(f"{path.relative_to(ROOT).as_posix()}:{child.lineno} {names[0] or '.'}")
            walk(child, in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef))

    walk(ast.parse(path.read_text(encoding="utf-8")), False)
    return found


def test_lint_imports_keeps_every_contract():
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert exe, "lint-imports is missing: pip install -e '.[test]' (import-linter)"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's npas, whatever is installed
    run = subprocess.run([exe, "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    ids = [c["id"] for c in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]]
    assert len(ids) >= 4 and f"Contracts: {len(ids)} kept, 0 broken." in out, out


def test_npas_modules_are_imported_inside_functions_only_in_the_entry_points():
    over = []
    for path in sorted(NPAS.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if entry_point(rel):
            continue
        found = function_level_imports(path)
        if len(found) > FUNCTION_LEVEL.get(rel, 0):
            over += found
    assert not over, ("imports of npas modules inside functions outside the entry points (npas/__init__.py, "
                      "npas/presentation/cli/); import at the top, moving what closes a circle to where it "
                      "belongs:\n" + "\n".join(over))


def test_no_npas_module_is_over_max_lines():
    long = {path.relative_to(ROOT).as_posix(): n for path in sorted(NPAS.rglob("*.py"))
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, (f"modules over {MAX_LINES} lines: move a coherent concept of each into its own module "
                      f"(a docstring saying why it is its own): " + ", ".join(f"{p} ({n})" for p, n in long.items()))


def test_the_version_module_is_the_projects_version():
    from npas.version import __version__

    assert __version__ == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
