"""docs/models.md "Compress a model you trained": write the reference, train it, convert it into another
allocation of its chassis, and continue training the converted model.

What the test changes, and why: `--recipe long` trains 4,000 steps (about 15 minutes on 2 cores); the
test trains the same command with `--recipe smoke --steps 30`, which takes the same path. `best.yaml` is
what `npas export` would write for a study on that space: here a cycle-tied allocation with LoRA,
fitted by the space itself."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.docs.blocks import COMPRESS, block, commands


def as_run(line: str) -> list[str]:
    words = shlex.split(line.replace("--recipe long", "--recipe smoke --steps 30"), comments=True)
    return [sys.executable if words[0] == "python" else str(Path(sys.executable).parent / words[0]), *words[1:]]


@pytest.mark.slow  # trains a model twice and converts it
def test_compress_a_model_you_trained(tmp_path):
    import npas
    import npas.builtin

    space = npas.load_space(npas.builtin.space_path("full"))
    cand = space.candidate({**{k: kn.default for k, kn in space.chassis.items()},
                            **space.baselines()["cycle_tying"], "lora_rank": 8})
    assert cand.feasible, cand.reason
    (tmp_path / "best.yaml").write_text(cand.config.to_yaml())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    lines = commands(block(COMPRESS))
    assert [shlex.split(c)[:2] for c in lines[1:]] == [["npas", "train"], ["npas", "convert"], ["npas", "train"]]
    first, rest = lines[0].split(" > ")
    with open(tmp_path / rest.strip(), "w") as out:  # the block's `python -c ... > reference.yaml`
        p = subprocess.run(as_run(first), cwd=tmp_path, env=env, stdout=out, stderr=subprocess.PIPE, text=True,
                           timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    for line in lines[1:]:
        p = subprocess.run(as_run(line), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert p.returncode == 0, f"{line}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
    metrics = json.loads((tmp_path / "small" / "metrics.json").read_text())
    assert metrics["conversion"]["val_loss"] > 0 and (tmp_path / "small" / "provenance.json").is_file()
    assert (tmp_path / "small-tuned" / "model.safetensors").is_file()
