"""Corpora and tokenizers wired through the search: what a study trains on, stores and refuses."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
from dataclasses import replace

import numpy as np
import optuna
import pandas as pd
import pytest
import torch

from npas.allocation.budget import count
from npas.allocation.budget_scope import embedding_params
from npas.allocation.config import Chassis, reference_config
from npas.allocation.space_parser import load_space
from npas.allocation.transformer import build_model
from npas.errors import BudgetError, DataError, StudyError
from npas.training.corpora import SEPARATOR, bundled_text
from npas.training.data import load_corpus, load_known_corpus, split_bounds
from npas.training.forks import run_proxy
from npas.training.recipe import Recipe
from npas.training.tokenizers import train_bpe
from tests.conftest import ROOT

BPE = "bpe:300"


@pytest.fixture(autouse=True)
def token_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NPAS_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def docs() -> list[str]:
    """~120 KB of Shakespeare as paragraphs: documents of a user's corpus."""
    return [p for p in bundled_text()[:120_000].split("\n\n") if p.strip()]


def write_formats(tmp_path, docs: list[str]) -> dict[str, object]:
    txt = tmp_path / "corpus.txt"
    txt.write_text(SEPARATOR.join(docs), encoding="utf-8")
    jsonl = tmp_path / "corpus.jsonl"
    jsonl.write_text("".join(json.dumps({"id": i, "body": d}) + "\n" for i, d in enumerate(docs)), encoding="utf-8")
    parquet = tmp_path / "corpus.parquet"
    pd.DataFrame({"body": docs}).to_parquet(parquet)
    return {"txt": txt, "jsonl": jsonl, "parquet": parquet}


def ids_digest(corpus) -> str:
    h = hashlib.sha256()
    for split in ("train", "val", "test"):
        h.update(corpus.split(split).numpy().astype(np.int64).tobytes())
    return h.hexdigest()[:16]


def test_jsonl_and_parquet_give_the_token_stream_of_the_joined_text(tmp_path, docs):
    paths = write_formats(tmp_path, docs)
    txt = load_corpus(paths["txt"], tokenizer=BPE)
    for fmt in ("jsonl", "parquet"):
        other = load_corpus(paths[fmt], tokenizer=BPE, text_field="body")
        assert other.fingerprint == txt.fingerprint  # the same text ...
        assert other.tokenizer.fingerprint == txt.tokenizer.fingerprint  # ... the same trained tokenizer ...
        for split in ("train", "val", "test"):  # ... and the same ids, split by split
            assert torch.equal(other.split(split), txt.split(split)), (fmt, split)
    assert txt.vocab_size == 300 and txt.train.dtype == torch.int32


def test_bpe_is_trained_on_the_training_split_only(tmp_path, docs):
    text = SEPARATOR.join(docs)
    path = tmp_path / "c.txt"
    path.write_text(text, encoding="utf-8")
    corpus = load_corpus(path, tokenizer=BPE)
    bounds = split_bounds(len(text), corpus.val_fraction, corpus.test_fraction)
    train = "".join(text[a:b] for a, b in bounds["train"])
    assert corpus.tokenizer.fingerprint == train_bpe(train, 300).fingerprint
    assert corpus.tokenizer.fingerprint != train_bpe(text, 300).fingerprint  # held-out text would change it
    # and the held-out splits still decode back to their own text
    held = "".join(text[a:b] for a, b in bounds["val"])
    assert corpus.tokenizer.decode(corpus.val.numpy()) == held


def test_same_ids_and_fingerprints_in_another_process(tmp_path, docs):
    path = write_formats(tmp_path, docs)["jsonl"]
    here = load_corpus(path, tokenizer=BPE, text_field="body")
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from tests.service.test_corpus_wiring import ids_digest; "
            "from npas.training.data import load_corpus; "
            f"c = load_corpus(sys.argv[2], tokenizer={BPE!r}, text_field='body'); "
            "print(json.dumps([c.fingerprint, c.tokenizer.fingerprint, ids_digest(c)]))")
    env = {"NPAS_CACHE": str(tmp_path / "other-cache"), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code, str(ROOT), str(path)], capture_output=True, text=True,
                         check=True, env=env, timeout=120)
    assert json.loads(out.stdout) == [here.fingerprint, here.tokenizer.fingerprint, ids_digest(here)]
    assert list((tmp_path / "other-cache" / "tokens").glob("*.bin"))  # it tokenized on its own, not from our cache


def test_workers_reload_the_stored_tokenizer_from_its_json(tmp_path, docs, monkeypatch):
    path = write_formats(tmp_path, docs)["txt"]
    made = load_corpus(path, tokenizer=BPE)
    import npas.training.tokenizers as toks

    def no_training(*a, **k):  # a worker must load the study's tokenizer, never train its own
        raise AssertionError("retrained")

    monkeypatch.setattr(toks, "train_bpe", no_training)
    again = load_known_corpus(str(path), made.val_fraction, made.test_fraction, made.fingerprint,
                              made.tokenizer.to_json())
    assert again.tokenizer.fingerprint == made.tokenizer.fingerprint and torch.equal(again.train, made.train)
    with pytest.raises(DataError, match="the tokenizer here .* differs from the study's"):
        load_known_corpus(str(path), made.val_fraction, made.test_fraction, made.fingerprint,
                          made.tokenizer.to_json(), tokenizer_fingerprint="0" * 16)


def test_bits_per_byte_of_a_char_model_is_its_bits_per_char_on_ascii(tmp_path):
    text = "".join(c for c in bundled_text()[:60_000] if ord(c) < 128)
    path = tmp_path / "ascii.txt"
    path.write_text(text, encoding="ascii")
    corpus = load_corpus(path)
    chassis = Chassis(vocab_size=corpus.vocab_size, context=32, d_model=32, n_layers=1, n_heads=2, d_ff=64)
    recipe = Recipe(name="tiny", seq_len=32, batch_size=4, steps=20, lr=1e-2, min_lr=1e-3, warmup_steps=2,
                    eval_every=10, eval_batches=2, threads=1)
    res = run_proxy(reference_config(chassis), recipe, corpus)
    assert res.status == "ok"
    assert res.val_bpb == pytest.approx(res.val_bpc, rel=1e-9)
    assert res.val_bpb == pytest.approx(res.val_loss / math.log(2), rel=1e-9)
    assert res.train_bpb == pytest.approx(res.train_loss / math.log(2), rel=1e-9)


def test_bits_per_byte_of_a_bpe_model_divides_by_the_bytes(tmp_path, docs):
    path = write_formats(tmp_path, docs)["txt"]
    corpus = load_corpus(path, tokenizer=BPE)
    chassis = Chassis(vocab_size=corpus.vocab_size, context=32, d_model=32, n_layers=1, n_heads=2, d_ff=64)
    recipe = Recipe(name="tiny", seq_len=32, batch_size=4, steps=10, lr=1e-2, min_lr=1e-3, warmup_steps=2,
                    eval_every=10, eval_batches=2, threads=1)
    res = run_proxy(reference_config(chassis), recipe, corpus)
    from npas.training.proxy import eval_batches

    y = eval_batches(corpus, recipe)[1]
    n_bytes = len(corpus.tokenizer.decode(y.reshape(-1).numpy()).encode("utf-8"))
    assert res.val_bpb == pytest.approx(res.val_loss * y.numel() / math.log(2) / n_bytes, rel=1e-9)
    assert res.val_bpc / res.val_bpb == pytest.approx(n_bytes / y.numel()) and n_bytes / y.numel() > 1.3


def test_val_bpb_is_an_objective(tmp_path):
    from npas.allocation.space_parser import parse_space
    from npas.service.execution.outcome import objective_values

    text = (ROOT / "search_spaces" / "taper.yaml").read_text()
    space = parse_space(text.replace("objectives: [val_loss,", "objectives: [val_bpb,"), "t")
    assert space.objectives[0] == "val_bpb"
    assert objective_values(["val_bpb"], {}, None, 2.0, tokens_per_byte=0.5) == [pytest.approx(1.0 / math.log(2))]


# ---------------------------------------------------------------------------------- budget scope
def test_non_embedding_budgets_hold_exactly():
    space = load_space(ROOT / "search_spaces" / "full.yaml")
    with pytest.raises(BudgetError, match="budget_scope: non_embedding"):
        space.bind(vocab_size=4096)  # a BPE vocabulary eats the whole 0.25x budget under `all`
    bound = space.bind(vocab_size=4096, budget_scope="non_embedding")
    ref = bound.reference_chassis
    assert bound.budget_params == int(0.25 * (bound.reference_params - embedding_params(ref)))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    full, checked = 0, 0
    for _ in range(40):
        cand = bound.sample(study.ask())
        if not cand.feasible:
            continue
        acc = count(cand.config)
        model = build_model(cand.config)
        emb = model.wte.weight.numel() + model.wpe.weight.numel()  # the head is tied: counted once, here
        assert acc.embedding_params == emb
        assert acc.non_embedding_params == sum(p.numel() for p in model.parameters()) - emb
        assert acc.non_embedding_params <= bound.budget_params
        assert cand.fit.stored == acc.non_embedding_params
        full += acc.non_embedding_params == bound.budget_params
        checked += 1
        if checked == 6:
            break
    assert checked == 6 and full >= 1  # within budget always, and filled to the parameter at least once


def test_budget_scope_in_the_space_file():
    from npas.allocation.space_parser import parse_space

    text = (ROOT / "search_spaces" / "taper.yaml").read_text()
    space = parse_space("budget_scope: non_embedding\n" + text, "t")
    assert space.budget_scope == "non_embedding"
    assert space.bind(vocab_size=68).budget_params < space.bind(vocab_size=68, budget_scope="all").budget_params
    from npas.errors import SpaceError

    with pytest.raises(SpaceError, match="budget_scope"):
        parse_space("budget_scope: some\n" + text, "t")


# ------------------------------------------------------------------------------- studies and CLI
def test_resume_refuses_a_different_tokenizer(tmp_path, docs):
    import npas
    from npas.service.search.driver import resume
    from npas.service.study.record import StudyAttr
    from npas.service.study.storage import open_storage
    from npas.service.study.studies import write_record
    from npas.training.recipe import load_recipe
    from tests.service.test_record import RECORD

    path = write_formats(tmp_path, docs)["txt"]
    rec = load_recipe("smoke")
    corpus = load_corpus(path, rec.val_fraction, rec.test_fraction, tokenizer=BPE)
    space = npas.load_space("search_spaces/taper.yaml")
    record = replace(RECORD, space_text=space.text, space_source=space.source, recipe=rec.to_dict(),
                     data_source=str(path), data_fingerprint=corpus.fingerprint,
                     overrides={"vocab_size": corpus.vocab_size}, objectives=tuple(space.objectives),
                     data_split=corpus.describe()["split"], tokenizer=BPE,
                     tokenizer_json=corpus.tokenizer.to_json(), tokenizer_fingerprint=corpus.tokenizer.fingerprint)
    url = f"sqlite:///{tmp_path}/s.db"
    study = optuna.create_study(study_name="s", storage=open_storage(url).storage,
                                directions=["minimize"] * len(space.objectives))
    write_record(study, record)
    study.set_user_attr(StudyAttr.READY, True)
    assert study.user_attrs[StudyAttr.TOKENIZER_FP] == corpus.tokenizer.fingerprint
    with pytest.raises(StudyError, match=r"tokenizer bpe:320 differs from the one study 's' was started with"):
        resume("s", storage=url, tokenizer="bpe:320")
    with pytest.raises(StudyError, match="tokenizer char differs"):
        resume("s", storage=url, tokenizer="char")


@pytest.mark.parametrize(("args", "needle"), [
    (["--tokenizer", "bpe:12"], "between 256"),
    (["--tokenizer", "bpe:many"], "whole number"),
    (["--data", "{jsonl}", "--text-field", "nope"], "has no field 'nope'"),
    (["--data", "{empty}"], "is empty"),
    (["--data", "{binary}"], "looks binary"),
    (["--data", "{latin}"], "not UTF-8"),
    (["--data", "{short}", "--tokenizer", "bpe:256"], "too small for seq_len"),
    (["--budget-scope", "most"], "invalid choice"),
    (["--data", "{jsonl}", "--text-field", "body", "--tokenizer", "bpe:256", "--budget", "40k"],
     "the embeddings alone need at d_model=128 and vocab_size=256; raise the budget, lower d_model, or cap only "
     "the non-embedding parameters with `budget_scope: non_embedding` (--budget-scope non_embedding)"),
])
def test_bad_corpus_input_is_one_line_exit_2_and_writes_nothing(tmp_path, docs, args, needle, monkeypatch, capsys):
    paths = write_formats(tmp_path, docs[:50])
    files = {"jsonl": paths["jsonl"], "empty": tmp_path / "e.jsonl", "binary": tmp_path / "b.txt",
             "latin": tmp_path / "l.txt", "short": tmp_path / "s.txt"}
    files["empty"].write_text("\n\n")
    files["binary"].write_bytes(b"abc\x00def")
    files["latin"].write_bytes("café".encode("latin-1"))
    files["short"].write_text("just a few words\n" * 4)
    argv = [a.format(**{k: str(v) for k, v in files.items()}) for a in args]
    db = tmp_path / "n.db"
    monkeypatch.chdir(tmp_path)
    from npas.presentation.cli import main

    try:
        code = main(["search", "taper", "--recipe", "smoke", "--storage", f"sqlite:///{db}", *argv])
    except SystemExit as e:  # argparse's own errors
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert needle in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and not db.exists()
    runner = sys.modules.get("npas.service.execution.session")
    assert runner is None or not runner.ray_start_begun()  # refused before Ray was started
