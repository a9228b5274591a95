"""Padded vocabularies (issue 37, gap b): a checkpoint whose embedding has more rows than its
tokenizer.json has tokens (padded to a multiple of 64 for speed, as many are) converts with its loss
pass, its npas directory loads with `load_trained`, and npas's sampler never emits a padding row; a
tokenizer with more tokens than the model has rows is refused before anything is written, saying why.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM  # noqa: E402

from npas.conversion.hf_convert import convert_hf_dir  # noqa: E402
from npas.conversion.hf_source import read_hf_dir  # noqa: E402
from npas.errors import DataError  # noqa: E402
from npas.presentation.cli import main  # noqa: E402
from npas.training.train import load_trained, sample  # noqa: E402
from tests.conversion.test_hf import (  # noqa: E402
    V,
    ids,
    make_llama,
    tied_lora,
    tokenizer,  # noqa: E402,F401  (the module-scoped BPE fixture)
)

PADDED = 320  # the tokenizer's 300 ids, rounded up to a multiple of 64


def test_a_padded_vocabulary_converts_with_its_loss_pass_and_loads(tmp_path, tokenizer):  # noqa: F811
    src = tmp_path / "src"
    hf = make_llama(src, tokenizer, vocab=PADDED)
    with torch.no_grad():  # padding rows that would win every argmax if the sampler read them
        hf.lm_head.weight[V:] = 10 * hf.lm_head.weight[:V].abs().max()
    hf.save_pretrained(src)
    ck = read_hf_dir(src)
    assert ck.tokenizer_note is None and ck.cfg.chassis.vocab_size == PADDED
    res = convert_hf_dir(src, None, tmp_path / "out")
    assert res.note is None and math.isfinite(res.val_loss)
    assert abs(res.val_loss - res.source_val_loss) <= 1e-4  # the identity conversion, scored on real ids
    model, tok, cfg = load_trained(tmp_path / "out")
    assert tok.vocab_size == V and cfg.chassis.vocab_size == PADDED
    x = ids()
    with torch.no_grad():
        assert (model(x)[0] - hf(x).logits).abs().max().item() <= 1e-4
        assert int(model(x)[0][0, -1].argmax()) >= V  # the padding rows do win the raw argmax
    text = sample(model, tok, "ROMEO:", tokens=8, temperature=0)
    assert tok.encode(text) and max(tok.encode(text)) < V  # yet every sampled id is a token
    assert sample(model, tok, "ROMEO:", tokens=8, temperature=1.0, seed=1)  # sampling decodes too


def test_a_padded_vocabulary_writes_hf_and_converts_from_the_cli(tmp_path, tokenizer, capsys):  # noqa: F811
    src = tmp_path / "src"
    make_llama(src, tokenizer, tied=True, vocab=PADDED)
    alloc = tmp_path / "tied.yaml"
    alloc.write_text(tied_lora(read_hf_dir(src).cfg).to_yaml())
    assert main(["convert", str(src), "--to", str(alloc), "--out", str(tmp_path / "npas")]) == 0
    out = capsys.readouterr().out
    assert re.search(r"val_loss before training \d+\.\d+ nats \(source \d+\.\d+\)", out), out
    res = convert_hf_dir(src, alloc, tmp_path / "hf", fmt="hf")
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    model, _, _ = load_trained(tmp_path / "npas")
    x = ids(1, 12)
    with torch.no_grad():
        assert back(x).logits.shape[-1] == PADDED
        assert (back(x).logits - model(x)[0]).abs().max().item() <= 1e-5
        assert (back(x).logits - res.conversion.model(x)[0]).abs().max().item() <= 1e-5


def test_more_tokens_than_rows_is_refused_before_anything_is_written(tmp_path, tokenizer):  # noqa: F811
    """Once converted without a loss pass, into a directory `npas train` and `npas sample` then refused
    (the tokenizer's ids past the embedding): now refused up front, naming both ways out."""
    src = tmp_path / "src"
    make_llama(src, tokenizer, vocab=256)
    ck = read_hf_dir(src)
    assert "has 300 tokens but the model's vocab_size is only 256" in ck.tokenizer_note
    with pytest.raises(DataError, match="only 256.*remove tokenizer.json"):
        convert_hf_dir(src, None, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_training_continues_from_a_padded_conversion_but_not_from_scratch(tmp_path, tokenizer, capsys):  # noqa: F811
    src = tmp_path / "src"
    make_llama(src, tokenizer, tied=True, vocab=PADDED)
    convert_hf_dir(src, None, tmp_path / "conv")
    capsys.readouterr()
    assert main(["train", str(tmp_path / "conv"), "--recipe", "smoke", "--steps", "3",
                 "--out", str(tmp_path / "more")]) == 0
    model, tok, cfg = load_trained(tmp_path / "more")
    assert cfg.chassis.vocab_size == PADDED and tok.vocab_size == V
    # from scratch a chassis wider than its tokenizer is still a mistake: one line, exit 2
    (tmp_path / "alloc.yaml").write_text(cfg.to_yaml())
    capsys.readouterr()
    code = main(["train", str(tmp_path / "alloc.yaml"), "--recipe", "smoke", "--steps", "3",
                 "--tokenizer", str(src / "tokenizer.json"), "--out", str(tmp_path / "scratch")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and f"chassis vocab_size={PADDED}" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "scratch").exists()
