"""docs/models.md "Compress a Hugging Face model": its commands run offline as written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.docs.blocks import HF, block

pytest.importorskip("transformers")


def hf_block() -> str:
    """The block without its `pip install` line: the test runs in the venv that has the extra."""
    return "\n".join(line for line in block(HF).splitlines() if not line.startswith("pip install"))


@pytest.mark.slow
def test_readme_hf_story_runs_offline(tmp_path):
    script = "set -euo pipefail\n" + hf_block()
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((tmp_path / "llama-hf" / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert json.loads((tmp_path / "small-hf" / "config.json").read_text())["model_type"] == "npas"
    assert json.loads((tmp_path / "small-llama" / "config.json").read_text())["model_type"] == "llama"
    conv = json.loads((tmp_path / "identity" / "metrics.json").read_text())["conversion"]
    assert abs(conv["val_loss"] - conv["source_val_loss"]) <= 1e-4  # identity: the checkpoint's own loss
    assert "tensor([[" in proc.stdout  # generate() through AutoModelForCausalLM
