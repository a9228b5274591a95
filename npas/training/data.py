"""Corpora as token streams: read text, split it, tokenize each split, and sample batches.

The text is split into train / validation / test as whole contiguous chunks of *characters*, never
scattered tokens, before any tokenizer reads it: the parts are the same passages whatever tokenizer
is used, a model is scored on passages it has not seen rather than on holes inside passages it has,
and the test part is kept from the search entirely. A learned tokenizer (``bpe:N``) is trained on
the training part alone; a character vocabulary is taken from the whole text, since an alphabet is
not a learned statistic and a held-out character missing from it could not be scored at all.
Reading the formats lives in ``corpora``, tokenizers in ``tokenizers``, the token cache in
``token_cache``; this module joins them into the ``Corpus`` the proxy trains on.
"""

from __future__ import annotations

import functools
import logging
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from npas.errors import DataError
from npas.training.char_vocab import CharTokenizer, token_dtype
from npas.training.corpora import (
    BUNDLED_NAME,
    DEFAULT_GLOB,
    DEFAULT_TEXT_FIELD,
    bundled_text,
    fingerprint_text,
    read_corpus,
)
from npas.training.metrics import scored_bytes
from npas.training.tokenized import tokenize_splits
from npas.training.tokenizers import (
    CharLevel,
    Tokenizer,
    TokenizerSpec,
    parse_tokenizer_spec,
    tokenizer_from_json,
)

__all__ = ["BUNDLED_NAME", "SPLITS", "CharTokenizer", "Corpus", "Split", "bundled_text", "build_corpus",
           "fingerprint_text", "load_corpus", "load_known_corpus", "token_dtype"]

log = logging.getLogger(__name__)

Split = Literal["train", "val", "test"]
SPLITS: tuple[Split, ...] = ("train", "val", "test")

MAX_CHUNK_CHARS = 8192  # split chunk length on large corpora: several paragraphs of a scene
MIN_CHUNKS = 20  # small corpora are cut into this many chunks so held-out parts still get whole passages
DEFAULT_TEST_FRACTION = 0.1  # share of the text kept for the final test; a search never reads it


# ------------------------------------------------------------------------------------------ split
def chunk_length(n: int) -> int:
    """Split chunk length for an ``n``-character text: 8192 on large corpora, n/20 on small ones."""
    return max(1, min(MAX_CHUNK_CHARS, math.ceil(n / MIN_CHUNKS)))


def spread_mask(n_chunks: int, fraction: float) -> list[bool]:
    """Which of ``n_chunks`` chunks to pick: evenly spread, ``round(n_chunks * fraction)`` of them.

    A Bresenham-style rule (chunk i is picked when ``floor((i+1)f + 1/2)`` steps) gives every
    k-th chunk for f = 1/k and still an even spread for any other fraction, with no randomness.
    """
    return [math.floor((i + 1) * fraction + 0.5) > math.floor(i * fraction + 0.5)
            for i in range(n_chunks)]


def chunk_splits(n_chunks: int, val_fraction: float, test_fraction: float) -> list[Split]:
    """The split of every chunk: held-out chunks (``val + test`` of them) are spread evenly over the
    text, and among them the test chunks are spread evenly again, so both held-out parts sample
    the whole corpus (every play of Shakespeare, not only the last ones)."""
    held = spread_mask(n_chunks, val_fraction + test_fraction)
    test = iter(spread_mask(sum(held), test_fraction / (val_fraction + test_fraction)))
    return [("test" if next(test) else "val") if h else "train" for h in held]


def split_bounds(n: int, val_fraction: float,
                 test_fraction: float = DEFAULT_TEST_FRACTION) -> dict[Split, list[tuple[int, int]]]:
    """``{"train", "val", "test"}`` -> [start, end) character ranges covering ``range(n)`` exactly once.

    The text is cut into ``chunk_length(n)`` characters per chunk (the last one shorter); each whole
    chunk goes to one split by ``chunk_splits``. Ranges are in text order within each split.
    """
    size = chunk_length(n)
    n_chunks = math.ceil(n / size) if n else 0
    out: dict[Split, list[tuple[int, int]]] = {s: [] for s in SPLITS}
    for i, split in enumerate(chunk_splits(n_chunks, val_fraction, test_fraction)):
        out[split].append((i * size, min(n, (i + 1) * size)))
    return out


def split_sizes(n: int, val_fraction: float, test_fraction: float = DEFAULT_TEST_FRACTION) -> dict[Split, int]:
    return {s: sum(b - a for a, b in r) for s, r in split_bounds(n, val_fraction, test_fraction).items()}


def chars_needed(seq_len: int, val_fraction: float, test_fraction: float = DEFAULT_TEST_FRACTION) -> int:
    """Smallest corpus length whose three splits each hold ``seq_len + 1`` tokens (binary search)."""

    def fits(n: int) -> bool:
        return min(split_sizes(n, val_fraction, test_fraction).values()) >= seq_len + 1

    lo, hi = 1, max(2, seq_len + 1)
    while not fits(hi):
        hi *= 2
        if hi > 1 << 40:  # unreachable for valid fractions; guards a degenerate one
            return hi
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid + 1, hi)
    return lo


# ------------------------------------------------------------------------------------------ corpus
@dataclass(frozen=True, eq=False)  # eq=False: identity, as the cached bundled corpus is shared
class Corpus:
    """A tokenized corpus split into train, validation and test streams (treat the tensors as
    read-only: the bundled corpus is cached and shared within a process).

    A search trains on ``train`` and ranks on ``val``; only a final validation of its picks reads
    ``test``, so the numbers a user is shown at the end were never used to choose.
    """

    train: torch.Tensor  # (N_train,) uint8 or int32 token ids
    val: torch.Tensor  # (N_val,) held-out contiguous chunks, concatenated in text order
    test: torch.Tensor  # (N_test,) other held-out chunks; never read by a search
    tokenizer: Tokenizer  # CharLevel, or a Hugging Face tokenizer trained on the train split / loaded
    fingerprint: str  # sha256 of the UTF-8 text, 16 hex chars: keys studies to the data they ran on
    source: str  # "bundled:shakespeare" or the path that was loaded; load_corpus(source, ...) reloads it
    val_fraction: float
    n_chars: int
    test_fraction: float = DEFAULT_TEST_FRACTION
    chunk_chars: int = 0  # split chunk length in characters (chunk_length(n_chars))
    part_fingerprints: dict[str, str] = field(default_factory=dict)  # split -> sha256 of its text
    glob: str = DEFAULT_GLOB  # which files of a directory corpus were read
    text_field: str = DEFAULT_TEXT_FIELD  # the JSONL field / Parquet column holding each document
    split_bytes: dict[str, int] = field(default_factory=dict)  # split -> UTF-8 bytes of its text

    @property
    def tokenizer_fingerprint(self) -> str:
        return self.tokenizer.fingerprint

    @functools.cached_property
    def byte_lengths(self) -> np.ndarray:
        """(vocab_size,) UTF-8 bytes each id spells: bits per byte of any scored window is a lookup."""
        return self.tokenizer.token_byte_lengths()

    def scored_bytes(self, targets: torch.Tensor) -> int:
        """UTF-8 bytes of the text the target ids spell: the denominator of bits per byte."""
        return scored_bytes(targets.reshape(-1).cpu().numpy(), self.byte_lengths)

    def bytes_per_token(self, split: Split) -> float:
        """Mean UTF-8 bytes per token over a whole split (converts a training loss to bits per byte)."""
        n = len(self.split(split))
        return self.split_bytes.get(split, n) / max(1, n)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def split(self, split: Split) -> torch.Tensor:
        if split in SPLITS:
            return getattr(self, split)
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")

    def check_fits(self, seq_len: int, batch_size: int = 1) -> None:
        """Raise DataError unless each split holds at least ``seq_len + 1`` tokens.

        Batches are drawn with replacement, so ``batch_size`` does not raise the bar; it is taken so
        callers can pass the recipe's shape whole and the message can echo it.
        """
        short = [(name, len(self.split(s))) for s, name in (("train", "train"), ("val", "validation"),
                                                             ("test", "test"))
                 if len(self.split(s)) < seq_len + 1]
        if short:
            name, have = short[0]
            need = chars_needed(seq_len, self.val_fraction, self.test_fraction)
            raise DataError(
                f"corpus {self.source} ({self.n_chars} chars) is too small for seq_len={seq_len}, "
                f"batch_size={batch_size}: its {name} split has {have} tokens but needs {seq_len + 1}; "
                f"provide at least {need} characters (val_fraction {self.val_fraction}, "
                f"test_fraction {self.test_fraction}) or lower seq_len")

    def get_batch(self, split: Split, batch_size: int, seq_len: int, generator: torch.Generator,
                  device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Random windows ``(x, y)``, each (batch_size, seq_len) int64, y shifted by one token.

        Offsets come from ``generator`` alone, so a seeded generator replays the same batches.
        """
        data = self.split(split)
        ix = torch.randint(len(data) - seq_len, (batch_size,), generator=generator)
        windows = data[ix.unsqueeze(1) + torch.arange(seq_len + 1)].long()  # (B, T+1)
        x, y = windows[:, :-1], windows[:, 1:]
        if device is not None and torch.device(device).type != "cpu":
            x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x, y

    def fixed_windows(self, split: Split, n: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``n`` windows ``(x, y)`` at evenly spaced offsets over ``split``, (n, seq_len) int64 each.

        No generator: evaluation windows are a property of the corpus and the window shape alone,
        so every seed, trial and process scores on the same text and spreads it over the whole split.
        """
        data = self.split(split)
        room = len(data) - seq_len  # window starts in [0, room)
        if room < 1 or n < 1:
            raise DataError(f"{split} split of {self.source} has {len(data)} tokens, too few for {n} windows "
                            f"of {seq_len + 1}; lower seq_len or provide more text")
        ix = torch.tensor([(2 * i + 1) * room // (2 * n) for i in range(n)])  # centred in n equal strides
        windows = data[ix.unsqueeze(1) + torch.arange(seq_len + 1)].long()  # (n, T+1)
        return windows[:, :-1], windows[:, 1:]

    def describe(self) -> dict:
        """JSON-safe summary recorded beside metrics and studies, including how the text was split
        (so a study can prove later which text its search never saw)."""
        return {"source": self.source, "fingerprint": self.fingerprint, "vocab_size": self.vocab_size,
                "tokenizer": self.tokenizer.name, "tokenizer_fingerprint": self.tokenizer.fingerprint,
                "glob": self.glob, "text_field": self.text_field,
                "n_chars": self.n_chars, "train_tokens": len(self.train), "val_tokens": len(self.val),
                "test_tokens": len(self.test), "val_fraction": self.val_fraction,
                "test_fraction": self.test_fraction,
                "split": {"unit": "characters", "chunk_chars": self.chunk_chars,
                          "rule": "whole chunks, held-out chunks evenly spread, test chunks evenly among them",
                          "fingerprints": dict(self.part_fingerprints)}}


def check_fractions(val_fraction: float, test_fraction: float) -> None:
    if not 0.0 < val_fraction < 1.0:
        raise DataError(f"val_fraction must lie strictly between 0 and 1, got {val_fraction}; "
                        "use e.g. 0.1 to hold out a tenth of the text")
    if not 0.0 < test_fraction < 1.0 or val_fraction + test_fraction >= 1.0:
        raise DataError(f"test_fraction must lie strictly between 0 and 1 - val_fraction, got {test_fraction} "
                        f"(val_fraction {val_fraction}); use e.g. 0.1")


def _as_tensor(ids: np.ndarray) -> torch.Tensor:
    """Token ids as a tensor the proxy can index: a uint8 stream is shared with its (read-only)
    memory map, wider ones become int32 (torch cannot gather from uint16/uint32)."""
    if ids.dtype == np.uint8:
        with warnings.catch_warnings():  # the map is read-only and so is every Corpus tensor
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(ids) if len(ids) else torch.empty(0, dtype=torch.uint8)
    return torch.from_numpy(np.asarray(ids, dtype=np.int32))


TokenizerArg = str | TokenizerSpec | Tokenizer | None


def build_corpus(text: str, source: str, val_fraction: float = 0.1,
                 test_fraction: float = DEFAULT_TEST_FRACTION, tokenizer: TokenizerArg = None,
                 cache_dir: str | Path | None = None, glob: str = DEFAULT_GLOB,
                 text_field: str = DEFAULT_TEXT_FIELD) -> Corpus:
    """Split ``text`` into train / validation / test chunks, then tokenize each part.

    ``tokenizer`` is a spec (``"char"``, default; ``"bpe:N"``, trained on the train part only; a
    tokenizer.json path) or a built tokenizer, e.g. one reloaded from a study's stored JSON, which is
    used as is and never retrained. Learned tokenizers go through the memory-mapped token cache;
    a character vocabulary encodes in memory (a vectorized lookup, faster than reading a file).
    """
    check_fractions(val_fraction, test_fraction)
    if not text:
        raise DataError(f"corpus {source} is empty; point --data at a file with text in it")
    spec = parse_tokenizer_spec(tokenizer or "char") if tokenizer is None or isinstance(tokenizer, str) else tokenizer
    bounds = split_bounds(len(text), val_fraction, test_fraction)
    parts = {s: "".join(text[a:b] for a, b in bounds[s]) for s in SPLITS}
    if isinstance(spec, TokenizerSpec) and spec.kind == "char":
        spec = CharLevel.from_text(text)  # the alphabet of every split, so held-out text can be scored
    if isinstance(spec, CharLevel):
        tok: Tokenizer = spec
        ids = {s: spec.char.encode_tensor(parts[s]) for s in SPLITS}
    else:
        splits = tokenize_splits(parts, spec, cache_dir=cache_dir)
        tok = splits.tokenizer
        ids = {s: _as_tensor(splits.ids(s)) for s in SPLITS}
    corpus = Corpus(train=ids["train"], val=ids["val"], test=ids["test"], tokenizer=tok,
                    fingerprint=fingerprint_text(text), source=source, val_fraction=val_fraction,
                    n_chars=len(text), test_fraction=test_fraction, chunk_chars=chunk_length(len(text)),
                    part_fingerprints={s: fingerprint_text(parts[s]) for s in SPLITS}, glob=glob,
                    text_field=text_field, split_bytes={s: len(parts[s].encode("utf-8")) for s in SPLITS})
    log.debug("corpus %s: %d chars, %s vocab %d, %d train / %d val / %d test tokens (chunks of %d)", source,
              len(text), tok.name, tok.vocab_size, len(corpus.train), len(corpus.val), len(corpus.test),
              corpus.chunk_chars)
    return corpus


@functools.lru_cache(maxsize=4)
def _bundled_corpus(val_fraction: float, test_fraction: float) -> Corpus:
    return build_corpus(bundled_text(), f"bundled:{BUNDLED_NAME}", val_fraction, test_fraction)


def is_bundled(path: str | Path | None) -> bool:
    return path is None or str(path) in (BUNDLED_NAME, f"bundled:{BUNDLED_NAME}")


def load_corpus(path: str | Path | None = None, val_fraction: float = 0.1,
                test_fraction: float = DEFAULT_TEST_FRACTION, tokenizer: TokenizerArg = None, *,
                glob: str = DEFAULT_GLOB, text_field: str = DEFAULT_TEXT_FIELD,
                cache_dir: str | Path | None = None) -> Corpus:
    """Load the bundled corpus (``None`` or ``"bundled:shakespeare"``) or a user's: a text file
    (``.txt``, gzipped ``.gz``), JSON Lines (``.jsonl``, ``.jsonl.gz``) or Parquet with documents in
    ``text_field``, or a directory of files matching ``glob`` (see ``npas.training.corpora``), and
    tokenize it with ``tokenizer`` (default: characters). ``load_corpus(corpus.source, ...)`` with
    the same options reloads the same corpus, which is how Ray workers get theirs."""
    char = tokenizer is None or (isinstance(tokenizer, str) and tokenizer.strip() == "char")
    if is_bundled(path) and char:
        return _bundled_corpus(float(val_fraction), float(test_fraction))
    read = read_corpus(f"bundled:{BUNDLED_NAME}" if path is None else path, glob, text_field)
    return build_corpus(read.text, read.source, val_fraction, test_fraction, tokenizer=tokenizer,
                        cache_dir=cache_dir, glob=glob, text_field=text_field)


@functools.lru_cache(maxsize=4)
def load_known_corpus(source: str | None, val_fraction: float, test_fraction: float, fingerprint: str,
                      tokenizer_json: str | None = None, glob: str = DEFAULT_GLOB,
                      text_field: str = DEFAULT_TEXT_FIELD, tokenizer_fingerprint: str | None = None) -> Corpus:
    """Load the corpus a study ran on, once per process (Ray workers and validate reuse it), and refuse
    one whose text differs from what the study recorded: every node must score the same text.

    ``tokenizer_json`` is the study's stored tokenizer: it is loaded, not retrained, so every node
    encodes with the very tokenizer the study started with (None: a character vocabulary, as studies
    made before tokenizers were stored ran on). ``tokenizer_fingerprint`` is the study's: a node whose
    ``tokenizers`` library reads the JSON back as a different tokenizer is refused, not trusted.
    """
    tok = None if tokenizer_json is None else tokenizer_from_json(tokenizer_json, name="study tokenizer.json")
    corpus = load_corpus(source, val_fraction=val_fraction, test_fraction=test_fraction, tokenizer=tok,
                         glob=glob, text_field=text_field)
    if corpus.fingerprint != fingerprint:
        raise DataError(f"the corpus at {source or 'bundled'} here differs from the one the study ran on "
                        f"(fingerprint {corpus.fingerprint} != {fingerprint}); give every node the same file")
    if tokenizer_fingerprint is not None and corpus.tokenizer.fingerprint != tokenizer_fingerprint:
        raise DataError(f"the tokenizer here ({corpus.tokenizer.fingerprint}) differs from the study's "
                        f"({tokenizer_fingerprint}); give every node the same npas and tokenizers versions")
    return corpus
