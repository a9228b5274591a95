"""`npas search --init-from HF_DIR` and `npas train --format hf` (issue 37): a Hugging Face checkpoint is a
starting point like an npas model directory (its tokenizer.json is the study's; without one, --tokenizer
is needed), and a trained allocation is written as a checkpoint AutoModelForCausalLM loads."""

from __future__ import annotations

import json
import sys

import optuna
import pytest
import torch

pytest.importorskip("transformers")

import npas  # noqa: E402
from npas.conversion.init_from import describe_source, initial_state, source_tokenizer  # noqa: E402
from npas.errors import ConfigError, DataError  # noqa: E402
from npas.presentation.cli import main  # noqa: E402
from npas.training.data import load_corpus  # noqa: E402
from tests.conversion.test_hf import make_llama  # noqa: E402

SPACE = """name: hf-tiny
chassis: {vocab_size: 300, context: 64, d_model: 32, n_layers: 3, n_heads: 4, d_ff: 64, activation: swiglu,
  family: llama, n_kv_heads: 2, rope_theta: 10000.0, rms_norm_eps: 1.0e-6, tie_embeddings: true}
budget: 0.6x
objectives: [val_loss, train_memory_bytes]
recipe: smoke
fit: {width: mlp}
knobs:
  tying: {mode: [cycle], unique_blocks: 2}
  relaxation: {rank: [4]}
"""


@pytest.fixture(scope="module")
def bpe():
    from npas.training.data import bundled_text
    from npas.training.tokenizers import train_bpe

    return train_bpe(bundled_text()[:100_000], 300)


def test_init_from_a_checkpoint_reads_its_tokenizer_and_converts_each_trial(tmp_path, bpe):
    src = tmp_path / "src"
    hf = make_llama(src, bpe, tied=True)
    assert source_tokenizer(src) == str(src / "tokenizer.json")
    (tmp_path / "space.yaml").write_text(SPACE)
    space = npas.load_space(tmp_path / "space.yaml")
    corpus = load_corpus(None, 0.1, 0.1, tokenizer=source_tokenizer(src))
    space = space.bind(vocab_size=corpus.vocab_size)
    init = describe_source(src, space.reference_chassis, corpus)
    assert len(init["weights"]) == 16
    cfg = space.sample(optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()).config
    assert cfg is not None and cfg.n_blocks == 2
    state = initial_state(init, cfg, 0)
    model = npas.build_model(cfg)
    model.load_state_dict(state)
    x = torch.randint(0, 300, (1, 16))
    with torch.no_grad():  # LoRA keeps the converted model near the source's function
        ref = hf(x).logits
        assert (model(x)[0] - ref).abs().max() < (ref.abs().max())


def test_a_conflicting_tokenizer_or_none_at_all_is_refused(tmp_path, bpe):
    src = tmp_path / "src"
    make_llama(src, bpe, tied=True)
    (tmp_path / "space.yaml").write_text(SPACE)
    space = npas.load_space(tmp_path / "space.yaml")
    char = load_corpus(None, 0.1, 0.1)
    with pytest.raises((DataError, ConfigError), match="drop --tokenizer"):
        describe_source(src, space.bind(vocab_size=char.vocab_size).reference_chassis, char)
    (src / "tokenizer.json").unlink()
    (src / "tokenizer.model").write_bytes(b"\x00sentencepiece")
    with pytest.raises(DataError, match="only tokenizer.model.*--tokenizer"):
        source_tokenizer(src)


def test_format_hf_fails_in_one_line_without_transformers(tmp_path, monkeypatch, capsys):
    src = tmp_path / "src"
    make_llama(src)
    capsys.readouterr()
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    out = tmp_path / "out"
    assert main(["convert", str(src), "--out", str(out), "--format", "hf"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and 'pip install "npas[hf]"' in err and not out.exists()


def test_train_format_hf_writes_the_npas_model_type_for_a_tied_allocation(tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    from npas.allocation.config import ArchConfig, Chassis

    ch = Chassis(vocab_size=68, context=64, d_model=32, n_layers=3, n_heads=4, d_ff=64, activation="swiglu",
                 family="llama", n_kv_heads=2)
    cfg = ArchConfig(chassis=ch, mlp_widths=(64,) * 3, block_of_layer=(0, 1, 0), lora_attn=(4,) * 3)
    (tmp_path / "a.yaml").write_text(cfg.to_yaml())
    out = tmp_path / "hf"
    assert main(["train", str(tmp_path / "a.yaml"), "--recipe", "smoke", "--steps", "3", "--out", str(out),
                 "--format", "hf", "--device", "cpu"]) == 0
    assert "npas model type" in capsys.readouterr().out
    assert json.loads((out / "config.json").read_text())["model_type"] == "npas"
    assert not (out / "config.yaml").exists() and (out / "tokenizer.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.npas.cfg.hash == cfg.hash
    assert main(["convert", str(out), "--out", str(tmp_path / "x")]) == 2  # not a LLaMA architecture: refused
    assert "NpasForCausalLM" in capsys.readouterr().err


def test_a_space_of_another_chassis_is_refused_with_the_checkpoints_chassis(tmp_path, bpe):
    src = tmp_path / "src"
    make_llama(src, bpe, tied=True)
    (tmp_path / "space.yaml").write_text(SPACE.replace("d_model: 32", "d_model: 64"))
    corpus = load_corpus(None, 0.1, 0.1, tokenizer=source_tokenizer(src))
    space = npas.load_space(tmp_path / "space.yaml").bind(vocab_size=corpus.vocab_size)
    with pytest.raises(ConfigError, match=r"d_model differs.*give the space the checkpoint's chassis: \{.*d_model: 32"):
        describe_source(src, space.reference_chassis, corpus)
