"""The README's "Search your own data" block runs as written, on a small generated JSONL corpus: a search
with a BPE tokenizer, export, train, sample and the dashboard report."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest

from npas.training.corpora import bundled_text
from tests.conftest import ROOT
from tests.docs.blocks import OWN_DATA, block, commands


def own_data_commands() -> list[str]:
    return commands(block(OWN_DATA))


@pytest.mark.slow  # the README's own-data story: five `npas` subprocesses, BPE, a search and a training
def test_the_readme_searches_a_users_jsonl_with_bpe(tmp_path):
    commands = own_data_commands()
    assert [shlex.split(c)[:2] for c in commands] == [["npas", "search"], ["npas", "export"], ["npas", "train"],
                                                       ["npas", "sample"], ["npas", "dashboard"]]
    assert "--tokenizer bpe:" in commands[0] and "my_corpus.jsonl" in commands[0]
    paragraphs = [p for p in bundled_text()[:150_000].split("\n\n") if p.strip()]
    with open(tmp_path / "my_corpus.jsonl", "w", encoding="utf-8") as fh:
        for i, p in enumerate(paragraphs):
            fh.write(json.dumps({"id": i, "text": p}) + "\n")
    env = {**os.environ, "NPAS_STORAGE": f"sqlite:///{tmp_path}/npas.db", "NPAS_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": str(ROOT)}
    outputs = []
    for command in commands:
        argv = [sys.executable, "-m", "npas", *shlex.split(command)[1:]]
        proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{command}\n{proc.stdout}\n{proc.stderr}"
        outputs.append(proc.stdout)
    tok = json.loads((tmp_path / "best.tokenizer.json").read_text())
    assert tok["model"]["type"] == "BPE" and len(tok["model"]["vocab"]) == 512
    assert (tmp_path / "my_model" / "tokenizer.json").read_text() == (tmp_path / "best.tokenizer.json").read_text()
    metrics = json.loads((tmp_path / "my_model" / "metrics.json").read_text())
    assert metrics["data"]["tokenizer_fingerprint"] and metrics["result"]["val_bpb"] > 0
    report = tmp_path / "report" / "index.html"
    assert report.is_file() and "mine" in report.read_text(encoding="utf-8")  # the dashboard of the study
    sample = outputs[-2]
    assert sample.startswith("The ") and len(sample) > len("The ") + 20  # 40 BPE tokens decoded back to text
