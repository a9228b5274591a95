"""Count the checks in a test tree by AST: `assert` statements, `pytest.raises` uses and test functions.

A change that reorganises the tests (tiers, shared fixtures, smaller models) must not lose a check:
run it before and after and compare.   python .ci/count_checks.py tests
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def count(root: Path) -> dict[str, int]:
    n = {"asserts": 0, "pytest.raises": 0, "test_functions": 0}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Assert):
                n["asserts"] += 1
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "raises" \
                    and getattr(node.func.value, "id", "") == "pytest":
                n["pytest.raises"] += 1
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                n["test_functions"] += 1
    return n


if __name__ == "__main__":
    print(" ".join(f"{k}={v}" for k, v in count(Path(sys.argv[1] if len(sys.argv) > 1 else "tests")).items()))
