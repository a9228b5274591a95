"""Tokenizer specs, char and byte-level BPE tokenizers, their JSON and fingerprints, and bits per byte."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from npas.errors import DataError
from npas.training.data import CharTokenizer, bundled_text
from npas.training.metrics import bits_per_byte, scored_bytes
from npas.training.tokenizers import (
    CharLevel,
    HFTokenizer,
    Tokenizer,
    encode_array,
    parse_tokenizer_spec,
    split_pieces,
    tokenizer_from_json,
    train_bpe,
)
from tests.conftest import ROOT

UNICODE = "Ça va? Naïve café — “quoted” 東京 and emoji 🎭.\nSecond line\twith tab.\n\nThird  para."


@pytest.fixture(scope="module")
def shakespeare() -> str:
    return bundled_text()[:300_000]


@pytest.fixture(scope="module")
def bpe(shakespeare) -> HFTokenizer:
    return train_bpe(shakespeare, 512)


# ------------------------------------------------------------------------------------------- specs
def test_specs_parse(tmp_path, bpe):
    assert str(parse_tokenizer_spec("char")) == "char"
    spec = parse_tokenizer_spec("bpe:4096")
    assert (spec.kind, spec.vocab_size, str(spec)) == ("bpe", 4096, "bpe:4096")
    path = tmp_path / "tokenizer.json"
    path.write_text(bpe.to_json(), encoding="utf-8")
    spec = parse_tokenizer_spec(str(path))
    assert spec.kind == "file" and spec.path == path
    assert spec.build("ignored for a file").fingerprint == bpe.fingerprint


def bad_files(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "notatok.json").write_text(json.dumps({"hello": 1}))
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "badmodel.json").write_text(json.dumps({"model": {"type": "Nope"}}))
    (tmp_path / "adir").mkdir()
    return {
        "notatok.json": "not a tokenizer",
        "broken.json": "not valid JSON",
        "list.json": "not a tokenizer",
        "badmodel.json": "could not be loaded",
        "adir": "is a directory",
        "missing.json": "does not exist",
        "missing_file_no_suffix": "neither char, bpe:N nor",
    }


@pytest.mark.parametrize("spec,needle", [
    ("bpe:0", "between 256"), ("bpe:100", "between 256"), ("bpe:abc", "whole number"),
    ("bpe:-5", "whole number"), ("bpe:", "whole number"), ("bpe", "whole number"),
    ("bpe:99999999", "between 256"), ("", "empty"), ("word", "neither char, bpe:N nor"),
])
def test_bad_specs_one_line(spec, needle):
    with pytest.raises(DataError) as err:
        parse_tokenizer_spec(spec)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_bad_tokenizer_files_one_line(tmp_path):
    for name, needle in bad_files(tmp_path).items():
        with pytest.raises(DataError) as err:
            parse_tokenizer_spec(str(tmp_path / name))
        assert needle in str(err.value), (name, str(err.value))
        assert "\n" not in str(err.value)


# -------------------------------------------------------------------------------------------- char
def test_char_wraps_char_tokenizer_and_its_vocab_json(shakespeare):
    old = CharTokenizer.from_text(shakespeare)
    tok = parse_tokenizer_spec("char").build(shakespeare)
    assert isinstance(tok, Tokenizer)
    assert tok.to_json() == old.to_json()  # same vocab.json format as exported models carry
    sample = shakespeare[:5000]
    assert tok.encode(sample) == old.encode(sample)
    assert encode_array(tok, sample).tolist() == old.encode(sample)
    assert encode_array(tok, sample).dtype == np.uint8
    assert tok.decode(tok.encode(sample)) == sample
    loaded = tokenizer_from_json(old.to_json())  # an exported model's vocab.json
    assert isinstance(loaded, CharLevel) and loaded.fingerprint == tok.fingerprint
    with pytest.raises(DataError, match="not in the"):
        tok.encode("日本")


# --------------------------------------------------------------------------------------------- bpe
def test_bpe_round_trip_and_vocab(bpe, shakespeare):
    assert isinstance(bpe, Tokenizer) and bpe.vocab_size == 512 and bpe.name == "bpe:512"
    for text in (shakespeare[:20_000], UNICODE, ""):
        assert bpe.decode(bpe.encode(text)) == text  # byte-level: every text round-trips, unseen chars too
    ids = bpe.encode(shakespeare[:20_000])
    assert len(ids) < 20_000 * 0.6  # merges happened: fewer tokens than chars
    assert encode_array(bpe, shakespeare[:20_000]).dtype == np.uint16
    assert bpe.encode_batch(["to be", UNICODE]) == [bpe.encode("to be"), bpe.encode(UNICODE)]
    with pytest.raises(DataError, match="outside the vocabulary"):
        bpe.decode([0, 512])


def test_pieces_encode_as_the_whole_text(bpe, shakespeare):
    text = shakespeare + UNICODE * 3 + "no newline " * 500
    pieces = split_pieces(text, size=97)
    assert "".join(pieces) == text and len(pieces) > 1000
    whole = bpe.hf.encode(text, add_special_tokens=False).ids
    cut = [i for e in bpe.hf.encode_batch(pieces, add_special_tokens=False) for i in e.ids]
    assert cut == whole
    assert bpe.encode(text) == whole == encode_array(bpe, text).tolist()


def test_bpe_trained_on_train_text_never_saw_validation(shakespeare):
    val_word = "Quetzalcoatlus"
    val = f"The {val_word} flew. " * 300
    train_only = train_bpe(shakespeare, 600)
    with_val = train_bpe(shakespeare + val, 600)  # control: the same call given the held-out text
    def knows(tok: HFTokenizer) -> bool:
        return any("etzalc" in t for t in tok.hf.get_vocab())
    assert knows(with_val) and not knows(train_only)
    assert len(train_only.encode(val_word)) > len(with_val.encode(val_word))


_TRAIN_IN_CHILD = """
import hashlib
from npas.training.data import bundled_text
from npas.training.tokenizers import train_bpe, encode_array
text = bundled_text()[:300_000]
tok = train_bpe(text, 512)
ids = encode_array(tok, text)
print(tok.fingerprint, hashlib.sha256(ids.tobytes()).hexdigest())
"""


def test_bpe_is_deterministic_across_processes(bpe, shakespeare):
    runs = [subprocess.run([sys.executable, "-c", _TRAIN_IN_CHILD], cwd=ROOT, capture_output=True, text=True,
                           timeout=300, env={**os.environ, "PYTHONHASHSEED": str(seed)})
            for seed in (1, 2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
    outs = [r.stdout.split() for r in runs]
    here = [bpe.fingerprint, hashlib.sha256(encode_array(bpe, shakespeare).tobytes()).hexdigest()]
    assert outs[0] == outs[1] == here


def test_json_round_trip_and_fingerprint(bpe, tmp_path):
    again = tokenizer_from_json(bpe.to_json())
    assert isinstance(again, HFTokenizer)
    assert again.fingerprint == bpe.fingerprint and again.encode(UNICODE) == bpe.encode(UNICODE)
    other = train_bpe(bundled_text()[300_000:600_000], 512)
    assert other.fingerprint != bpe.fingerprint  # a tokenizer trained on other text is another tokenizer
    assert len(bpe.fingerprint) == 16 and int(bpe.fingerprint, 16) >= 0


def test_token_byte_lengths_spell_the_utf8_bytes(bpe, shakespeare):
    for tok in (bpe, CharLevel.from_text(UNICODE)):
        lengths = tok.token_byte_lengths()
        assert lengths.shape == (tok.vocab_size,)
        assert scored_bytes(encode_array(tok, UNICODE), lengths) == len(UNICODE.encode("utf-8"))
    text = shakespeare[:10_000]
    assert scored_bytes(np.array(bpe.encode(text)), bpe.token_byte_lengths()) == len(text.encode("utf-8"))


# ------------------------------------------------------------------------------------ bits per byte
def _char_model_loss(text: str) -> tuple[float, np.ndarray, CharLevel]:
    """Mean next-char cross entropy (nats) of a seeded random bigram model, and the target ids."""
    tok = CharLevel.from_text(text)
    ids = torch.tensor(tok.encode(text))
    torch.manual_seed(0)
    logits_table = torch.randn(tok.vocab_size, tok.vocab_size)
    x, y = ids[:-1], ids[1:]
    loss = torch.nn.functional.cross_entropy(logits_table[x], y).item()
    return loss, y.numpy(), tok


def test_bits_per_byte_of_char_model_is_bits_per_char_on_ascii():
    text = "It is a truth universally acknowledged, that a single man in possession of a good fortune.\n" * 5
    loss, y, tok = _char_model_loss(text)
    bpc = loss / math.log(2)
    bpb = bits_per_byte(loss, len(y), scored_bytes(y, tok.token_byte_lengths()))
    assert bpb == pytest.approx(bpc, rel=1e-12)


def test_bits_per_byte_divides_by_bytes_not_chars():
    text = "Ça été très délicat à côté — naïve café. " * 10
    loss, y, tok = _char_model_loss(text)
    n_bytes = scored_bytes(y, tok.token_byte_lengths())
    assert n_bytes > len(y)  # accented characters are two bytes each
    bpb = bits_per_byte(loss, len(y), n_bytes)
    assert bpb == pytest.approx(loss * len(y) / math.log(2) / n_bytes, rel=1e-12)
    assert bpb < loss / math.log(2)
    with pytest.raises(ValueError):
        bits_per_byte(loss, 10, 0)


def test_saved_truncation_and_padding_do_not_cut_the_corpus(bpe, shakespeare):
    d = json.loads(bpe.to_json())
    d["truncation"] = {"direction": "Right", "max_length": 16, "strategy": "LongestFirst", "stride": 0}
    d["padding"] = {"strategy": {"Fixed": 64}, "direction": "Right", "pad_to_multiple_of": None,
                    "pad_id": 0, "pad_type_id": 0, "pad_token": "[PAD]"}
    tok = tokenizer_from_json(json.dumps(d))
    text = shakespeare[:5000]
    assert tok.encode(text) == bpe.encode(text)  # not 16 tokens, not padded to 64
    assert tok.fingerprint == bpe.fingerprint
    assert HFTokenizer.from_json(bpe.to_json()).fingerprint == bpe.fingerprint
    assert CharLevel.from_json(CharLevel.from_text("abc").to_json()).encode("cab") == [2, 0, 1]
    with pytest.raises(DataError, match="not a Hugging Face"):
        HFTokenizer.from_json(CharLevel.from_text("abc").to_json())
