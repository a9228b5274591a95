"""Tokenize a corpus once per machine: a memory-mapped token file keyed by text and tokenizer.

A BPE pass over a large corpus costs minutes; every Ray worker on a machine needs the same ids. The
first caller tokenizes and writes ``<key>.bin`` (the raw ids, native byte order, the smallest
unsigned dtype for the vocabulary) and ``<key>.json`` (a small header: fingerprints, dtype, counts);
everyone else maps the file read-only, which costs milliseconds and shares one page cache.

The key hashes the text's fingerprint with the tokenizer's (the sha256 of its ``tokenizer.json``),
so a changed corpus or a retrained tokenizer can never be served stale ids. Writers hold an
exclusive ``flock`` on ``<key>.lock`` so concurrent workers wait for one tokenization instead of
each doing it, and files are written under temporary names and renamed into place, so a reader
sees a whole file or none (the header is renamed last and names the size it vouches for).

Location: ``$NPAS_CACHE/tokens`` when ``NPAS_CACHE`` is set, else ``~/.cache/npas/tokens``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from npas.errors import DataError
from npas.training.corpora import fingerprint_text
from npas.training.tokenizers import Tokenizer, id_dtype

log = logging.getLogger(__name__)

CACHE_VERSION = 1  # bump when the file layout changes; older files are then ignored and rewritten
ENV_VAR = "NPAS_CACHE"


def default_cache_dir() -> Path:
    root = os.environ.get(ENV_VAR)
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "npas"
    return base / "tokens"


def check_cache_dir(cache: Path | None = None) -> None:
    """Refuse a token cache that cannot be a directory (``NPAS_CACHE`` naming a file, or a file on the
    way), before a corpus is tokenized: one line naming the variable, not mkdir's traceback."""
    cache = default_cache_dir() if cache is None else cache
    for p in (cache, *cache.parents):
        if p.exists() and not p.is_dir():
            source = f"{ENV_VAR}={os.environ[ENV_VAR]!r}" if os.environ.get(ENV_VAR) else "the token cache"
            raise DataError(f"{source}: {p} is a file, so the token cache {cache} cannot be created there; point "
                            f"{ENV_VAR} at a directory (or unset it for ~/.cache/npas)")


def cache_key(text_fingerprint: str, tokenizer_fingerprint: str) -> str:
    raw = f"v{CACHE_VERSION}:{text_fingerprint}:{tokenizer_fingerprint}"
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()[:24]


@dataclass(frozen=True)
class TokenFile:
    """A cached token stream: ``ids`` is a read-only ``numpy.memmap`` (an empty array for no tokens)."""

    ids: np.ndarray
    header: dict
    path: Path  # the .bin file
    hit: bool  # True when this call found the file instead of writing it

    @property
    def n_bytes(self) -> int:
        """UTF-8 bytes of the text the ids spell: the denominator of bits per byte over the whole file."""
        return int(self.header["n_bytes"])


def _paths(cache_dir: Path, key: str) -> tuple[Path, Path, Path]:
    return cache_dir / f"{key}.bin", cache_dir / f"{key}.json", cache_dir / f"{key}.lock"


def _load(cache_dir: Path, key: str, expect: dict) -> TokenFile | None:
    """The cached file if its header is whole and matches ``expect``; None means tokenize."""
    bin_path, head_path, _ = _paths(cache_dir, key)
    try:
        header = json.loads(head_path.read_text(encoding="utf-8"))
        size = bin_path.stat().st_size
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as err:
        log.warning("token cache %s unreadable (%s); tokenizing again", head_path, err)
        return None
    if not isinstance(header, dict) or any(header.get(k) != v for k, v in expect.items()):
        log.warning("token cache %s does not match this corpus/tokenizer; tokenizing again", head_path)
        return None
    dtype = np.dtype(header["dtype"])
    n = int(header["n_tokens"])
    if size != n * dtype.itemsize:
        log.warning("token cache %s holds %d bytes, header says %d; tokenizing again",
                    bin_path, size, n * dtype.itemsize)
        return None
    ids = np.memmap(bin_path, dtype=dtype, mode="r", shape=(n,)) if n else np.empty(0, dtype=dtype)
    return TokenFile(ids=ids, header=header, path=bin_path, hit=True)


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _replace_atomically(final: Path, write) -> None:
    tmp = final.with_name(f".{final.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "wb") as fh:
            write(fh)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)


def cached_tokens(text: str, tokenizer: Tokenizer, cache_dir: str | Path | None = None,
                  text_fingerprint: str | None = None, label: str = "") -> TokenFile:
    """The token stream of ``text`` under ``tokenizer``, from the cache or tokenized into it.

    ``text_fingerprint`` saves hashing the text again when the caller has it (it must be
    ``fingerprint_text(text)``); ``label`` (e.g. ``"train"``) is recorded in the header for people.
    """
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    check_cache_dir(cache)
    cache.mkdir(parents=True, exist_ok=True)
    text_fp = text_fingerprint or fingerprint_text(text)
    tok_fp = tokenizer.fingerprint
    key = cache_key(text_fp, tok_fp)
    expect = {"version": CACHE_VERSION, "text_fingerprint": text_fp, "tokenizer_fingerprint": tok_fp}
    found = _load(cache, key, expect)
    if found is not None:
        return found
    bin_path, head_path, lock_path = _paths(cache, key)
    with _locked(lock_path):
        found = _load(cache, key, expect)  # another worker may have written it while we waited
        if found is not None:
            return found
        t0 = time.perf_counter()
        dtype = id_dtype(tokenizer.vocab_size)
        n_tokens = 0

        def write_ids(fh) -> None:
            nonlocal n_tokens
            for part in tokenizer.encode_stream(text):
                arr = np.ascontiguousarray(part, dtype=dtype)
                fh.write(memoryview(arr).cast("B"))
                n_tokens += len(arr)

        _replace_atomically(bin_path, write_ids)
        header = {**expect, "label": label, "tokenizer": tokenizer.name, "vocab_size": tokenizer.vocab_size,
                  "dtype": dtype.name, "n_tokens": n_tokens, "n_chars": len(text),
                  "n_bytes": len(text.encode("utf-8")), "seconds": round(time.perf_counter() - t0, 3)}
        _replace_atomically(head_path, lambda fh: fh.write(json.dumps(header, indent=1).encode("utf-8")))
        log.info("token cache: %d chars -> %d tokens in %.1f s, %s", len(text), n_tokens,
                 header["seconds"], bin_path)
    written = _load(cache, key, expect)
    if written is None:  # only if the files vanished between the rename and here
        raise OSError(f"token cache {bin_path} disappeared right after it was written")
    return TokenFile(ids=written.ids, header=written.header, path=written.path, hit=False)
