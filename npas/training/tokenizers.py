"""Tokenizers behind one small protocol: character level, byte-level BPE, or a user's ``tokenizer.json``.

The tokenizer is part of the data a model was trained on, so each one serializes to a single JSON
text and is fingerprinted by the sha256 of that text. Hashing the serialized tokenizer, not the
settings that produced it, matters because BPE training is only as reproducible as its input order:
two ``bpe:4096`` tokenizers are the same tokenizer exactly when their ``tokenizer.json`` match.

Specs, as users type them (``parse_tokenizer_spec``):

- ``char``: one token per distinct character (``npas.training.char_vocab.CharTokenizer``, whose
  ``vocab.json`` format stays loadable);
- ``bpe:N``: Hugging Face ``tokenizers`` byte-level BPE with N tokens (N >= 256, the byte alphabet),
  trained on the text it is given, which callers keep to the training split;
- a path to a ``tokenizer.json`` written by Hugging Face ``tokenizers`` (or an npas ``vocab.json``).

Long texts are encoded as *pieces* cut at line or word boundaries and batch-encoded in parallel.
The cuts fall where GPT-2's pre-tokenizer splits anyway (after a lone newline between two
non-spaces, or before a lone space between two non-spaces), so for byte-level BPE the ids equal
those of encoding the whole text in one call; for a user's tokenizer every npas path (``encode``,
the token cache) uses the same pieces, so they agree with each other.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

import numpy as np
import tokenizers as hf_tokenizers
import torch
from tokenizers import decoders, models, pre_tokenizers, trainers

from npas.errors import DataError
from npas.training.char_vocab import CharTokenizer

log = logging.getLogger(__name__)

PIECE_CHARS = 16_384  # target piece length: long enough to amortize the call, short enough to balance threads
BATCH_PIECES = 64  # pieces per encode_batch call: ~1 MB of text, so Encoding objects stay small in memory
MIN_BPE_VOCAB = 256  # the byte alphabet; below it byte-level BPE cannot represent every text
MAX_VOCAB = 1 << 20  # ids are stored as uint32 at most; a million tokens is far past any proxy model

# Cut points that no GPT-2-style pre-token crosses: after "\n" between non-spaces, before " " between them.
_LINE_CUT = re.compile(r"(?<=\S\n)(?=\S)")
_WORD_CUT = re.compile(r"(?<=\S)(?= \S)")


def id_dtype(vocab_size: int) -> np.dtype:
    """Smallest unsigned dtype for the ids: uint16 holds a 4,096-token BPE stream at half of int32."""
    if vocab_size <= 1 << 8:
        return np.dtype(np.uint8)
    if vocab_size <= 1 << 16:
        return np.dtype(np.uint16)
    return np.dtype(np.uint32)


def fingerprint_json(text: str) -> str:
    """16 hex chars of sha256 over the serialized tokenizer, the same width as corpus fingerprints."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def split_pieces(text: str, size: int = PIECE_CHARS) -> list[str]:
    """Cut ``text`` into pieces of about ``size`` chars at boundaries no pre-token crosses.

    Each cut is the first line boundary at or after ``start + size``; a text with no newline there
    falls back to the first word boundary; a text with neither stays whole from that point.
    """
    pieces: list[str] = []
    start, n = 0, len(text)
    while n - start > size:
        m = _LINE_CUT.search(text, start + size) or _WORD_CUT.search(text, start + size)
        if m is None:
            break
        pieces.append(text[start:m.start()])
        start = m.start()
    pieces.append(text[start:])
    return pieces


@runtime_checkable
class Tokenizer(Protocol):
    """What npas needs of a tokenizer: ids for text and back, a size for the embedding table, a JSON
    form saved beside studies and models, and a fingerprint that says two tokenizers are the same."""

    name: str  # the spec it came from ("char", "bpe:4096", a path) or "tokenizer.json" once reloaded

    @property
    def vocab_size(self) -> int: ...

    @property
    def fingerprint(self) -> str: ...

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def encode_stream(self, text: str) -> Iterator[np.ndarray]: ...

    def decode(self, ids: Sequence[int] | np.ndarray) -> str: ...

    def to_json(self) -> str: ...

    def token_byte_lengths(self) -> np.ndarray: ...


def encode_array(tokenizer: Tokenizer, text: str) -> np.ndarray:
    """The whole token stream of ``text`` as one array of ``id_dtype(vocab_size)``."""
    parts = list(tokenizer.encode_stream(text))
    if not parts:
        return np.empty(0, dtype=id_dtype(tokenizer.vocab_size))
    return np.concatenate(parts)


# -------------------------------------------------------------------------------------- char level
@dataclass(frozen=True)
class CharLevel:
    """``CharTokenizer`` behind the protocol; its ``vocab.json`` is its ``tokenizer.json``."""

    char: CharTokenizer
    name: str = field(default="char", compare=False)  # where it came from; two equal alphabets are equal

    @property
    def chars(self) -> tuple[str, ...]:
        return self.char.chars

    def encode_tensor(self, text: str) -> torch.Tensor:
        return self.char.encode_tensor(text)

    @classmethod
    def from_text(cls, text: str) -> CharLevel:
        if not text:
            raise DataError("cannot build a character vocabulary from empty text; give it the training text")
        return cls(CharTokenizer.from_text(text))

    @property
    def vocab_size(self) -> int:
        return self.char.vocab_size

    @property
    def fingerprint(self) -> str:
        return fingerprint_json(self.to_json())

    def encode(self, text: str) -> list[int]:
        return self.char.encode(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.char.encode(t) for t in texts]

    def encode_stream(self, text: str) -> Iterator[np.ndarray]:
        # one bulk call: CharTokenizer's searchsorted path is already ~50x faster than per-char encode
        yield self.char.encode_tensor(text).numpy().astype(id_dtype(self.vocab_size), copy=False)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return self.char.decode([int(i) for i in np.asarray(ids).reshape(-1)])

    def to_json(self) -> str:
        return self.char.to_json()

    @classmethod
    def from_json(cls, text: str, name: str = "char") -> CharLevel:
        return cls(CharTokenizer.from_json(text), name=name)

    def token_byte_lengths(self) -> np.ndarray:
        return np.array([len(c.encode("utf-8")) for c in self.char.chars], dtype=np.int64)


# ------------------------------------------------------------------------------ Hugging Face models
@dataclass(frozen=True, eq=False)
class HFTokenizer:
    """A Hugging Face ``tokenizers.Tokenizer`` (trained here or loaded from a user's file).

    Special tokens are never added on encode: the stream is the text's own tokens, so its bytes are
    the text's bytes and bits per byte stays honest.
    """

    hf: hf_tokenizers.Tokenizer
    name: str = "tokenizer.json"

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    @property
    def fingerprint(self) -> str:
        return fingerprint_json(self.to_json())

    def _encode_batch(self, pieces: list[str]) -> list:
        """Hugging Face's encodings of `pieces`. A tokenizer.json can load and still fail to encode (a
        WordLevel or WordPiece model without an unknown token meets a word it lacks): one line, not the
        Rust side's bare Exception."""
        try:
            return self.hf.encode_batch_fast(pieces, add_special_tokens=False)
        except Exception as err:
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise DataError(f"tokenizer {self.name} cannot encode this text ({first}); give it an unknown "
                            "token, or use bpe:N or char") from None

    def _encode_pieces(self, pieces: list[str]) -> list[list[int]]:
        return [e.ids for e in self._encode_batch(pieces)]

    def encode(self, text: str) -> list[int]:
        return [i for ids in self._encode_pieces(split_pieces(text)) for i in ids]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def encode_stream(self, text: str) -> Iterator[np.ndarray]:
        dtype = id_dtype(self.vocab_size)
        pieces = split_pieces(text)
        for b in range(0, len(pieces), BATCH_PIECES):
            encs = self._encode_batch(pieces[b:b + BATCH_PIECES])
            yield np.concatenate([np.asarray(e.ids, dtype=dtype) for e in encs])

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        ids = [int(i) for i in np.asarray(ids).reshape(-1)]
        bad = sorted({i for i in ids if not 0 <= i < self.vocab_size})[:10]
        if bad:
            raise DataError(f"token ids {bad} are outside the vocabulary of {self.vocab_size}; "
                            "decode with the tokenizer the model was trained with")
        return self.hf.decode(ids, skip_special_tokens=False)

    def to_json(self) -> str:
        return self.hf.to_str()

    @classmethod
    def from_json(cls, text: str, name: str = "tokenizer.json") -> HFTokenizer:
        tok = tokenizer_from_json(text, name)
        if not isinstance(tok, HFTokenizer):
            raise DataError(f"tokenizer {name} is an npas character vocabulary, not a Hugging Face "
                            "tokenizer.json; load it with tokenizer_from_json")
        return tok

    def token_byte_lengths(self) -> np.ndarray:
        """UTF-8 bytes of text each id stands for, so a scored window's bytes are a lookup.

        Byte-level tokens spell one byte per character of their token string; an added token stands
        for its literal content; anything else is measured by decoding it alone.
        """
        added = {i: t.content for i, t in self.hf.get_added_tokens_decoder().items()}
        byte_level = isinstance(self.hf.decoder, decoders.ByteLevel)
        out = np.empty(self.vocab_size, dtype=np.int64)
        for i in range(self.vocab_size):
            if i in added:
                out[i] = len(added[i].encode("utf-8"))
            elif byte_level:
                out[i] = len(self.hf.id_to_token(i) or "")
            else:
                out[i] = len(self.hf.decode([i], skip_special_tokens=False).encode("utf-8"))
        return out


def train_bpe(text: str, vocab_size: int) -> HFTokenizer:
    """Byte-level BPE with ``vocab_size`` tokens, trained on ``text`` alone (pass the training split).

    The whole byte alphabet is seeded, so any later text encodes without unknown tokens; no prefix
    space is added, so pieces cut by ``split_pieces`` encode exactly as the whole text would.
    """
    if not MIN_BPE_VOCAB <= vocab_size <= MAX_VOCAB:
        raise DataError(f"bpe vocabulary must be between {MIN_BPE_VOCAB} and {MAX_VOCAB}, got {vocab_size}; "
                        "use e.g. --tokenizer bpe:4096")
    if not text.strip():
        raise DataError("cannot train a BPE tokenizer on empty text; give it the training split of a corpus")
    tok = hf_tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    pieces = split_pieces(text)
    tok.train_from_iterator(pieces, trainer, length=len(pieces))
    got = tok.get_vocab_size()
    if got < vocab_size:
        log.warning("bpe:%d trained on %d chars stopped at %d tokens: the text has no more pairs to merge",
                    vocab_size, len(text), got)
    return HFTokenizer(tok, name=f"bpe:{vocab_size}")


# --------------------------------------------------------------------------------------- loading
def tokenizer_from_json(text: str, name: str = "tokenizer.json") -> Tokenizer:
    """Load either serialized form: an npas character ``vocab.json`` or a Hugging Face ``tokenizer.json``."""
    try:
        d = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(f"tokenizer {name} is not valid JSON ({err.msg} at line {err.lineno}); "
                        "pass a tokenizer.json saved by Hugging Face tokenizers") from None
    if isinstance(d, dict) and d.get("type") == "char":
        return CharLevel(CharTokenizer.from_dict(d), name=name)
    if not isinstance(d, dict) or not isinstance(d.get("model"), dict):
        keys = sorted(d)[:8] if isinstance(d, dict) else type(d).__name__
        raise DataError(f"tokenizer {name} is JSON but not a tokenizer (no 'model' object; got {keys}); "
                        "pass a tokenizer.json saved by Hugging Face tokenizers")
    try:
        tok = hf_tokenizers.Tokenizer.from_str(text)
    except Exception as err:  # the Rust side raises plain Exception with its parse message
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise DataError(f"tokenizer {name} could not be loaded by Hugging Face tokenizers ({first}); "
                        "re-save it with tokenizers' Tokenizer.save") from None
    if tok.truncation is not None or tok.padding is not None:
        # a saved tokenizer.json may carry a model's max length or padding: either would silently cut
        # or pad every piece of a corpus, so npas turns both off (and the fingerprint is of that form)
        log.info("tokenizer %s: truncation/padding settings ignored; npas encodes whole texts", name)
        tok.no_truncation()
        tok.no_padding()
    return HFTokenizer(tok, name=name)


def load_tokenizer(path: str | Path) -> Tokenizer:
    p = Path(path).expanduser()
    if not p.is_file():
        what = "is a directory" if p.is_dir() else "does not exist"
        raise DataError(f"tokenizer file {p} {what}; pass char, bpe:N or the path of a tokenizer.json")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"cannot read tokenizer file {p} ({err}); pass a UTF-8 tokenizer.json") from None
    return tokenizer_from_json(text, name=str(p))


# ----------------------------------------------------------------------------------------- specs
@dataclass(frozen=True)
class TokenizerSpec:
    """What ``--tokenizer`` asked for, checked before any text is read; ``build`` makes the tokenizer."""

    kind: Literal["char", "bpe", "file"]
    vocab_size: int | None = None  # bpe only
    path: Path | None = None  # file only

    def __str__(self) -> str:
        if self.kind == "bpe":
            return f"bpe:{self.vocab_size}"
        return str(self.path) if self.kind == "file" else "char"

    def build(self, train_text: str) -> Tokenizer:
        """The tokenizer for a corpus whose training split is ``train_text`` (unused for a file)."""
        if self.kind == "char":
            return CharLevel.from_text(train_text)
        if self.kind == "bpe":
            assert self.vocab_size is not None  # set by parse_tokenizer_spec
            return train_bpe(train_text, self.vocab_size)
        assert self.path is not None
        return load_tokenizer(self.path)


def parse_tokenizer_spec(spec: str) -> TokenizerSpec:
    """``char``, ``bpe:N`` or a path to a tokenizer.json; a file is loaded now so a bad one fails early."""
    s = str(spec).strip()
    if s == "char":
        return TokenizerSpec("char")
    if s.startswith("bpe:") or s == "bpe":
        raw = s[4:]
        if not raw.isdigit():
            raise DataError(f"tokenizer {s!r}: the BPE vocabulary size must be a whole number, got {raw!r}; "
                            "use e.g. --tokenizer bpe:4096")
        n = int(raw)
        if not MIN_BPE_VOCAB <= n <= MAX_VOCAB:
            raise DataError(f"tokenizer {s!r}: the BPE vocabulary must be between {MIN_BPE_VOCAB} (the byte "
                            f"alphabet) and {MAX_VOCAB}, got {n}; use e.g. --tokenizer bpe:4096")
        return TokenizerSpec("bpe", vocab_size=n)
    if not s:
        raise DataError("tokenizer spec is empty; pass char, bpe:N or the path of a tokenizer.json")
    p = Path(s).expanduser()
    if not p.exists() and p.suffix != ".json":
        raise DataError(f"tokenizer {s!r} is neither char, bpe:N nor an existing tokenizer.json file; "
                        "pass one of those")
    load_tokenizer(p)  # raises the file's own problem
    return TokenizerSpec("file", path=p)
