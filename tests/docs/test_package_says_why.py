"""The package says why, not history: issue numbers and references to the benches belong in docs/ and
the experiments. A docstring that cites `issue #35` or `experiments/x.py` (or `benchmarks/`) ages with the tracker and the bench
layout; the reason itself, or a link into docs/results/, does not."""

from __future__ import annotations

import re

from tests.conftest import ROOT

HISTORY = re.compile(r"\bissues? #?\d{1,3}\b|#\d{2}\b|\b(?:bench|benchmarks|experiments)/")


def test_no_module_of_npas_cites_an_issue_or_a_bench_file():
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
             for p in sorted((ROOT / "npas").rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if HISTORY.search(line)]
    assert not found, "say why instead (history goes to docs/ or the experiments):\n" + "\n".join(found)


def test_the_pattern_finds_what_it_is_for():
    assert all(HISTORY.search(s) for s in ("(issue #35)", "issues 33", "see bench/lr_transfer.py", "of #34",
                                           "see experiments/lr_transfer.py", "benchmarks/data.py"))
    assert not any(HISTORY.search(s) for s in ("a bench-free line", "x#1", "tissue 3x"))
