"""`npas train` / `npas sample`: outputs reload via safetensors and reproduce the saved loss."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_model, save_model
from torch import nn

import npas
from npas.allocation.config import ArchConfig, Bank, Chassis, reference_config
from npas.errors import DataError
from npas.presentation.cli import main
from npas.training.data import load_corpus
from npas.training.proxy import eval_batches, evaluate
from npas.training.recipe import Recipe
from npas.training.train import OUTPUT_FILES, load_trained, read_metrics, sample

CHASSIS = Chassis(vocab_size=68, context=64, d_model=64, n_layers=2, n_heads=4, d_ff=256)
REF = reference_config(CHASSIS)
POOLED_TIED = ArchConfig(chassis=CHASSIS, mlp_widths=(256, 128), block_of_layer=(0, 0), lora_attn=(2, 2),
                         banks=(Bank(members=((0, "mlp_up"), (0, "mlp_down")), generator="tile", size=4096),))
QUICK = {"name": "quick", "seq_len": 32, "batch_size": 8, "steps": 40, "lr": 1e-2, "min_lr": 1e-3,
         "warmup_steps": 5, "eval_every": 20, "eval_batches": 3, "threads": 1}


def write_recipe(tmp_path: Path, **over) -> Path:
    p = tmp_path / "quick.yaml"
    p.write_text(Recipe.from_dict({**QUICK, **over}).to_yaml())
    return p


def write_cfg(tmp_path: Path, cfg: ArchConfig, name: str = "alloc.yaml") -> Path:
    p = tmp_path / name
    p.write_text(cfg.to_yaml())
    return p


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One `npas train` run shared by the reload and sampling tests."""
    tmp = tmp_path_factory.mktemp("train")
    out = tmp / "run"
    rc = main(["train", str(write_cfg(tmp, POOLED_TIED)), "--recipe", str(write_recipe(tmp)),
               "--out", str(out), "--steps", "30", "--device", "cpu"])
    assert rc == 0
    return out


def test_train_writes_the_four_files(trained, capsys):
    assert sorted(p.name for p in trained.iterdir()) == sorted(OUTPUT_FILES)
    m = read_metrics(trained)
    assert m["result"]["status"] == "ok" and m["result"]["steps_done"] == 30
    assert m["recipe"]["steps"] == 30  # --steps overrides the recipe and is recorded
    assert m["data"]["fingerprint"] == load_corpus().fingerprint
    assert m["result"]["config_hash"] == POOLED_TIED.hash
    assert ArchConfig.from_yaml((trained / "config.yaml").read_text()) == POOLED_TIED


def test_reload_reproduces_saved_validation_loss(trained):
    model, tok, cfg = load_trained(trained)
    assert cfg == POOLED_TIED and tok == load_corpus().tokenizer
    assert isinstance(model, type(npas.build_model(cfg)))
    m = read_metrics(trained)
    recipe = Recipe.from_dict(m["recipe"])
    val = evaluate(model, eval_batches(load_corpus(), recipe), torch.device("cpu"), recipe)
    assert val == pytest.approx(m["result"]["val_loss"], abs=1e-5)
    fresh = npas.build_model(cfg)  # an untrained model scores far worse: the weights really loaded
    assert evaluate(fresh, eval_batches(load_corpus(), recipe), torch.device("cpu"), recipe) > val + 0.3
    assert sum(p.numel() for p in model.parameters()) == npas.count(cfg).stored_params


def test_safetensors_keeps_shared_parameters_shared(tmp_path):
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4, bias=False)
            self.b = nn.Linear(4, 4, bias=False)
            self.b.weight = self.a.weight  # one Parameter under two names

    src, dst = Tied(), Tied()
    save_model(src, str(tmp_path / "t.safetensors"))
    load_model(dst, str(tmp_path / "t.safetensors"))
    assert dst.a.weight is dst.b.weight and torch.equal(dst.a.weight, src.a.weight)


def test_sample_is_seeded_and_names_unknown_characters(trained, capsys):
    model, tok, _ = load_trained(trained)
    a = sample(model, tok, "ROMEO:", tokens=40, temperature=1.0, seed=3)
    assert len(a) == 40 and set(a) <= set(tok.chars)
    assert sample(model, tok, "ROMEO:", tokens=40, temperature=1.0, seed=3) == a
    assert sample(model, tok, "ROMEO:", tokens=40, temperature=1.0, seed=4) != a
    for bad in (float("nan"), -0.5):  # the Python API refuses what the CLI's parser refuses
        with pytest.raises(DataError, match="--temperature must be a finite number >= 0"):
            sample(model, tok, "ROMEO:", tokens=5, temperature=bad)
    greedy = sample(model, tok, "", tokens=10, temperature=0)
    assert greedy == sample(model, tok, "", tokens=10, temperature=0, seed=99)
    assert sample(model, tok, "x" * 100, tokens=5)  # prompts longer than the context are cropped
    with pytest.raises(DataError, match=r"not in the 68-character vocabulary: '@', '€'"):
        sample(model, tok, "ROMEO€@", tokens=5)
    assert main(["sample", str(trained), "--prompt", "JULIET:", "--tokens", "25", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("JULIET:") and len(out.rstrip("\n")) >= len("JULIET:") + 20
    assert main(["sample", str(trained), "--prompt", "é~"]) == 2
    assert "'é'" in capsys.readouterr().err


def test_train_refuses_vocab_mismatch_and_existing_output(tmp_path, trained, capsys):
    other = reference_config(Chassis(vocab_size=70, context=64, d_model=32, n_layers=1, n_heads=2, d_ff=64))
    rc = main(["train", str(write_cfg(tmp_path, other)), "--recipe", str(write_recipe(tmp_path)),
               "--out", str(tmp_path / "x")])
    assert rc == 2
    assert "chassis vocab_size=70 but corpus bundled:shakespeare under tokenizer char has 68" in capsys.readouterr().err
    rc = main(["train", str(write_cfg(tmp_path, POOLED_TIED)), "--recipe", "smoke", "--out", str(trained)])
    assert rc == 2 and "already holds a trained model; pass --force" in capsys.readouterr().err
    assert main(["train", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml does not exist" in capsys.readouterr().err


def test_failed_training_writes_metrics_only(tmp_path, capsys):
    out = tmp_path / "nan"
    rc = main(["train", str(write_cfg(tmp_path, REF)), "--out", str(out), "--recipe",
               str(write_recipe(tmp_path, lr=1e6, min_lr=1e6, grad_clip=0.0, warmup_steps=0))])
    assert rc == 2
    assert "training failed: non-finite loss at step" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["metrics.json"]
    assert json.loads((out / "metrics.json").read_text())["result"]["status"] == "failed"
    with pytest.raises(DataError, match="lacks model.safetensors, tokenizer.json, config.yaml"):
        load_trained(out)


def test_load_trained_errors(tmp_path, trained):
    with pytest.raises(DataError, match="does not exist; pass the --out of `npas train`"):
        load_trained(tmp_path / "nowhere")
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("tokenizer.json", "config.yaml"):
        (broken / name).write_bytes((trained / name).read_bytes())
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(DataError, match="cannot load .*model.safetensors"):
        load_trained(broken)
    (broken / "config.yaml").write_text(REF.to_yaml())  # weights of another allocation
    save_model(npas.build_model(POOLED_TIED), str(broken / "model.safetensors"))
    with pytest.raises(DataError, match="do not match config.yaml"):
        load_trained(broken)
    legacy = tmp_path / "legacy"  # a directory from an npas that wrote the character vocabulary as vocab.json
    legacy.mkdir()
    for name in ("model.safetensors", "config.yaml"):
        (legacy / name).write_bytes((trained / name).read_bytes())
    (legacy / "vocab.json").write_bytes((trained / "tokenizer.json").read_bytes())
    assert load_trained(legacy)[1].vocab_size == load_trained(trained)[1].vocab_size
