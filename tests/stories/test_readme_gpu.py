"""The README's "On a GPU box" block: its search runs on a machine with a CUDA GPU, and on one without
is refused in one line for want of a GPU, before anything is written.

The `pip install` line is left out: the test runs in the environment that is already installed (and
has no network). On a GPU the search runs as written but for its trial target, 64 `proxy` trials, cut
to 4 so that a test can afford it."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.docs.blocks import GPU, block, commands


def search_argv() -> list[str]:
    lines = [shlex.split(c, comments=True) for c in commands(block(GPU))]
    assert lines[0][:2] == ["pip", "install"] and len(lines) == 2, lines
    argv = lines[1]
    assert argv[:2] == ["npas", "search"] and "--gpus-per-trial" in argv, argv
    return argv[2:]


@pytest.mark.slow  # starts Ray (and on a GPU machine runs 4 proxy trials)
def test_the_gpu_block_runs_or_is_refused_for_want_of_a_gpu(tmp_path):
    import torch

    argv = search_argv()
    gpu = torch.cuda.is_available()
    if gpu:
        argv[argv.index("--trials") + 1] = "4"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("NPAS_STORAGE", None)
    p = subprocess.run([sys.executable, "-m", "npas", "search", *argv], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=1800)
    if gpu:
        assert p.returncode == 0, p.stderr[-3000:]
        assert "front read at the top rung" in p.stdout or "Pareto front" in p.stdout, p.stdout[-2000:]
        return
    assert p.returncode == 2, p.stdout[-2000:] + p.stderr[-2000:]
    err = p.stderr.strip().splitlines()
    assert err[-1].startswith("npas search: error: --gpus-per-trial 0.125 but the Ray cluster has 0 GPUs"), err
    assert not (tmp_path / "trials" / "npas.db").exists()  # refused before the database was touched
