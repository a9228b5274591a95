"""Character-level corpora: load text, build a vocabulary from it, split it, and sample batches.

A character tokenizer keeps the proxy honest and dependency-free: the vocabulary is a property of
the data (so it travels beside every exported model as ``vocab.json``), and the bundled corpus --
Shakespeare's plays -- needs no download. The text is split into train / validation / test as
whole contiguous chunks, never scattered characters, so a model is scored on passages it has not
seen rather than on holes inside passages it has; the test part is kept from the search entirely.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.resources
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from npas.errors import DataError

log = logging.getLogger(__name__)

Split = Literal["train", "val", "test"]
SPLITS: tuple[Split, ...] = ("train", "val", "test")

BUNDLED_NAME = "shakespeare"
_BUNDLED_RESOURCE = "builtin/shakespeare.txt.gz"
MAX_CHUNK_CHARS = 8192  # split chunk length on large corpora: several paragraphs of a scene
MIN_CHUNKS = 20  # small corpora are cut into this many chunks so held-out parts still get whole passages
DEFAULT_TEST_FRACTION = 0.1  # share of the text kept for the final test; a search never reads it
TOKENIZER_VERSION = 1


# --------------------------------------------------------------------------------------- tokenizer
@dataclass(frozen=True)
class CharTokenizer:
    """One token per distinct character, ids in sorted code-point order.

    Sorting makes the vocabulary a pure function of the character set, so two corpora with the
    same characters get identical ids and a model stays usable with its saved ``vocab.json``.
    """

    chars: tuple[str, ...]
    _stoi: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.chars:
            raise DataError("a tokenizer needs at least one character, got an empty vocabulary; "
                            "build it from non-empty text")
        if any(len(c) != 1 for c in self.chars):
            bad = [c for c in self.chars if len(c) != 1][:5]
            raise DataError(f"a character vocabulary holds single characters, got {bad!r}; "
                            "rebuild it with CharTokenizer.from_text")
        if list(self.chars) != sorted(set(self.chars)):
            raise DataError("a character vocabulary must be sorted and free of duplicates; "
                            "rebuild it with CharTokenizer.from_text")
        object.__setattr__(self, "_stoi", {c: i for i, c in enumerate(self.chars)})

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        return cls(tuple(sorted(set(text))))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def unknown(self, text: str) -> list[str]:
        """Characters of ``text`` outside the vocabulary, sorted, so errors can name them all."""
        return sorted(set(text) - self._stoi.keys())

    def encode(self, text: str) -> list[int]:
        missing = self.unknown(text)
        if missing:
            shown = ", ".join(repr(c) for c in missing[:10]) + (" ..." if len(missing) > 10 else "")
            raise DataError(f"text holds {len(missing)} character(s) not in the {self.vocab_size}-character "
                            f"vocabulary: {shown}; remove them or train on data that contains them")
        return [self._stoi[c] for c in text]

    def encode_tensor(self, text: str) -> torch.Tensor:
        """Encode a long text in bulk (code points -> ids by binary search); about 50x faster than
        ``encode`` on the 3.5M-character bundled corpus."""
        missing = self.unknown(text)
        if missing:
            self.encode("".join(missing))  # raises the same message as encode
        if not text:
            return torch.empty(0, dtype=token_dtype(self.vocab_size))
        points = torch.frombuffer(bytearray(text.encode("utf-32-le")), dtype=torch.int32)
        table = torch.tensor([ord(c) for c in self.chars], dtype=torch.int32)
        return torch.searchsorted(table, points).to(token_dtype(self.vocab_size))

    def decode(self, ids: list[int] | torch.Tensor) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.reshape(-1).tolist()
        try:
            return "".join(self.chars[i] for i in ids)
        except IndexError:
            bad = sorted({i for i in ids if not 0 <= i < self.vocab_size})[:10]
            raise DataError(f"token ids {bad} are outside the vocabulary of {self.vocab_size}; "
                            "decode with the tokenizer the model was trained with") from None

    def to_dict(self) -> dict:
        return {"type": "char", "version": TOKENIZER_VERSION, "chars": list(self.chars)}

    @classmethod
    def from_dict(cls, d: dict) -> CharTokenizer:
        if not isinstance(d, dict) or d.get("type") != "char" or not isinstance(d.get("chars"), list):
            raise DataError("a vocabulary file must be a JSON object with type 'char' and a 'chars' list, "
                            f"got keys {sorted(d) if isinstance(d, dict) else type(d).__name__}; "
                            "write it with CharTokenizer.to_json")
        if d.get("version", TOKENIZER_VERSION) > TOKENIZER_VERSION:
            raise DataError(f"vocabulary version {d['version']} is newer than this npas understands "
                            f"({TOKENIZER_VERSION}); upgrade npas")
        return cls(tuple(d["chars"]))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=True)

    @classmethod
    def from_json(cls, text: str) -> CharTokenizer:
        try:
            d = json.loads(text)
        except json.JSONDecodeError as err:
            raise DataError(f"vocabulary file is not valid JSON ({err}); re-export the model") from None
        return cls.from_dict(d)


def token_dtype(vocab_size: int) -> torch.dtype:
    """Smallest integer dtype for the ids: the bundled corpus fits uint8 (3.5 MB instead of 28 MB)."""
    return torch.uint8 if vocab_size <= 256 else torch.int32


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
@dataclass(frozen=True, eq=False)
class Corpus:
    """A tokenized corpus split into train, validation and test streams (treat the tensors as
    read-only: the bundled corpus is cached and shared within a process).

    A search trains on ``train`` and ranks on ``val``; only a final validation of its picks reads
    ``test``, so the numbers a user is shown at the end were never used to choose.
    """

    train: torch.Tensor  # (N_train,) uint8 or int32 token ids
    val: torch.Tensor  # (N_val,) held-out contiguous chunks, concatenated in text order
    test: torch.Tensor  # (N_test,) other held-out chunks; never read by a search
    tokenizer: CharTokenizer
    fingerprint: str  # sha256 of the UTF-8 text, 16 hex chars: keys studies to the data they ran on
    source: str  # "bundled:shakespeare" or the path that was loaded; load_corpus(source) reloads it
    val_fraction: float
    n_chars: int
    test_fraction: float = DEFAULT_TEST_FRACTION
    chunk_chars: int = 0  # split chunk length in characters (chunk_length(n_chars))
    part_fingerprints: dict[str, str] = field(default_factory=dict)  # split -> sha256 of its text

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
                "n_chars": self.n_chars, "train_tokens": len(self.train), "val_tokens": len(self.val),
                "test_tokens": len(self.test), "val_fraction": self.val_fraction,
                "test_fraction": self.test_fraction,
                "split": {"unit": "characters", "chunk_chars": self.chunk_chars,
                          "rule": "whole chunks, held-out chunks evenly spread, test chunks evenly among them",
                          "fingerprints": dict(self.part_fingerprints)}}


def fingerprint_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def check_fractions(val_fraction: float, test_fraction: float) -> None:
    if not 0.0 < val_fraction < 1.0:
        raise DataError(f"val_fraction must lie strictly between 0 and 1, got {val_fraction}; "
                        "use e.g. 0.1 to hold out a tenth of the text")
    if not 0.0 < test_fraction < 1.0 or val_fraction + test_fraction >= 1.0:
        raise DataError(f"test_fraction must lie strictly between 0 and 1 - val_fraction, got {test_fraction} "
                        f"(val_fraction {val_fraction}); use e.g. 0.1")


def build_corpus(text: str, source: str, val_fraction: float = 0.1,
                 test_fraction: float = DEFAULT_TEST_FRACTION) -> Corpus:
    """Split ``text`` into train / validation / test chunks, then tokenize each part.

    The split is made on the text itself, before tokenizing, so the parts are the same passages
    whatever tokenizer reads them. The character vocabulary is the one thing taken from the whole
    text: it must cover the held-out characters too, or the test split could not be scored.
    """
    check_fractions(val_fraction, test_fraction)
    if not text:
        raise DataError(f"corpus {source} is empty; point --data at a file with text in it")
    tokenizer = CharTokenizer.from_text(text)
    bounds = split_bounds(len(text), val_fraction, test_fraction)
    parts = {s: "".join(text[a:b] for a, b in bounds[s]) for s in SPLITS}
    ids = {s: tokenizer.encode_tensor(parts[s]) for s in SPLITS}
    corpus = Corpus(train=ids["train"], val=ids["val"], test=ids["test"], tokenizer=tokenizer,
                    fingerprint=fingerprint_text(text), source=source, val_fraction=val_fraction,
                    n_chars=len(text), test_fraction=test_fraction, chunk_chars=chunk_length(len(text)),
                    part_fingerprints={s: fingerprint_text(parts[s]) for s in SPLITS})
    log.debug("corpus %s: %d chars, vocab %d, %d train / %d val / %d test tokens (chunks of %d)", source,
              len(text), tokenizer.vocab_size, len(corpus.train), len(corpus.val), len(corpus.test),
              corpus.chunk_chars)
    return corpus


@functools.lru_cache(maxsize=1)
def bundled_text() -> str:
    """The bundled Shakespeare corpus, decoded once per process (many tests and trials load it)."""
    blob = (importlib.resources.files("npas") / _BUNDLED_RESOURCE).read_bytes()
    return gzip.decompress(blob).decode("utf-8")


@functools.lru_cache(maxsize=4)
def _bundled_corpus(val_fraction: float, test_fraction: float) -> Corpus:
    return build_corpus(bundled_text(), f"bundled:{BUNDLED_NAME}", val_fraction, test_fraction)


def _read_text(path: Path) -> str:
    """Read one file as UTF-8 text, naming the reason it cannot be used."""
    try:
        blob = path.read_bytes()
    except OSError as err:
        raise DataError(f"cannot read corpus file {path}: {err.strerror or err}; "
                        "check its permissions or point --data elsewhere") from None
    if path.suffix == ".gz":
        try:
            blob = gzip.decompress(blob)
        except (OSError, EOFError) as err:
            raise DataError(f"corpus file {path} is not a valid gzip archive ({err}); "
                            "decompress it yourself or fix the file") from None
    nul = blob.find(b"\x00")
    if nul >= 0:
        raise DataError(f"corpus file {path} looks binary (NUL byte at offset {nul}); "
                        "point --data at a UTF-8 text file")
    try:
        return blob.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"corpus file {path} is not UTF-8 text (undecodable byte at offset {err.start}); "
                        "convert it with e.g. `iconv -t utf-8` or point --data at a text file") from None


def load_corpus(path: str | Path | None = None, val_fraction: float = 0.1,
                test_fraction: float = DEFAULT_TEST_FRACTION) -> Corpus:
    """Load the bundled corpus (``None`` or ``"bundled:shakespeare"``), one text file (``.txt``, or
    gzipped ``.gz``), or every ``*.txt`` file of a directory, sorted by name and concatenated.
    ``load_corpus(corpus.source)`` reloads the same corpus, which is how Ray workers get theirs."""
    if path is None or str(path) in (BUNDLED_NAME, f"bundled:{BUNDLED_NAME}"):
        return _bundled_corpus(float(val_fraction), float(test_fraction))
    p = Path(path).expanduser()
    if not p.exists():
        raise DataError(f"corpus path {p} does not exist; pass a text file, a directory of .txt files, "
                        "or omit --data for the bundled Shakespeare corpus")
    if p.is_dir():
        files = sorted(f for f in p.glob("*.txt"))
        if not files:
            raise DataError(f"corpus directory {p} holds no .txt files; add some or pass a file")
        text = "".join(_read_text(f) for f in files)
        log.info("corpus %s: %d .txt files", p, len(files))
        source = str(p)
    else:
        text = _read_text(p)
        source = str(p)
    if not text.strip():
        raise DataError(f"corpus {source} is empty ({len(text)} chars, all whitespace or none); "
                        "point --data at a file with text in it")
    return build_corpus(text, source, val_fraction, test_fraction)


@functools.lru_cache(maxsize=4)
def load_known_corpus(source: str | None, val_fraction: float, test_fraction: float, fingerprint: str) -> Corpus:
    """Load the corpus a study ran on, once per process (Ray workers and validate reuse it), and refuse
    one whose text differs from what the study recorded: every node must score the same text."""
    corpus = load_corpus(source, val_fraction=val_fraction, test_fraction=test_fraction)
    if corpus.fingerprint != fingerprint:
        raise DataError(f"the corpus at {source or 'bundled'} here differs from the one the study ran on "
                        f"(fingerprint {corpus.fingerprint} != {fingerprint}); give every node the same file")
    return corpus
