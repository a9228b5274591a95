"""The README's first command runs a real search under the promotion ladder and prints what it says it
prints: the rungs, the front read at the top rung, and the rung-to-rung agreement (issue #34)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.stories.test_readme import first_code_block

ROOT = Path(__file__).resolve().parents[2]


def _search_argv() -> list[str]:
    line = first_code_block()[0]
    cmd = line.split("&&")[-1].strip()
    argv = shlex.split(cmd)
    assert argv[:2] == ["npas", "search"], line
    return argv[2:]


def test_the_first_command_searches_with_a_wsd_recipe():
    from npas.training.recipe import load_recipe

    argv = _search_argv()
    recipe = load_recipe(argv[argv.index("--recipe") + 1])
    assert recipe.schedule == "wsd" and recipe.fork_rungs() == (12, 50, 200)


@pytest.mark.slow  # a real 8-trial search on Ray (a few minutes on 2 cores)
def test_the_first_command_prints_the_rungs_the_top_rung_front_and_the_agreement(tmp_path):
    argv = [*_search_argv(), "--storage", f"sqlite:///{tmp_path / 'npas.db'}", "--study", "readme"]
    p = subprocess.run([sys.executable, "-m", "npas", "search", *argv], cwd=ROOT, capture_output=True, text=True,
                       timeout=1200)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = p.stdout
    assert "promotion ladder at rungs 12, 50, 200 steps" in p.stderr + out, p.stderr[-2000:]  # said at the start
    m = re.search(r"^front read at the top rung: (\d+) of (\d+) trials reached T = 200 steps$", out, re.M)
    assert m and 1 <= int(m.group(1)) < int(m.group(2)) == 8, out  # the ladder stopped some below T
    assert re.search(r"^rung 12 -> 50: \d+ trial", out, re.M) and re.search(r"^rung 50 -> 200: ", out, re.M), out
    m = re.search(r"^ladder \(rungs 12, 50, 200; eta 4\): rung 12 -> (\d+) of (\d+) went on, rung 50 -> (\d+) of "
                  r"(\d+); compute ([\d.]+) N·T steps, ([\d.]+) N·T FLOPs \(N = 8 trials, T = 200 steps\)$", out, re.M)
    assert m, out
    up12, n12, up50, n50 = map(int, m.groups()[:4])
    assert n12 == 8 and up12 == n50 <= 8 // 4 and up50 == 1  # the rule: at most floor(N/4) past rung 12
    assert 0 < float(m.group(5)) < 0.5 and 0 < float(m.group(6)) < 1  # far below training all 8 to T
