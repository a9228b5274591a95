"""`npas train` of an exported trial trains it as its search did: same reference chassis, same init,
same learning-rate multipliers, so under the trial's recipe and seed it reproduces the trial's loss
bit for bit on CPU.

The fair parameterization scales a candidate's per-group learning rates and init against the space's
reference chassis (npas/training/parameterization.py). A candidate whose fit narrowed d_model gets
other multipliers against the reference than against its own chassis, so an export must carry the
reference and `npas train` must pass it on, as the runner does. The fast tests build the trial the
way the runner trains it (`run_proxy` with the space's reference, on the study's stored corpus); the
slow one runs a real search on Ray.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import optuna
import pytest
import torch
import yaml

import npas
from npas.allocation.config import ArchConfig, Chassis
from npas.presentation.cli import main
from npas.service.export.exporter import write_export
from npas.service.study.record import Constraint, StudyAttr, TrialAttr
from npas.training.data import load_corpus, load_known_corpus
from npas.training.forks import run_proxy
from npas.training.parameterization import optimizer_groups
from npas.training.recipe import Recipe
from npas.training.train import read_allocation_file, read_metrics

# `fit: width: all` narrows d_model to meet the budget: the case whose multipliers depend on the reference
SPACE = """name: narrow
chassis: {vocab_size: 68, context: 32, d_model: 64, n_layers: 2, n_heads: 4, d_ff: 128}
budget: 0.5x
fit: {width: all}
recipe: smoke
knobs:
  tying: {mode: [none, all]}
"""
RECIPE = {"name": "exported", "seq_len": 32, "batch_size": 8, "steps": 30, "lr": 1e-2, "min_lr": 1e-3,
          "warmup_steps": 4, "eval_every": 15, "eval_batches": 2, "seed": 7, "threads": 1}


def _space(tmp_path: Path):
    path = tmp_path / "narrow.yaml"
    path.write_text(SPACE)
    return npas.load_space(path).bind(vocab_size=load_corpus().vocab_size)


def _narrowed(space) -> ArchConfig:
    """The space's untied candidate: its fit narrows d_model below the reference's."""
    trial = optuna.create_study().ask()
    cfg = space.sample(trial, fixed={"tying": "none"}).config
    assert cfg is not None and cfg.chassis.d_model < space.reference_chassis.d_model
    return cfg


def _mults(cfg: ArchConfig, reference: Chassis | None) -> list[tuple[str, float]]:
    torch.manual_seed(0)
    return sorted((g["group"], g["lr_mult"]) for g in optimizer_groups(npas.build_model(cfg), 0.1, "fair", reference))


def _study_with_trial(space, cfg: ArchConfig, recipe: Recipe) -> tuple[optuna.Study, float]:
    """A study as npas records it, holding one trial trained the way `runner.trainable` trains it."""
    stored = load_corpus()
    corpus = load_known_corpus(None, recipe.val_fraction, recipe.test_fraction, stored.fingerprint,
                               stored.tokenizer.to_json())
    reference = Chassis(**dataclasses.asdict(space.reference_chassis))  # the runner's payload, round-tripped
    result = run_proxy(cfg, recipe, corpus, reference=reference)
    assert result.status == "ok"
    study = optuna.create_study(directions=["minimize", "minimize"])
    for k, v in {StudyAttr.SPACE_TEXT: space.text, StudyAttr.SPACE_SOURCE: space.source,
                 StudyAttr.OVERRIDES: dict(space.overrides), StudyAttr.OBJECTIVES: ["val_loss", "train_memory_bytes"],
                 StudyAttr.RECIPE: recipe.to_dict(), StudyAttr.FINGERPRINT: stored.fingerprint,
                 StudyAttr.TOKENIZER_JSON: stored.tokenizer.to_json()}.items():
        study.set_user_attr(k, v)
    acc = npas.count(cfg)
    study.add_trial(optuna.trial.create_trial(
        values=[result.val_loss, acc.train_memory_bytes],
        user_attrs={TrialAttr.ALLOC: cfg.to_dict(), TrialAttr.HASH: cfg.hash, TrialAttr.STATUS: "ok",
                    TrialAttr.ACCOUNTING: acc.to_dict(), TrialAttr.PROXY: result.to_dict()},
        constraints={Constraint.BUDGET: -1.0, Constraint.FIDELITY: 0.0}))
    return study, result.val_loss


def test_export_records_the_reference_and_train_uses_its_multipliers(tmp_path):
    space = _space(tmp_path)
    cfg = _narrowed(space)
    # the premise: against its own chassis the narrowed candidate gets other multipliers than its trial had
    assert _mults(cfg, space.reference_chassis) != _mults(cfg, None)
    study, _ = _study_with_trial(space, cfg, Recipe.from_dict({**RECIPE, "steps": 2, "eval_every": 2, "warmup_steps": 1}))
    out = tmp_path / "best.yaml"
    doc = write_export(study, out, "trial=0")
    assert doc["reference"] == space.reference_chassis.to_dict()
    read = read_allocation_file(out)
    assert read.exported and read.cfg == cfg and read.reference == space.reference_chassis
    assert _mults(read.cfg, read.reference) == _mults(cfg, space.reference_chassis)


def test_train_of_an_export_reproduces_the_trials_loss_bitwise(tmp_path, capsys):
    space = _space(tmp_path)
    cfg = _narrowed(space)
    recipe = Recipe.from_dict(RECIPE)
    study, trial_loss = _study_with_trial(space, cfg, recipe)
    export = tmp_path / "best.yaml"
    write_export(study, export, "trial=0")
    recipe_file = tmp_path / "trial-recipe.yaml"  # the trial's recipe and seed, as the export records them
    recipe_file.write_text(Recipe.from_dict(yaml.safe_load(export.read_text())["recipe"]).to_yaml())
    out = tmp_path / "trained"
    assert main(["train", str(export), "--recipe", str(recipe_file), "--out", str(out), "--device", "cpu"]) == 0
    assert "note:" not in capsys.readouterr().err
    metrics = read_metrics(out)
    assert metrics["result"]["val_loss"] == trial_loss  # bit for bit
    assert metrics["reference"] == space.reference_chassis.to_dict()

    # an export from before the reference was recorded: its own chassis, said in one line, not an error
    old = yaml.safe_load(export.read_text())
    del old["reference"]
    legacy = tmp_path / "legacy.yaml"
    legacy.write_text(yaml.safe_dump(old, sort_keys=False))
    assert main(["train", str(legacy), "--recipe", str(recipe_file), "--out", str(tmp_path / "legacy"),
                 "--device", "cpu", "--tokenizer", str(export.with_suffix(".tokenizer.json"))]) == 0
    err = [ln for ln in capsys.readouterr().err.splitlines() if "note:" in ln]
    assert len(err) == 1 and "reference chassis" in err[0] and "export it again" in err[0]
    assert read_metrics(tmp_path / "legacy")["result"]["val_loss"] != trial_loss


def test_a_malformed_reference_is_refused_in_one_line(tmp_path, capsys):
    doc = {"allocation": npas.reference_config(Chassis(68, 32, 32, 2, 4, 64)).to_dict(),
           "reference": {"d_model": "wide"}}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["train", str(path), "--steps", "1", "--out", str(tmp_path / "never")]) == 2
    err = capsys.readouterr().err.strip()
    assert "reference must be a chassis mapping" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "never").exists()


# ---- the real thing: a search on Ray, `npas export`, `npas train` ------------------------------
@pytest.mark.slow
def test_search_export_train_reproduces_the_first_seed_of_a_repeats_trial(ray_local, tmp_path, capsys):
    from npas.service.search.driver import search
    from npas.service.search.launch import Launch

    space = _space(tmp_path)
    recipe_path = tmp_path / "search-recipe.yaml"
    recipe_path.write_text(Recipe.from_dict(RECIPE).to_yaml())
    url = f"sqlite:///{tmp_path}/npas.db"
    search(npas.load_space(tmp_path / "narrow.yaml"), trials=1, study="s", storage=url, recipe=str(recipe_path),
           sampler="random", repeats=2, launch=Launch(workers=1, early_stop=False))
    study = optuna.load_study(study_name="s", storage=url)
    (trial,) = [t for t in study.trials if t.user_attrs.get(TrialAttr.STATUS) == "ok"]
    export = tmp_path / "best.yaml"
    assert main(["export", "s", "--storage", url, "--pick", f"trial={trial.number}", "--out", str(export)]) == 0
    read = read_allocation_file(export)
    assert read.reference == space.reference_chassis and read.cfg.chassis.d_model < read.reference.d_model
    recipe_file = tmp_path / "trial-recipe.yaml"
    recipe_file.write_text(Recipe.from_dict(yaml.safe_load(export.read_text())["recipe"]).to_yaml())
    out = tmp_path / "trained"
    assert main(["train", str(export), "--recipe", str(recipe_file), "--out", str(out), "--device", "cpu"]) == 0
    first_seed = trial.user_attrs[TrialAttr.SEED_LOSSES][0]
    assert json.loads((out / "metrics.json").read_text())["result"]["val_loss"] == first_seed
