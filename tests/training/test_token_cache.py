"""The token cache: tokenizes once, maps the file read-only, keys on text and tokenizer, survives races."""

from __future__ import annotations

import json
import multiprocessing
import time
from dataclasses import dataclass

import numpy as np
import pytest

from npas.training.data import bundled_text, fingerprint_text
from npas.training.token_cache import cache_key, cached_tokens, default_cache_dir
from npas.training.tokenizers import CharLevel, encode_array, train_bpe

TEXT = bundled_text()[:200_000]


@pytest.fixture(scope="module")
def bpe():
    return train_bpe(TEXT, 400)


def test_miss_then_memory_mapped_hit(tmp_path, bpe):
    first = cached_tokens(TEXT, bpe, cache_dir=tmp_path, label="train")
    assert not first.hit and first.path.exists()
    want = encode_array(bpe, TEXT)
    assert np.array_equal(first.ids, want) and first.ids.dtype == np.uint16
    second = cached_tokens(TEXT, bpe, cache_dir=tmp_path)
    assert second.hit and isinstance(second.ids, np.memmap) and not second.ids.flags.writeable
    assert np.array_equal(second.ids, want)
    h = json.loads(first.path.with_suffix(".json").read_text())
    assert h["n_tokens"] == len(want) and h["n_chars"] == len(TEXT) and h["label"] == "train"
    assert h["tokenizer_fingerprint"] == bpe.fingerprint and h["text_fingerprint"] == fingerprint_text(TEXT)
    assert second.n_bytes == len(TEXT.encode("utf-8"))
    assert first.path.stat().st_size == len(want) * 2
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".bin", ".json", ".lock"]  # no temp files left


def test_key_follows_text_and_tokenizer(tmp_path, bpe):
    char = CharLevel.from_text(TEXT)
    a = cached_tokens(TEXT, bpe, cache_dir=tmp_path)
    b = cached_tokens(TEXT, char, cache_dir=tmp_path)
    c = cached_tokens(TEXT[:-1000], bpe, cache_dir=tmp_path)
    assert len({a.path, b.path, c.path}) == 3 and not (b.hit or c.hit)
    assert np.array_equal(b.ids, encode_array(char, TEXT)) and b.ids.dtype == np.uint8
    assert cache_key(fingerprint_text(TEXT), bpe.fingerprint) == a.path.stem


def test_env_var_moves_the_cache(tmp_path, monkeypatch, bpe):
    monkeypatch.setenv("NPAS_CACHE", str(tmp_path / "elsewhere"))
    assert default_cache_dir() == tmp_path / "elsewhere" / "tokens"
    got = cached_tokens(TEXT[:5000], bpe)
    assert got.path.parent == tmp_path / "elsewhere" / "tokens"


def test_damaged_files_are_rewritten(tmp_path, bpe):
    first = cached_tokens(TEXT, bpe, cache_dir=tmp_path)
    want = np.array(first.ids)
    with open(first.path, "r+b") as fh:  # a torn file: the header no longer vouches for it
        fh.truncate(100)
    again = cached_tokens(TEXT, bpe, cache_dir=tmp_path)
    assert not again.hit and np.array_equal(again.ids, want)
    first.path.with_suffix(".json").write_text("{broken")
    assert not cached_tokens(TEXT, bpe, cache_dir=tmp_path).hit
    assert cached_tokens(TEXT, bpe, cache_dir=tmp_path).hit


def test_empty_text_caches_an_empty_stream(tmp_path, bpe):
    got = cached_tokens("", bpe, cache_dir=tmp_path)
    assert len(got.ids) == 0 and cached_tokens("", bpe, cache_dir=tmp_path).hit


@dataclass(frozen=True)
class SlowChar(CharLevel):
    """A char tokenizer that takes a while, so concurrent workers really overlap."""

    def encode_stream(self, text):
        time.sleep(0.5)
        yield from super().encode_stream(text)


def _worker(cache_dir, queue) -> None:
    got = cached_tokens(TEXT, SlowChar.from_text(TEXT), cache_dir=cache_dir)
    queue.put((got.hit, int(got.ids.astype(np.int64).sum()), len(got.ids)))


def test_concurrent_workers_tokenize_once(tmp_path):
    ctx = multiprocessing.get_context("spawn")  # fork would inherit torch's and tokenizers' thread pools
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(tmp_path, queue)) for _ in range(4)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    want = encode_array(CharLevel.from_text(TEXT), TEXT)
    assert sorted(hit for hit, _, _ in results) == [False, True, True, True]  # one wrote, three waited
    assert {(s, n) for _, s, n in results} == {(int(want.astype(np.int64).sum()), len(want))}
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
