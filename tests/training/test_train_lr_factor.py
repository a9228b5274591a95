"""A trial's located learning-rate factor travels with its export (issue #35 item 1): `npas export` writes
`lr_factor`, `npas train` applies it as a factor of the recipe's fair rate for every parameter group
(reproducing a WSD trial's climb at that factor bit for bit on CPU), `--lr-factor` overrides it, and an
export without one trains exactly as before (factor 1)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import optuna
import pytest
import torch
import yaml
from torch.optim.optimizer import register_optimizer_step_pre_hook

import npas
from npas.allocation.config import ArchConfig, Chassis
from npas.presentation.cli import main
from npas.service.export.exporter import write_export
from npas.service.study.record import Constraint, StudyAttr, TrialAttr
from npas.training import climb, located_rate
from npas.training.data import load_corpus, load_known_corpus
from npas.training.parameterization import optimizer_groups
from npas.training.recipe import Recipe
from npas.training.train import load_start, read_allocation_file, read_metrics, train_allocation

SPACE = """name: small
chassis: {vocab_size: 68, context: 16, d_model: 32, n_layers: 2, n_heads: 2, d_ff: 64}
budget: 0.5x
fit: {width: all}
recipe: smoke
knobs:
  tying: {mode: [none, all]}
"""
# rungs 8 and 16 (a fork at 8, the run's own decay at 16): a located trial's climb
WSD = {"name": "wsd-lr", "seq_len": 16, "batch_size": 4, "steps": 16, "lr": 1e-2, "min_lr": 1e-3,
       "warmup_steps": 2, "eval_every": 4, "eval_batches": 1, "seed": 3, "threads": 1, "schedule": "wsd",
       "horizon": 16, "rungs": [8, 16]}


def _space(tmp_path: Path):
    path = tmp_path / "small.yaml"
    path.write_text(SPACE)
    return npas.load_space(path).bind(vocab_size=load_corpus().vocab_size)


def _candidate(space) -> ArchConfig:
    trial = optuna.create_study().ask()
    cfg = space.sample(trial, fixed={"tying": "none"}).config
    assert cfg is not None and cfg.chassis.d_model < space.reference_chassis.d_model  # multipliers != 1
    return cfg


def _corpus(recipe: Recipe):
    stored = load_corpus()
    return stored, load_known_corpus(None, recipe.val_fraction, recipe.test_fraction, stored.fingerprint,
                                     stored.tokenizer.to_json())


def _study(space, cfg: ArchConfig, recipe: Recipe, loss: float, factor: float | None) -> optuna.Study:
    stored = load_corpus()
    study = optuna.create_study(directions=["minimize", "minimize"])
    for k, v in {StudyAttr.SPACE_TEXT: space.text, StudyAttr.SPACE_SOURCE: space.source,
                 StudyAttr.OVERRIDES: dict(space.overrides), StudyAttr.OBJECTIVES: ["val_loss", "train_memory_bytes"],
                 StudyAttr.RECIPE: recipe.to_dict(), StudyAttr.FINGERPRINT: stored.fingerprint,
                 StudyAttr.TOKENIZER_JSON: stored.tokenizer.to_json()}.items():
        study.set_user_attr(k, v)
    acc = npas.count(cfg)
    attrs = {TrialAttr.ALLOC: cfg.to_dict(), TrialAttr.HASH: cfg.hash, TrialAttr.STATUS: "ok",
             TrialAttr.ACCOUNTING: acc.to_dict(), TrialAttr.FIDELITY: recipe.steps,
             TrialAttr.MAX_FIDELITY: recipe.steps}
    if factor is not None:
        attrs.update({TrialAttr.LR_FACTOR: factor, TrialAttr.LR_GRID_STEPS: 24})
    study.add_trial(optuna.trial.create_trial(values=[loss, acc.train_memory_bytes], user_attrs=attrs,
                                              constraints={Constraint.BUDGET: -1.0, Constraint.FIDELITY: 0.0}))
    return study


def _climb_loss(space, cfg, recipe, corpus, factor: float) -> float:
    """The trial's run as the ladder trains it: a climb at the located factor, to the top rung T."""
    reference = Chassis(**dataclasses.asdict(space.reference_chassis))  # the runner's payload, round-tripped
    c = climb.start(cfg, recipe, corpus, device="cpu", reference=reference, lr_factor=factor)
    return c.climb()[recipe.steps]


def _recipe_file(export: Path, tmp_path: Path) -> Path:
    path = tmp_path / "trial-recipe.yaml"  # the trial's recipe and seed, as the export records them
    path.write_text(Recipe.from_dict(yaml.safe_load(export.read_text())["recipe"]).to_yaml())
    return path


def test_train_of_an_export_at_lr_factor_2_reproduces_the_trials_climb_bitwise(tmp_path, capsys):
    space = _space(tmp_path)
    cfg, recipe = _candidate(space), Recipe.from_dict(WSD)
    _, corpus = _corpus(recipe)
    at2, at1 = _climb_loss(space, cfg, recipe, corpus, 2.0), _climb_loss(space, cfg, recipe, corpus, 1.0)
    assert at2 != at1  # the premise: the factor moves the loss at T
    study = _study(space, cfg, recipe, at2, 2.0)
    export = tmp_path / "best.yaml"
    doc = write_export(study, export, "trial=0")
    assert doc["lr_factor"] == 2.0 and read_allocation_file(export).lr_factor == 2.0
    assert "lr_factor 2 x the recipe's fair rate" in export.read_text().splitlines()[1]
    recipe_file = _recipe_file(export, tmp_path)

    out = tmp_path / "trained"
    assert main(["train", str(export), "--recipe", str(recipe_file), "--out", str(out), "--device", "cpu"]) == 0
    assert "at lr_factor 2 x its fair rate (located by the search)" in capsys.readouterr().out
    metrics = read_metrics(out)
    assert metrics["result"]["val_loss"] == at2  # bit for bit: the climb's loss at T
    assert metrics["result"]["rung_losses"]["16"] == at2
    assert metrics["lr_factor"] == 2.0 and metrics["recipe"]["lr"] == WSD["lr"]  # the recipe as named, and the factor
    assert load_start(out).lr_factor == 2.0  # continuing the directory keeps its rate

    # --lr-factor overrides the export's: at 1 it is the trial's recipe at its fair rate
    over = tmp_path / "at1"
    assert main(["train", str(export), "--recipe", str(recipe_file), "--out", str(over), "--device", "cpu",
                 "--lr-factor", "1"]) == 0
    assert read_metrics(over)["result"]["val_loss"] == at1
    assert "lr_factor" not in read_metrics(over)


def test_an_export_without_lr_factor_exports_and_trains_as_before(tmp_path):
    space = _space(tmp_path)
    cfg, recipe = _candidate(space), Recipe.from_dict(WSD)
    _, corpus = _corpus(recipe)
    at1 = _climb_loss(space, cfg, recipe, corpus, 1.0)
    export = tmp_path / "old.yaml"
    doc = write_export(_study(space, cfg, recipe, at1, None), export, "trial=0")
    assert "lr_factor" not in doc and "lr_factor" not in export.read_text()
    assert read_allocation_file(export).lr_factor == 1.0
    out = tmp_path / "trained"
    assert main(["train", str(export), "--recipe", str(_recipe_file(export, tmp_path)), "--out", str(out),
                 "--device", "cpu"]) == 0
    metrics = read_metrics(out)
    assert metrics["result"]["val_loss"] == at1 and "lr_factor" not in metrics


@pytest.mark.parametrize("bad", ["-1", "0", "nan", "inf", "fast"])
def test_a_bad_lr_factor_is_refused_in_one_line(tmp_path, capsys, bad):
    space = _space(tmp_path)
    cfg = _candidate(space)
    export = tmp_path / "best.yaml"
    export.write_text(yaml.safe_dump({"allocation": cfg.to_dict()}))
    out = tmp_path / "never"
    assert main(["train", str(export), "--steps", "1", "--out", str(out), "--lr-factor", bad]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--lr-factor" in err and "> 0" in err
    assert not out.exists()
    if bad in ("-1", "0"):  # the same number stored in an export: refused before anything is written
        export.write_text(yaml.safe_dump({"allocation": cfg.to_dict(), "lr_factor": float(bad)}))
        assert main(["train", str(export), "--steps", "1", "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "lr_factor must be a finite number > 0" in err
        assert not out.exists()


def test_the_optimizer_sees_the_factor_times_the_fair_rule_in_every_group_mid_schedule(tmp_path):
    """Under a cosine recipe too (no climb there): every group's rate at a mid-schedule step is
    factor x the schedule's rate x the group's fair multiplier."""
    space = _space(tmp_path)
    cfg = _candidate(space)
    cosine = {k: v for k, v in WSD.items() if k not in ("schedule", "rungs", "horizon")}
    recipe = Recipe.from_dict({**cosine, "steps": 12})
    _, corpus = _corpus(recipe)
    factor, mid = 3.0, 7  # not a power of two: the rate is right to rounding, the grid's factors are exact
    seen: list[list[float]] = []
    handle = register_optimizer_step_pre_hook(
        lambda opt, args, kwargs: seen.append([g["lr"] for g in opt.param_groups]))
    try:
        train_allocation(cfg, recipe, corpus, tmp_path / "out", device="cpu", reference=space.reference_chassis,
                         lr_factor=factor)
    finally:
        handle.remove()
    assert len(seen) == recipe.steps
    torch.manual_seed(0)
    mults = [g["lr_mult"] for g in optimizer_groups(npas.build_model(cfg), 0.1, "fair", space.reference_chassis)]
    assert len(set(mults)) > 1  # the fair rule gives the groups different rates: each must keep its own
    assert seen[mid] == pytest.approx([factor * recipe.lr_at(mid) * m for m in mults], rel=1e-12)
    assert read_metrics(tmp_path / "out")["lr_factor"] == factor


def test_every_factor_the_located_rate_grid_can_choose_is_a_power_of_two():
    """What makes `npas train`'s recipe-level factor bit-for-bit the climb's per-group one."""
    for f in (*located_rate.DEFAULT_GRID, located_rate.STEP):
        assert math.frexp(f)[0] == 0.5, f
