"""`npas train MODEL_DIR` continues from a trained or converted model's weights, and `npas convert`'s
hint says so: following the hint starts from the converted loss, not from a random init."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from npas.allocation.config import ArchConfig, Chassis, reference_config
from npas.presentation.cli import main
from npas.training.data import CharTokenizer, load_corpus
from npas.training.recipe import Recipe, load_recipe
from npas.training.train import read_metrics, train_allocation

CHASSIS = Chassis(vocab_size=68, context=64, d_model=32, n_layers=2, n_heads=4, d_ff=64)
TIED = ArchConfig(chassis=CHASSIS, mlp_widths=(64, 64), block_of_layer=(0, 0), lora_attn=(4, 4))
RANDOM_INIT = math.log(68)  # what a fresh model's first loss is near
# a small continuation recipe (the default, long, evaluates 100k tokens: seconds on a busy CPU)
QUICK = {"name": "quick", "seq_len": 32, "batch_size": 8, "steps": 10, "lr": 4e-3, "min_lr": 4e-4,
         "warmup_steps": 1, "eval_every": 10, "eval_batches": 4, "threads": 1}


@pytest.fixture(scope="module")
def dense_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    recipe = load_recipe("smoke").with_steps(60)
    out = tmp_path_factory.mktemp("dense")
    result = train_allocation(reference_config(CHASSIS), recipe, load_corpus(), out)
    assert result.status == "ok" and result.val_loss < RANDOM_INIT - 0.8
    return out


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("recipe") / "quick.yaml"
    path.write_text(Recipe.from_dict(QUICK).to_yaml())
    return str(path)


def _first_step(out: Path) -> tuple[float, float]:
    """(loss of the first training batch, before the update; validation loss after the one step)."""
    result = read_metrics(out)["result"]
    assert result["status"] == "ok" and result["steps_done"] == 1
    return result["train_loss"], result["val_loss"]


def test_convert_hint_continues_from_the_converted_weights(dense_dir: Path, quick: str, tmp_path: Path,
                                                          capsys) -> None:
    alloc = tmp_path / "tied.yaml"
    alloc.write_text(TIED.to_yaml())
    conv = tmp_path / "conv"
    assert main(["convert", str(dense_dir), "--to", str(alloc), "--out", str(conv), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert f"`npas train {conv}`" in printed and "config.yaml`" not in printed  # the directory, not its allocation
    assert "tokenizer.json" in printed and "vocab.json" not in printed  # the file it wrote
    assert (conv / "tokenizer.json").is_file()
    converted = read_metrics(conv)["conversion"]["val_loss"]
    assert converted < RANDOM_INIT - 0.6

    out = tmp_path / "continued"
    assert main(["train", str(conv), "--steps", "1", "--out", str(out), "--device", "cpu", "--recipe", quick]) == 0
    assert f"from the weights in {conv}" in capsys.readouterr().out
    first, val = _first_step(out)
    assert abs(first - converted) < 0.3, (first, converted)  # starts where the conversion left it
    assert val < converted + 0.3 and val < RANDOM_INIT - 0.6, (val, converted)
    metrics = read_metrics(out)
    assert metrics["started_from"] == str(conv.resolve())
    assert metrics["reference"] == CHASSIS.to_dict()  # the dense source's chassis, as recorded

    scratch = tmp_path / "scratch"  # what the old hint (`npas train OUT/config.yaml`) did: a random init
    assert main(["train", str(conv / "config.yaml"), "--steps", "1", "--out", str(scratch), "--device", "cpu",
                 "--recipe", quick]) == 0
    assert _first_step(scratch)[0] > RANDOM_INIT - 0.3


def test_train_continues_a_trained_model_directory(dense_dir: Path, quick: str, tmp_path: Path) -> None:
    dense_val = read_metrics(dense_dir)["result"]["val_loss"]
    out = tmp_path / "more"
    assert main(["train", str(dense_dir), "--steps", "1", "--out", str(out), "--device", "cpu", "--recipe", quick]) == 0
    first, _ = _first_step(out)
    assert abs(first - dense_val) < 0.3, (first, dense_val)


def test_continuing_without_out_never_writes_over_the_source(dense_dir: Path, quick: str, tmp_path: Path,
                                                            monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the default --out is relative: trials/runs/...
    cfg_hash = read_metrics(dense_dir)["result"]["config_hash"]
    source = tmp_path / "trials" / "runs" / f"train-{cfg_hash}"  # where `npas train` put it by default
    source.parent.mkdir(parents=True)
    shutil.copytree(dense_dir, source)
    before = (source / "model.safetensors").read_bytes()
    assert main(["train", str(source), "--steps", "1", "--device", "cpu", "--recipe", quick]) == 0
    (out,) = [p for p in source.parent.iterdir() if p.name.startswith(f"train-{cfg_hash}-from-")]
    assert _first_step(out)[1] > 0 and (source / "model.safetensors").read_bytes() == before


def test_train_refuses_another_tokenizer_for_a_model_directory(dense_dir: Path, tmp_path: Path, capsys) -> None:
    chars = load_corpus().tokenizer.chars
    other = tmp_path / "other.json"  # every character of the text and one more: it encodes, but other ids
    other.write_text(CharTokenizer(tuple(sorted({*chars, "\u00e4"}))).to_json())
    out = tmp_path / "never"
    assert main(["train", str(dense_dir), "--steps", "1", "--out", str(out), "--tokenizer", str(other)]) == 2
    err = capsys.readouterr().err.strip()
    assert "is not the tokenizer the model" in err and len(err.splitlines()) == 1
    assert not out.exists()
