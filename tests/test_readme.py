"""The README's set-up commands and CI must agree: CI runs exactly the README's test command."""

from __future__ import annotations

from .conftest import ROOT


def first_code_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("```", 2)[1]
    return [line for line in block.splitlines()[1:] if line.strip()]


def test_readme_opens_with_exactly_two_commands():
    lines = first_code_block()
    assert len(lines) == 2
    assert "npas " in lines[0] and "pytest" in lines[1]


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert first_code_block()[1] in ci
