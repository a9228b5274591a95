"""A model trained on BPE tokens is a starting point like any other: `npas search --init-from` searches
with its tokenizer.json (another --tokenizer is refused in one line, before Ray or the database), its
trials start from its weights, and `npas convert` / `npas train MODEL_DIR` read it too."""

from __future__ import annotations

import gzip
import math
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

import npas
from npas.allocation.config import ArchConfig, reference_config
from npas.conversion.init_from import describe_source, initial_state, source_tokenizer
from npas.presentation.cli import main
from npas.training.data import load_corpus
from npas.training.forks import run_proxy
from npas.training.recipe import Recipe
from npas.training.train import load_trained, read_metrics
from tests.conftest import ROOT

TINY = ROOT / "tests" / "data" / "tiny.yaml"
FAST = str(ROOT / "tests" / "data" / "fast.yaml")
BPE = 300
RECIPE = {"name": "quick", "seq_len": 32, "batch_size": 8, "steps": 60, "lr": 1e-2, "min_lr": 1e-3,
          "warmup_steps": 4, "eval_every": 60, "eval_batches": 4, "threads": 1}


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A slice of the bundled text: BPE trains on it in a moment."""
    path = tmp_path_factory.mktemp("text") / "shakespeare.txt"
    with gzip.open(ROOT / "npas" / "builtin" / "shakespeare.txt.gz", "rt", encoding="utf-8") as f:
        path.write_text(f.read(200_000), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory: pytest.TempPathFactory, text: str) -> Path:
    """The tiny space's dense reference trained with `npas train --tokenizer bpe:300`."""
    tmp = tmp_path_factory.mktemp("bpe")
    alloc, recipe, out = tmp / "dense.yaml", tmp / "quick.yaml", tmp / "dense"
    alloc.write_text(reference_config(npas.load_space(TINY).bind(vocab_size=BPE).reference_chassis).to_yaml())
    recipe.write_text(Recipe.from_dict(RECIPE).to_yaml())
    assert main(["train", str(alloc), "--recipe", str(recipe), "--data", text, "--tokenizer", f"bpe:{BPE}",
                 "--out", str(out), "--device", "cpu"]) == 0
    assert read_metrics(out)["result"]["val_loss"] < math.log(BPE) - 1.0
    return out


def _candidate(space) -> ArchConfig:
    cfg = space.sample(optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3)).ask()).config
    assert cfg is not None
    return cfg


def test_init_from_a_bpe_model_searches_with_its_tokenizer_and_starts_from_it(bpe_dir: Path, text: str) -> None:
    tokenizer = source_tokenizer(bpe_dir)
    assert tokenizer == str(bpe_dir / "tokenizer.json")
    assert source_tokenizer(bpe_dir, "char") == "char"  # a given one is kept, for describe_source to judge
    recipe = Recipe.from_dict({**RECIPE, "steps": 10, "eval_every": 5})
    corpus = load_corpus(text, recipe.val_fraction, recipe.test_fraction, tokenizer=tokenizer)
    assert corpus.tokenizer.fingerprint == load_trained(bpe_dir)[1].fingerprint and corpus.vocab_size == BPE
    space = npas.load_space(TINY).bind(vocab_size=corpus.vocab_size)
    init = describe_source(bpe_dir, space.reference_chassis, corpus)  # raised AttributeError (tokenizer.chars)
    cfg = _candidate(space)
    state = initial_state(init, cfg, recipe.seed, corpus, recipe.seq_len)  # what each worker does
    warm = run_proxy(cfg, recipe, corpus, reference=space.reference_chassis, init_state=state)
    cold = run_proxy(cfg, recipe, corpus, reference=space.reference_chassis)
    assert warm.status == "ok" and warm.curve[0][1] < cold.curve[0][1] - 0.5, (warm.curve, cold.curve)


def test_search_refuses_another_tokenizer_for_a_bpe_model_in_one_line(bpe_dir: Path, text: str, tmp_path: Path,
                                                                      capsys) -> None:
    db = tmp_path / "never.db"
    code = main(["search", str(TINY), "--init-from", str(bpe_dir), "--data", text, "--tokenizer", "char",
                 "--recipe", FAST, "--trials", "1", "--storage", f"sqlite:///{db}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "reads text with its own" in err and "drop --tokenizer" in err
    assert not db.exists()
    ray = sys.modules.get("ray")
    assert ray is None or not ray.is_initialized()


def test_convert_and_continue_a_bpe_model(bpe_dir: Path, tmp_path: Path, capsys) -> None:
    _, _, dense = load_trained(bpe_dir)
    L = dense.chassis.n_layers
    tied = ArchConfig(chassis=dense.chassis, mlp_widths=dense.mlp_widths, block_of_layer=tuple(i % 2 for i in range(L)),
                      lora_attn=(4,) * L)
    alloc, conv = tmp_path / "tied.yaml", tmp_path / "conv"
    alloc.write_text(tied.to_yaml())
    assert main(["convert", str(bpe_dir), "--to", str(alloc), "--out", str(conv), "--quiet"]) == 0
    converted = read_metrics(conv)["conversion"]["val_loss"]
    assert converted < math.log(BPE) - 0.8
    recipe = tmp_path / "one.yaml"
    recipe.write_text(Recipe.from_dict({**RECIPE, "steps": 1, "warmup_steps": 1}).to_yaml())
    out = tmp_path / "continued"
    assert main(["train", str(conv), "--recipe", str(recipe), "--out", str(out), "--device", "cpu"]) == 0
    result = read_metrics(out)["result"]
    assert abs(result["train_loss"] - converted) < 0.4, (result, converted)  # from the converted weights
    assert (out / "tokenizer.json").read_bytes() == (bpe_dir / "tokenizer.json").read_bytes()


@pytest.mark.slow
def test_cli_search_from_a_bpe_model_completes_trials(bpe_dir: Path, text: str, tmp_path: Path) -> None:
    from npas.service.study.record import StudyAttr, TrialAttr

    db = tmp_path / "bpe.db"
    out = subprocess.run([sys.executable, "-m", "npas", "search", str(TINY), "--init-from", str(bpe_dir),
                          "--data", text, "--recipe", FAST, "--trials", "2", "--workers", "1", "--no-early-stop",
                          "--sampler", "random", "--study", "bpe", "--storage", f"sqlite:///{db}"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    study = optuna.load_study(study_name="bpe", storage=f"sqlite:///{db}")
    ok = [t for t in study.trials if t.user_attrs.get(TrialAttr.STATUS) == "ok"]
    assert ok, [t.user_attrs.get(TrialAttr.REASON) for t in study.trials]
    assert study.user_attrs[StudyAttr.TOKENIZER_FP] == load_trained(bpe_dir)[1].fingerprint
    assert study.user_attrs[StudyAttr.VOCAB] == BPE
