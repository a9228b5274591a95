"""Read a corpus from the formats people keep text in, as one string of documents.

Formats, chosen by the path:

- a directory: every file matching ``glob`` (default ``**/*.txt``, recursive), in sorted relative-path
  order so the text does not depend on the file system's listing order; each file is read by its
  own suffix below;
- ``.jsonl`` / ``.jsonl.gz``: one JSON object per line, the document in ``text_field``;
- ``.parquet``: read through pandas (pyarrow engine), the document in column ``text_field``;
- ``.gz``: gzipped text; anything else: UTF-8 text. A text file is one document;
- ``bundled:shakespeare`` (or ``shakespeare``): the corpus shipped in the package.

Documents are joined with ``SEPARATOR`` (a blank line), so a JSONL or Parquet corpus gives exactly
the text of a ``.txt`` file holding the same documents joined by a blank line, and so the same token
stream. Whitespace-only documents are skipped (they would only double the separator). Every way a
corpus can be unusable has its own one-line ``DataError`` naming the file, the place and the fix.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.resources
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from npas.errors import DataError

log = logging.getLogger(__name__)

BUNDLED_NAME = "shakespeare"
_BUNDLED_RESOURCE = "builtin/shakespeare.txt.gz"
SEPARATOR = "\n\n"  # between documents: a paragraph break, which every tokenizer already knows
DEFAULT_GLOB = "**/*.txt"
DEFAULT_TEXT_FIELD = "text"
FORMATS = ("directory", ".txt", ".gz", ".jsonl", ".jsonl.gz", ".parquet")


@dataclass(frozen=True)
class CorpusText:
    """A corpus read into memory: the joined text and what it came from."""

    text: str
    source: str  # the path as given; read_corpus(source, glob, text_field) reads it again
    n_documents: int
    fingerprint: str  # sha256 of the UTF-8 text, 16 hex chars (as npas.training.data.fingerprint_text)

    @property
    def n_bytes(self) -> int:
        return len(self.text.encode("utf-8"))


def corpus_format(path: Path) -> str:
    """Which reader a path gets: one of ``FORMATS`` (anything unrecognised is read as text)."""
    if path.is_dir():
        return "directory"
    name = path.name.lower()
    if name.endswith(".jsonl.gz"):
        return ".jsonl.gz"
    for suffix in (".jsonl", ".parquet", ".gz"):
        if name.endswith(suffix):
            return suffix
    return ".txt"


def check_source(path: str | Path, glob: str = DEFAULT_GLOB, text_field: str = DEFAULT_TEXT_FIELD) -> Path:
    """Cheap checks a CLI runs before touching a database or starting Ray: the path exists, the glob
    is relative, the text field is named, and a ``.json`` file is not mistaken for JSON Lines."""
    p = Path(path).expanduser()
    if not p.exists():
        raise DataError(f"corpus path {p} does not exist; pass a .txt/.jsonl/.jsonl.gz/.parquet file "
                        "or a directory, or omit --data for the bundled Shakespeare corpus")
    if not glob or Path(glob).is_absolute() or ".." in Path(glob).parts:
        raise DataError(f"--data-glob must be a pattern relative to the corpus directory, got {glob!r}; "
                        f"use e.g. {DEFAULT_GLOB!r}")
    if not text_field or not isinstance(text_field, str):
        raise DataError(f"--text-field must name the field holding each document, got {text_field!r}; "
                        f"use e.g. {DEFAULT_TEXT_FIELD!r}")
    if p.is_file() and p.name.lower().endswith(".json"):
        raise DataError(f"corpus file {p} is .json; npas reads JSON Lines (one object per line): "
                        "convert it and name it .jsonl")
    return p


def fingerprint_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def bundled_text() -> str:
    """The bundled Shakespeare corpus, decoded once per process (many tests and trials load it)."""
    blob = (importlib.resources.files("npas") / _BUNDLED_RESOURCE).read_bytes()
    return gzip.decompress(blob).decode("utf-8")


# ------------------------------------------------------------------------------------------ bytes
def _read_bytes(path: Path, gz: bool) -> bytes:
    try:
        blob = path.read_bytes()
    except OSError as err:
        raise DataError(f"cannot read corpus file {path}: {err.strerror or err}; "
                        "check its permissions or point --data elsewhere") from None
    if gz:
        try:
            blob = gzip.decompress(blob)
        except (OSError, EOFError) as err:
            raise DataError(f"corpus file {path} is not a valid gzip archive ({err}); "
                            "decompress it yourself or fix the file") from None
    return blob


def _decode(blob: bytes, path: Path) -> str:
    """UTF-8 text of ``blob``, refusing binary data and other encodings by name."""
    nul = blob.find(b"\x00")
    if nul >= 0:
        raise DataError(f"corpus file {path} looks binary (NUL byte at offset {nul}); "
                        "point --data at UTF-8 text, JSON Lines or Parquet")
    try:
        return blob.decode("utf-8")
    except UnicodeDecodeError as err:
        line = blob.count(b"\n", 0, err.start) + 1
        raise DataError(f"corpus file {path} is not UTF-8 (undecodable byte at offset {err.start}, line {line}); "
                        "convert it with e.g. `iconv -t utf-8`") from None


def _document(value: object, where: str, text_field: str, path: Path) -> str:
    if not isinstance(value, str):
        kind = "null" if value is None else type(value).__name__
        raise DataError(f"{where} of {path}: field {text_field!r} is {kind}, not a string; "
                        "pass --text-field naming a text field")
    if "\x00" in value:
        raise DataError(f"{where} of {path}: field {text_field!r} holds a NUL character (binary data); "
                        "clean the data or pass another --text-field")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:  # JSON's \ud800 escapes decode to a lone surrogate, which no UTF-8 holds
        raise DataError(f"{where} of {path}: field {text_field!r} holds a lone surrogate (U+{ord(value[err.start]):04X} "
                        f"at character {err.start}), which is not text; fix the escape or drop the document") from None
    return value


# ---------------------------------------------------------------------------------------- readers
def _read_text_file(path: Path, gz: bool) -> list[str]:
    return [_decode(_read_bytes(path, gz), path)]


def _read_jsonl(path: Path, gz: bool, text_field: str) -> list[str]:
    docs: list[str] = []
    # split on "\n" only: str.splitlines would also cut at U+2028, which JSON may leave unescaped in strings
    for lineno, line in enumerate(_decode(_read_bytes(path, gz), path).split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"line {lineno} of {path} is not valid JSON ({err.msg}, column {err.colno}); "
                            "JSON Lines needs one complete object per line") from None
        if not isinstance(record, dict):
            raise DataError(f"line {lineno} of {path} is a JSON {type(record).__name__}, not an object; "
                            f"write one object per line with the text in {text_field!r}")
        if text_field not in record:
            fields = ", ".join(sorted(record)[:8]) or "none"
            raise DataError(f"line {lineno} of {path} has no field {text_field!r} (its fields: {fields}); "
                            "pass --text-field naming the field that holds the text")
        docs.append(_document(record[text_field], f"line {lineno}", text_field, path))
    return docs


def _read_parquet(path: Path, text_field: str) -> list[str]:
    import pandas as pd  # pandas and its pyarrow engine load only when a Parquet corpus is read
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
    except Exception as err:  # pyarrow raises ArrowInvalid/OSError subclasses for non-Parquet files
        raise DataError(f"corpus file {path} is not a readable Parquet file ({str(err).splitlines()[0]}); "
                        "write it with pandas.DataFrame.to_parquet or pass a text/JSONL file") from None
    if text_field not in names:
        raise DataError(f"Parquet file {path} has no column {text_field!r} (its columns: "
                        f"{', '.join(names[:8]) or 'none'}); pass --text-field naming the text column")
    column = pd.read_parquet(path, columns=[text_field], engine="pyarrow")[text_field]
    return [_document(None if pd.isna(v) else v, f"row {i}", text_field, path)
            for i, v in enumerate(column.tolist())]


def _read_file(path: Path, text_field: str) -> list[str]:
    fmt = corpus_format(path)
    if fmt in (".jsonl", ".jsonl.gz"):
        return _read_jsonl(path, fmt == ".jsonl.gz", text_field)
    if fmt == ".parquet":
        return _read_parquet(path, text_field)
    return _read_text_file(path, fmt == ".gz")


def read_documents(path: str | Path, glob: str = DEFAULT_GLOB,
                   text_field: str = DEFAULT_TEXT_FIELD) -> list[str]:
    """Every document of the corpus at ``path``, in a deterministic order, whitespace-only ones kept."""
    p = check_source(path, glob, text_field)
    if not p.is_dir():
        return _read_file(p, text_field)
    files = sorted((f for f in p.glob(glob) if f.is_file()), key=lambda f: f.relative_to(p).as_posix())
    if not files:
        raise DataError(f"corpus directory {p} holds no files matching {glob!r}; "
                        "add some or pass --data-glob to choose others")
    log.info("corpus %s: %d files match %s", p, len(files), glob)
    return [doc for f in files for doc in _read_file(f, text_field)]


def read_corpus(path: str | Path, glob: str = DEFAULT_GLOB, text_field: str = DEFAULT_TEXT_FIELD,
                min_chars: int = 1) -> CorpusText:
    """The corpus at ``path`` as one text, documents joined by ``SEPARATOR``.

    ``min_chars`` is the least text the caller can use (e.g. what a recipe's ``seq_len`` needs in both
    splits); less is refused here, naming both numbers, rather than deep inside training.
    """
    if str(path) in (BUNDLED_NAME, f"bundled:{BUNDLED_NAME}"):
        text = bundled_text()  # one document: the plays, already joined as the package ships them
        return CorpusText(text=text, source=f"bundled:{BUNDLED_NAME}", n_documents=1,
                          fingerprint=fingerprint_text(text))
    docs = read_documents(path, glob, text_field)
    kept = [d for d in docs if d.strip()]
    if len(kept) < len(docs):
        log.info("corpus %s: skipped %d whitespace-only documents", path, len(docs) - len(kept))
    if not kept:
        raise DataError(f"corpus {path} is empty ({len(docs)} documents, none with text); "
                        "point --data at data with text in it")
    text = SEPARATOR.join(kept)
    if len(text) < min_chars:
        raise DataError(f"corpus {path} is too short: {len(text)} characters in {len(kept)} documents, "
                        f"but at least {min_chars} are needed; add text or lower seq_len")
    return CorpusText(text=text, source=str(path), n_documents=len(kept), fingerprint=fingerprint_text(text))
