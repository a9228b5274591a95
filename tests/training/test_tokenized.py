"""The seam from split text to token streams: BPE trained on train only, cached splits, batches, bpb."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from npas.training.data import bundled_text
from npas.training.tokenized import tokenize_splits
from npas.training.tokenizers import encode_array, parse_tokenizer_spec, tokenizer_from_json

TRAIN = bundled_text()[:150_000]
VAL = "The Quetzalcoatlus flew over Elsinore. " * 200
TEST = "Ünïcödé in the test split — 東京. " * 50


def test_bpe_sees_only_the_training_split(tmp_path):
    got = tokenize_splits({"train": TRAIN, "val": VAL, "test": TEST}, parse_tokenizer_spec("bpe:400"),
                          cache_dir=tmp_path)
    assert not any("etzalc" in t for t in got.tokenizer.hf.get_vocab())
    control = tokenize_splits({"train": TRAIN + VAL, "val": VAL}, parse_tokenizer_spec("bpe:400"),
                              cache_dir=tmp_path)
    assert any("etzalc" in t for t in control.tokenizer.hf.get_vocab())  # the check above can fail
    for split, text in (("train", TRAIN), ("val", VAL), ("test", TEST)):
        assert np.array_equal(got.ids(split), encode_array(got.tokenizer, text))
        assert got.files[split].n_bytes == len(text.encode("utf-8"))
    d = got.describe()
    assert d["tokenizer"] == "bpe:400" and d["vocab_size"] == 400 and d["val_tokens"] == len(got.ids("val"))


def test_reloaded_tokenizer_reuses_the_cache(tmp_path):
    first = tokenize_splits({"train": TRAIN, "val": VAL}, parse_tokenizer_spec("bpe:300"), cache_dir=tmp_path)
    saved = first.tokenizer.to_json()  # what a study stores; a worker or resume reloads it, no retraining
    again = tokenize_splits({"train": TRAIN, "val": VAL}, tokenizer_from_json(saved), cache_dir=tmp_path)
    assert all(f.hit for f in again.files.values())
    assert again.tokenizer.fingerprint == first.tokenizer.fingerprint


def test_char_vocabulary_covers_every_split(tmp_path):
    got = tokenize_splits({"train": TRAIN, "test": TEST}, parse_tokenizer_spec("char"), cache_dir=tmp_path)
    assert got.tokenizer.decode(got.ids("test")) == TEST  # 'ü', '東' appear only in the test split


def test_windows_and_bits_per_byte(tmp_path):
    got = tokenize_splits({"train": TRAIN, "test": TEST}, parse_tokenizer_spec("bpe:300"), cache_dir=tmp_path)
    starts = torch.tensor([0, 5, len(got.ids("test")) - 9])
    x, y = got.window_batch("test", starts, 8)
    assert x.shape == y.shape == (3, 8) and x.dtype == torch.int64
    ids = got.ids("test").astype(np.int64)
    assert x[1].tolist() == ids[5:13].tolist() and y[1].tolist() == ids[6:14].tolist()
    whole = torch.from_numpy(ids[1:])
    assert got.bits_per_byte(2.0, whole) == pytest.approx(
        2.0 * len(whole) / math.log(2) / (len(TEST.encode("utf-8")) - got.byte_lengths[ids[0]]))
