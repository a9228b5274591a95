"""The benches run: each `--quick` run exits 0 and prints its ratio lines. Speed is not asserted."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from .conftest import ROOT

# bench -> lines its output must contain (multiline regexes)
BENCHES = {
    "accounting.py": [
        r"^ratio: analytic parameter count [\d,]+ allocations/s vs build-and-count [\d,.]+ allocations/s = [\d,]+x "
        r".*(PASS|MISS)$",
        r"^record: the full accounting record .* [\d,]+ allocations/s = [\d,]+x build-and-count$",
        r"^exact: (\d+)/\1 allocations agree .* PASS$",
    ],
    "sharing_overhead.py": [
        *(rf"^{v}\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d,]+\s+(PASS|MISS)"
          for v in ("tied_all", "tied_cycle", "pooled_template_mix", "pooled_slice", "tapered_cosine3",
                    "relaxed_cycle_lora8", "atoms_qkvo_third", "kv_shared_g2")),
        r"^result: \d/8 variants within 1\.10x",
    ],
}


@pytest.mark.parametrize("bench", BENCHES)
def test_bench_quick_runs(bench):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / bench), "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for pattern in BENCHES[bench]:
        assert re.search(pattern, proc.stdout, re.MULTILINE), f"no line matching {pattern!r} in:\n{proc.stdout}"
