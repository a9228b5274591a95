"""Corpus loading, the contiguous train/validation/test split, batches, the tokenizer and data errors."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from npas.errors import DataError
from npas.training.data import (
    CharTokenizer,
    build_corpus,
    bundled_text,
    chars_needed,
    chunk_length,
    load_corpus,
    split_bounds,
    split_sizes,
)

TEXT = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" * 20


def write(tmp_path: Path, name: str, data: str | bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return p


# ---------------------------------------------------------------------------------- bundled corpus
def test_bundled_corpus_shape_and_fingerprint():
    c = load_corpus()
    assert c.n_chars == 3_546_577
    assert c.vocab_size == 68
    assert len(c.train) + len(c.val) + len(c.test) == c.n_chars
    assert c.train.dtype == torch.uint8
    assert 0.09 < len(c.val) / c.n_chars < 0.11
    assert 0.09 < len(c.test) / c.n_chars < 0.11
    assert len(c.fingerprint) == 16 and int(c.fingerprint, 16) >= 0
    assert c.source == "bundled:shakespeare"
    assert load_corpus() is c  # cached in-process: many tests and trials load it
    assert load_corpus(c.source) is c
    assert load_corpus(val_fraction=0.2) is not c


def test_split_holds_out_whole_contiguous_chunks_without_overlap():
    text = bundled_text()
    c = load_corpus()
    bounds = split_bounds(len(text), 0.1, 0.1)
    train_b, val_b, test_b = bounds["train"], bounds["val"], bounds["test"]
    size = chunk_length(len(text))
    assert size == 8192
    # ranges partition the text: disjoint, in order, nothing lost
    spans = sorted(train_b + val_b + test_b)
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert not set(train_b) & set(val_b) and not set(test_b) & (set(train_b) | set(val_b))
    assert test_b[0][0] < len(text) // 10 and test_b[-1][1] > len(text) * 9 // 10  # test spread too
    # every held-out chunk is a full-length contiguous passage of the text, spread over the corpus
    assert all(b - a == size for a, b in val_b)
    assert val_b[0][0] < len(text) // 10 and val_b[-1][1] > len(text) * 9 // 10
    first = c.tokenizer.decode(c.val[:size])
    a, b = val_b[0]
    assert first == text[a:b]
    second = c.tokenizer.decode(c.val[size : 2 * size])
    assert second == text[val_b[1][0] : val_b[1][1]]
    # the train stream is the text with those chunks cut out
    assert c.tokenizer.decode(c.train[: train_b[0][1]]) == text[: train_b[0][1]]


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 400_000), f=st.floats(0.01, 0.25), t=st.floats(0.01, 0.25))
def test_split_sizes_partition_and_fraction(n, f, t):
    sizes = split_sizes(n, f, t)
    assert sizes["train"] + sizes["val"] + sizes["test"] == n
    chunks = -(-n // chunk_length(n))
    held = (sizes["val"] + sizes["test"]) / chunk_length(n)
    assert abs(held - round(chunks * (f + t))) <= 1  # round(n_chunks * (f + t)) chunks held out
    assert abs(sizes["test"] / chunk_length(n) - round(chunks * (f + t)) * t / (f + t)) <= 1.5


def test_get_batch_reproducible_and_shifted():
    c = load_corpus()
    x1, y1 = c.get_batch("train", 4, 32, torch.Generator().manual_seed(7))
    x2, y2 = c.get_batch("train", 4, 32, torch.Generator().manual_seed(7))
    x3, _ = c.get_batch("train", 4, 32, torch.Generator().manual_seed(8))
    assert x1.shape == (4, 32) and x1.dtype == torch.long
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(x1, x3)
    assert torch.equal(x1[:, 1:], y1[:, :-1])
    xv, _ = c.get_batch("val", 2, 16, torch.Generator().manual_seed(0))
    assert xv.max() < c.vocab_size


# ---------------------------------------------------------------------------------------- tokenizer
def test_tokenizer_sorted_and_round_trips_json():
    tok = CharTokenizer.from_text("banana!")
    assert tok.chars == ("!", "a", "b", "n")
    assert tok.encode("nab") == [3, 1, 2]
    assert tok.decode(tok.encode("banana!")) == "banana!"
    again = CharTokenizer.from_json(tok.to_json())
    assert again == tok and again.encode("ban") == tok.encode("ban")
    assert json.loads(tok.to_json())["chars"] == ["!", "a", "b", "n"]


@settings(max_examples=50, deadline=None)
@given(st.text(min_size=1, max_size=200))
def test_tokenizer_round_trip_any_text(text):
    tok = CharTokenizer.from_text(text)
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode(tok.encode_tensor(text)) == text
    assert tok.encode_tensor(text).tolist() == tok.encode(text)


def test_tokenizer_names_unknown_characters():
    tok = CharTokenizer.from_text("abc")
    with pytest.raises(DataError, match=r"2 character\(s\) not in the 3-character vocabulary: 'x', 'z'"):
        tok.encode("axbz")
    with pytest.raises(DataError, match="outside the vocabulary"):
        tok.decode([0, 9])
    with pytest.raises(DataError, match="type 'char'"):
        CharTokenizer.from_json('{"chars": "abc"}')
    with pytest.raises(DataError, match="not valid JSON"):
        CharTokenizer.from_json("{nope")


# ------------------------------------------------------------------------------------ user corpora
def test_load_text_file_directory_and_gzip(tmp_path):
    f = write(tmp_path, "a.txt", TEXT)
    c = load_corpus(f)
    assert c.n_chars == len(TEXT) and c.source == str(f)
    assert c.tokenizer.decode(torch.cat([c.train, c.val])) != ""
    d = tmp_path / "dir"
    d.mkdir()
    write(d, "2.txt", "world\n" * 100)
    write(d, "1.txt", "hello\n" * 100)
    write(d, "ignored.md", "###")
    cd = load_corpus(d)
    assert cd.n_chars == 1200 + 2 and "#" not in cd.tokenizer.chars and cd.source == str(d)  # files joined by "\n\n"
    assert load_corpus(cd.source).fingerprint == cd.fingerprint  # a source string reloads its corpus
    # sorted by name: 1.txt comes first, so the first chunk (train) starts with hello
    assert cd.tokenizer.decode(cd.train[:5]) == "hello"
    gz = write(tmp_path, "c.txt.gz", gzip.compress(TEXT.encode()))
    assert load_corpus(gz).fingerprint == c.fingerprint


def test_missing_path_error(tmp_path):
    with pytest.raises(DataError, match=r"nope\.txt does not exist; pass a \.txt/\.jsonl"):
        load_corpus(tmp_path / "nope.txt")


def test_empty_file_error(tmp_path):
    with pytest.raises(DataError, match=r"empty\.txt is empty \(1 documents, none with text\)"):
        load_corpus(write(tmp_path, "empty.txt", ""))
    with pytest.raises(DataError, match=r"blank\.txt is empty"):
        load_corpus(write(tmp_path, "blank.txt", " \n\n \t"))


def test_binary_file_errors(tmp_path):
    with pytest.raises(DataError, match=r"looks binary \(NUL byte at offset 3\)"):
        load_corpus(write(tmp_path, "x.bin", b"abc\x00def"))
    with pytest.raises(DataError, match=r"not UTF-8 \(undecodable byte at offset 3, line 1\)"):
        load_corpus(write(tmp_path, "latin1.txt", "café".encode("latin-1") + b"x"))


def test_unreadable_file_error(tmp_path, monkeypatch):
    f = write(tmp_path, "locked.txt", TEXT)

    def deny(self):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", deny)
    with pytest.raises(DataError, match=r"cannot read corpus file .*locked\.txt: Permission denied"):
        load_corpus(f)


def test_empty_directory_error(tmp_path):
    with pytest.raises(DataError, match=r"holds no files matching '\*\*/\*\.txt'; add some or pass --data-glob"):
        load_corpus(tmp_path)


def test_too_small_for_recipe_says_how_many_chars(tmp_path):
    c = load_corpus(write(tmp_path, "short.txt", TEXT[:300]))
    c.check_fits(seq_len=8, batch_size=4)
    need = chars_needed(64, 0.1)
    with pytest.raises(DataError) as err:
        c.check_fits(seq_len=64, batch_size=16)
    msg = str(err.value)
    assert "too small for seq_len=64" in msg and "needs 65" in msg
    assert f"provide at least {need} characters" in msg
    # the stated number is exact: that many characters fit, one fewer does not
    long_text = (TEXT * 10)[:need]
    load_corpus(write(tmp_path, "enough.txt", long_text)).check_fits(64, 16)
    with pytest.raises(DataError, match="too small"):
        load_corpus(write(tmp_path, "almost.txt", long_text[:-1])).check_fits(64, 16)


# ------------------------------------------------------------------------------------ test split
def _letter_corpus(n_chunks: int = 40):
    """Chunk i of the text is one letter repeated: a token's letter names the chunk it came from."""
    letters = [chr(ord("A") + i) if i < 26 else chr(ord("a") + i - 26) for i in range(n_chunks)]
    text = "".join(ch * 8192 for ch in letters)
    assert chunk_length(len(text)) == 8192
    return build_corpus(text, "synthetic", 0.1, 0.1), letters


def test_test_split_never_reaches_training_or_validation_exhaustively():
    from npas.training.proxy import eval_batches
    from npas.training.recipe import Recipe

    c, letters = _letter_corpus()
    bounds = split_bounds(len(letters) * 8192, 0.1, 0.1)
    test_letters = {letters[a // 8192] for a, _ in bounds["test"]}
    assert len(test_letters) == 4 and len(bounds["val"]) == 4
    # every window a search can draw is a slice of the train or val stream: check every token of them
    seen = set(c.tokenizer.decode(c.split("train"))) | set(c.tokenizer.decode(c.split("val")))
    assert not seen & test_letters
    assert set(c.tokenizer.decode(c.split("test"))) == test_letters  # and the test stream is exactly those
    recipe = Recipe(seq_len=8, batch_size=4, eval_batches=2)
    x, _ = eval_batches(c, recipe)
    assert not set(c.tokenizer.decode(x)) & test_letters
    xt, _ = eval_batches(c, recipe, split="test")
    assert set(c.tokenizer.decode(xt)) <= test_letters


def test_bundled_test_text_absent_from_sampled_search_windows():
    from npas.training.proxy import eval_batches
    from npas.training.recipe import load_recipe

    c = load_corpus()
    test_text = c.tokenizer.decode(c.split("test"))
    recipe = load_recipe("proxy")
    g = torch.Generator().manual_seed(3)
    xs = [c.get_batch("train", 64, 96, g)[0] for _ in range(4)] + [eval_batches(c, recipe)[0].reshape(-1, 64)]
    windows = [c.tokenizer.decode(w) for x in xs for w in x]
    assert len(windows) > 600
    assert not [w for w in windows if w in test_text]
    # the check can fail: a window of the test split itself is found
    assert c.tokenizer.decode(eval_batches(c, recipe, split="test")[0][0, 0]) in test_text


def test_evaluation_windows_ignore_the_training_seed_and_differ_by_split():
    from npas.training.proxy import eval_batches
    from npas.training.recipe import Recipe

    c = load_corpus()
    a = eval_batches(c, Recipe(seed=0))
    b = eval_batches(c, Recipe(seed=7))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    t = eval_batches(c, Recipe(seed=0), split="test")
    assert t[0].shape == a[0].shape and not torch.equal(t[0], a[0])
    with pytest.raises(ValueError, match="held-out split"):
        eval_batches(c, Recipe(), split="train")


def test_split_recorded_and_deterministic_across_processes():
    c = load_corpus()
    d = c.describe()
    split = d["split"]
    assert split["chunk_chars"] == 8192 and d["test_fraction"] == 0.1 and d["test_tokens"] == len(c.test)
    fps = split["fingerprints"]
    assert set(fps) == {"train", "val", "test"} and len(set(fps.values())) == 3
    code = ("import json; from npas.training.data import load_corpus; "
            "print(json.dumps(load_corpus().describe()['split']['fingerprints']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == fps
    other = load_corpus(test_fraction=0.2).describe()["split"]["fingerprints"]
    assert other["test"] != fps["test"]


def test_bad_test_fraction_is_refused():
    with pytest.raises(DataError, match="test_fraction must lie strictly between 0 and 1 - val_fraction"):
        build_corpus(TEXT, "x", 0.5, 0.5)
