"""The README's first command runs a real search under the promotion ladder and prints what the README
shows it printing (its abridged output block, numbers aside): the rungs, the front read at the top rung,
the rung-to-rung agreement and each rung's trials."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.docs.blocks import FIRST, block
from tests.stories.test_readme import first_code_block

OUTPUT = "README.md > npas — Neural Parameter Allocation Search > text"


def _search_argv() -> list[str]:
    line = first_code_block()[0]
    cmd = line.split("&&")[-1].strip()
    argv = shlex.split(cmd)
    assert argv[:2] == ["npas", "search"], line
    return argv[2:]


def shown_lines() -> list[re.Pattern]:
    """The README's output block as patterns: numbers match any number, `…` elides lines or a line's
    rest, and the lines must appear in this order."""
    out = []
    for line in block(OUTPUT).splitlines():
        if line.strip() == "…":
            continue
        parts = []
        for piece in line.split("…"):
            tokens = re.split(r"(\d[\d,.]*\d|\d)", piece)
            parts.append("".join(r"[\d,.]+" if i % 2 else re.escape(t) for i, t in enumerate(tokens)))
        out.append(re.compile("^" + ".*".join(parts) + ("" if line.endswith("…") else "$")))
    return out


def test_the_first_command_searches_with_a_wsd_recipe():
    from npas.training.recipe import load_recipe

    argv = _search_argv()
    recipe = load_recipe(argv[argv.index("--recipe") + 1])
    assert recipe.schedule == "wsd" and recipe.fork_rungs() == (12, 200)
    assert block(FIRST).splitlines()[0].endswith(" ".join(["npas", "search", *argv]))


def test_the_output_patterns_match_what_they_show_and_refuse_other_lines():
    patterns = shown_lines()
    assert len(patterns) >= 5
    front = next(p for p in patterns if p.match("front read at the top rung: 2 of 8 trials reached T = 200 steps"))
    assert front.match("front read at the top rung: 1 of 8 trials reached T = 200 steps")
    assert not front.match("front read at the top rung: 1 of 8 trials reached T = 200 steps (1 still running)")


@pytest.mark.slow  # a real 8-trial search on Ray (a few minutes on 2 cores)
def test_the_first_command_prints_what_the_readme_shows(tmp_path):
    """Run in an empty folder that has the checkout's search_spaces/, so the study lands in the
    default storage, sqlite:///trials/npas.db, as the README's output block says."""
    (tmp_path / "search_spaces").symlink_to(ROOT / "search_spaces")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("NPAS_STORAGE", None)
    p = subprocess.run([sys.executable, "-m", "npas", "search", *_search_argv()], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = p.stdout
    assert "promotion ladder at rungs 12, 200 steps" in p.stderr, p.stderr[-2000:]  # said at the start
    m = re.search(r"^front read at the top rung: (\d+) of (\d+) trials reached T = 200 steps$", out, re.M)
    assert m and 1 <= int(m.group(1)) <= 2 < int(m.group(2)) == 8, out  # the ladder stopped most below T
    assert re.search(r"^rung 12 -> 200: \d+ trial", out, re.M), out
    m = re.search(r"^ladder \(rungs 12, 200; eta 4\): rung 12 -> (\d+) of (\d+) went on; "
                  r"compute ([\d.]+) N·T steps, ([\d.]+) N·T FLOPs \(N = 8 trials, T = 200 steps\)$", out, re.M)
    assert m, out
    up12, n12 = map(int, m.groups()[:2])
    assert n12 == 8 and 1 <= up12 <= 8 // 4  # the rule: at most floor(N/4) past rung 12
    assert 0 < float(m.group(3)) < 0.5 and 0 < float(m.group(4)) < 1  # far below training all 8 to T
    lines, at = (p.stderr + "\n" + out).splitlines(), 0
    for pattern in shown_lines():  # the README's abridged output, in its order
        at = next((i for i in range(at, len(lines)) if pattern.match(lines[i])), None)
        assert at is not None, f"README output line {pattern.pattern!r} not printed:\n{p.stderr[-1500:]}\n{out}"
    assert (tmp_path / "trials" / "npas.db").is_file()
