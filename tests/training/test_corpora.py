"""Corpus formats give the same text for the same documents, and every unusable input its own error."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from npas.errors import DataError
from npas.training.corpora import SEPARATOR, check_source, corpus_format, read_corpus, read_documents
from npas.training.data import bundled_text, fingerprint_text, load_corpus
from npas.training.tokenizers import encode_array, train_bpe

DOCS = [
    "First document.\nIt has two lines.",
    "Second: Ça va? naïve café — 東京 🎭",
    "Third holds a line separator\u2028inside and a tab\there.",
    "  Fourth starts with spaces and ends with a newline\n",
]


def write_jsonl(path: Path, records: list, gz: bool = False) -> Path:
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.fixture
def same_docs(tmp_path) -> dict[str, Path]:
    """One corpus in every format; each must read as SEPARATOR.join(DOCS)."""
    txt = tmp_path / "docs.txt"
    txt.write_text(SEPARATOR.join(DOCS), encoding="utf-8")
    records = [{"id": i, "text": d} for i, d in enumerate(DOCS)]
    dirpath = tmp_path / "dir"
    (dirpath / "sub").mkdir(parents=True)
    for i, d in enumerate(DOCS):  # recursive and sorted by relative path: 0.txt, 1.txt, sub/2.txt, sub/3.txt
        (dirpath / ("sub" if i >= 2 else "") / f"{i}.txt").write_text(d, encoding="utf-8")
    (dirpath / "ignored.md").write_text("not matched by the default glob")
    parquet = tmp_path / "docs.parquet"
    pd.DataFrame(records).to_parquet(parquet)
    return {"txt": txt, "jsonl": write_jsonl(tmp_path / "docs.jsonl", records),
            "jsonl.gz": write_jsonl(tmp_path / "docs.jsonl.gz", records, gz=True),
            "parquet": parquet, "dir": dirpath}


def test_every_format_gives_the_joined_text_and_token_stream(same_docs):
    expected = SEPARATOR.join(DOCS)
    tok = train_bpe(expected * 20, 300)
    want_ids = encode_array(tok, expected)
    for fmt, path in same_docs.items():
        c = read_corpus(path)
        assert c.text == expected, fmt
        assert c.fingerprint == fingerprint_text(expected)
        assert c.n_documents == (1 if fmt == "txt" else len(DOCS))  # a text file is one document
        assert c.n_bytes == len(expected.encode("utf-8"))
        assert np.array_equal(encode_array(tok, c.text), want_ids), fmt


def test_formats_are_chosen_by_name(same_docs, tmp_path):
    assert [corpus_format(p) for p in same_docs.values()] == [".txt", ".jsonl", ".jsonl.gz", ".parquet",
                                                             "directory"]
    assert corpus_format(tmp_path / "x.TXT.gz") == ".gz"
    assert corpus_format(tmp_path / "README") == ".txt"


def test_directory_glob_and_order(tmp_path):
    d = tmp_path / "c"
    (d / "b").mkdir(parents=True)
    (d / "b" / "z.md").write_text("deep")
    (d / "a.md").write_text("top")
    (d / "b.md").write_text("beside the folder")
    assert read_documents(d, glob="**/*.md") == ["top", "beside the folder", "deep"]  # a.md, b.md, b/z.md
    assert read_documents(d, glob="*.md") == ["top", "beside the folder"]
    with pytest.raises(DataError, match="no files matching"):
        read_documents(d)  # the default glob is **/*.txt
    (d / "b" / "more.jsonl").write_text(json.dumps({"body": "from jsonl"}) + "\n")
    assert read_documents(d, glob="**/*.jsonl", text_field="body") == ["from jsonl"]


def test_blank_documents_are_skipped_and_text_field_chosen(tmp_path):
    p = write_jsonl(tmp_path / "c.jsonl", [{"body": "one"}, {"body": "   "}, {"body": "two"}])
    (tmp_path / "c.jsonl").write_bytes(p.read_bytes() + b"\n\n")  # trailing blank lines are not records
    c = read_corpus(p, text_field="body")
    assert c.text == "one" + SEPARATOR + "two" and c.n_documents == 2


def _cases(tmp: Path) -> list[tuple[Path, dict, str]]:
    """(path, read_corpus kwargs, phrase the one-line error must contain)."""
    def put(name: str, data: bytes) -> Path:
        (tmp / name).write_bytes(data)
        return tmp / name

    pd.DataFrame({"text": ["a", "b"], "n": [1, 2]}).to_parquet(tmp / "ok.parquet")
    pd.DataFrame({"text": ["a", None]}).to_parquet(tmp / "null.parquet")
    (tmp / "emptydir").mkdir()
    return [
        (tmp / "missing.txt", {}, "does not exist"),
        (put("empty.txt", b""), {}, "is empty"),
        (put("blank.txt", b" \n\t\n"), {}, "is empty"),
        (put("binary.txt", b"abc\x00def"), {}, "looks binary (NUL byte at offset 3)"),
        (put("latin1.txt", "café".encode("latin-1")), {}, "is not UTF-8"),
        (put("bad.gz", b"not gzip at all"), {}, "not a valid gzip archive"),
        (put("bad.jsonl", b'{"text": "ok"}\n{"text": oops}\n'), {}, "line 2 of"),
        (put("list.jsonl", b'["text"]\n'), {}, "not an object"),
        (put("nofield.jsonl", b'{"body": "x", "id": 1}\n'), {}, "has no field 'text' (its fields: body, id)"),
        (put("int.jsonl", b'{"text": 5}\n'), {}, "field 'text' is int, not a string"),
        (put("null.jsonl", b'{"text": null}\n'), {}, "field 'text' is null"),
        (put("nul.jsonl", b'{"text": "a\\u0000b"}\n'), {}, "NUL character"),
        (put("empty.jsonl", b""), {}, "is empty"),
        (tmp / "ok.parquet", {"text_field": "body"}, "no column 'body' (its columns: text, n)"),
        (tmp / "ok.parquet", {"text_field": "n"}, "field 'n' is int"),
        (tmp / "null.parquet", {}, "row 1 of"),
        (put("fake.parquet", b"this is not parquet"), {}, "not a readable Parquet file"),
        (put("array.json", b'[{"text": "a"}]'), {}, "is .json; npas reads JSON Lines"),
        (tmp / "emptydir", {}, "no files matching"),
        (tmp / "emptydir", {"glob": "/etc/*"}, "--data-glob must be a pattern relative"),
        (tmp / "emptydir", {"glob": "../*.txt"}, "--data-glob must be a pattern relative"),
        (tmp / "ok.parquet", {"text_field": ""}, "--text-field must name"),
        (tmp / "ok.parquet", {"min_chars": 100}, "too short: 4 characters in 2 documents, but at least 100"),
    ]


def test_each_unusable_input_has_its_own_one_line_error(tmp_path):
    for path, kwargs, phrase in _cases(tmp_path):
        with pytest.raises(DataError) as err:
            read_corpus(path, **kwargs)
        msg = str(err.value)
        assert phrase in msg, (path.name, kwargs, msg)
        assert "\n" not in msg and ";" in msg, msg  # one line, with the fix after the semicolon


def test_check_source_runs_before_reading(tmp_path):
    p = tmp_path / "big.jsonl"
    p.write_text('{"text": oops}\n')
    assert check_source(p) == p  # cheap checks only: the broken record is found when reading
    with pytest.raises(DataError, match="does not exist"):
        check_source(tmp_path / "nope")


def test_bundled_corpus_by_name():
    c = read_corpus("bundled:shakespeare")
    assert c.text == bundled_text() and c.source == "bundled:shakespeare"
    assert c.fingerprint == load_corpus().fingerprint  # the fingerprint studies already record
