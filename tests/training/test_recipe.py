"""Recipe files: the shipped ones, name resolution, one-pass validation, and the LR schedule."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from npas.errors import ConfigError
from npas.training.recipe import Recipe, load_recipe, resolve_recipe
from tests.conftest import ROOT


def repo_root() -> Path:
    return ROOT

SHIPPED = ("smoke", "proxy", "long", "smoke-wsd", "ladder")


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_recipes_load_and_document_their_command(name):
    r = load_recipe(name)
    assert r.name == name
    text = (repo_root() / "trials" / f"{name}.yaml").read_text()
    first = text.splitlines()[0]
    assert first.startswith("# ")
    assert "npas " in text.split("\nname:")[0]  # the opening comment names the command that uses it
    assert r.warmup_steps <= r.steps and r.min_lr <= r.lr


def test_long_is_ten_times_proxy_and_defaults_match_proxy():
    proxy, long = load_recipe("proxy"), load_recipe("long")
    assert long.steps >= 10 * proxy.steps
    assert Recipe() == proxy  # the dataclass defaults are the default recipe
    assert load_recipe("smoke").steps < proxy.steps


def test_ladder_ranks_at_long_s_horizon_with_long_s_run():
    """`--recipe ladder` is the search whose top rung is the run `long` trains (its length, rate and
    warmup), on a WSD schedule so the ladder forks at horizon/16 and reads the front at T (the default
    experiments/ladder_orders.py chose)."""
    ladder, long = load_recipe("ladder"), load_recipe("long")
    assert ladder.schedule == "wsd" and long.schedule == "cosine"
    assert ladder.steps == ladder.horizon == long.steps
    assert ladder.fork_rungs() == (long.steps // 16, long.steps)
    assert (ladder.lr, ladder.min_lr, ladder.warmup_steps) == (long.lr, long.min_lr, long.warmup_steps)
    assert (ladder.seq_len, ladder.batch_size) == (long.seq_len, long.batch_size)
    assert ladder.warmup_steps < ladder.fork_rungs()[0]  # the first rung's fork starts after the warmup


def test_resolution_by_name_from_anywhere_and_cwd_first(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # the shipped recipe, which the checkout's trials/smoke.yaml links to
    assert resolve_recipe("smoke").samefile(repo_root() / "trials" / "smoke.yaml")
    (tmp_path / "trials").mkdir()
    (tmp_path / "trials" / "smoke.yaml").write_text("steps: 7\nwarmup_steps: 2\neval_every: 7\n")
    local = load_recipe("smoke")
    assert local.steps == 7 and local.name == "smoke"
    assert load_recipe(str(repo_root() / "trials" / "proxy.yaml")).name == "proxy"


def test_missing_recipe_lists_available(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"recipe 'smok' not found .*one of: ladder, long, proxy, smoke, smoke-wsd"):
        load_recipe("smok")
    with pytest.raises(ConfigError, match=r"recipe file .*nope\.yaml does not exist"):
        load_recipe(tmp_path / "nope.yaml")


def test_validation_reports_every_problem_at_once(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text(
        "lrr: 0.01\n"  # typo
        "seq_len: sixty\n"  # wrong type
        "steps: 100\n"
        "warmup_steps: 200\n"  # > steps
        "batch_size: 0\n"  # out of range
        "dtype: bf16\n"  # not a choice
        "betas: [0.9]\n"  # wrong length
        "min_lr: 1.0\n"  # > lr
        "val_fraction: 0.9\n"  # out of range
        "eval_every: true\n"  # bool is not an int
    )
    with pytest.raises(ConfigError) as err:
        load_recipe(p)
    lines = str(err.value).splitlines()
    assert lines[0].endswith("bad.yaml: 9 problems")
    body = "\n".join(lines[1:])
    for needle in (
        "unknown key 'lrr'; did you mean 'lr'?",
        "seq_len: expected an integer, got 'sixty'",
        "warmup_steps: must be <= steps (100), got 200",
        "batch_size: must be >= 1, got 0",
        "dtype: must be one of float32, bfloat16, got 'bf16'; did you mean 'bfloat16'?",
        "betas: expected two numbers",
        "min_lr: must be <= lr",
        "val_fraction: must be in (0, 0.5], got 0.9",
        "eval_every: expected an integer, got True",
    ):
        assert needle in body, needle
    assert len(lines) == 10  # a header, then one line per problem


def test_yaml_errors_and_non_mapping(tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("steps: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_recipe(bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_recipe(listy)


def test_round_trip_and_yaml11_scientific_notation():
    r = Recipe.from_dict({"name": "x", "lr": "3e-4", "min_lr": 0, "steps": 50, "warmup_steps": 5,
                          "betas": [0.8, 0.9]})
    assert r.lr == 3e-4 and isinstance(r.min_lr, float) and r.betas == (0.8, 0.9)
    assert Recipe.from_dict(r.to_dict()) == r
    assert Recipe.from_dict(r.to_dict()).to_dict() == r.to_dict()
    with pytest.raises(ConfigError, match="lr: must be > 0"):
        Recipe(lr=0.0)


def test_with_steps_keeps_recipe_valid():
    r = load_recipe("proxy").with_steps(10)
    assert r.steps == 10 and r.warmup_steps == 10 and r.eval_every == 10


def test_lr_schedule_warmup_then_cosine():
    r = Recipe(steps=100, warmup_steps=10, lr=1.0, min_lr=0.1)
    assert r.lr_at(0) == pytest.approx(0.1)
    assert r.lr_at(9) == pytest.approx(1.0)
    assert r.lr_at(10) == pytest.approx(1.0)
    assert r.lr_at(55) == pytest.approx(0.55)  # halfway through the decay: the mean of lr and min_lr
    assert r.lr_at(100) == pytest.approx(0.1)
    assert r.lr_at(1000) == pytest.approx(0.1)
    decay = [r.lr_at(s) for s in range(10, 101)]
    assert all(a >= b for a, b in zip(decay, decay[1:], strict=False))
    warm = [r.lr_at(s) for s in range(10)]
    assert all(b - a == pytest.approx(0.1) for a, b in zip(warm, warm[1:], strict=False))
    assert Recipe(steps=5, warmup_steps=0, lr=1.0, min_lr=0.0).lr_at(0) == 1.0
    assert math.isfinite(Recipe(steps=1, warmup_steps=1).lr_at(0))


def test_lr_factor_moves_the_whole_schedule_and_nothing_else():
    r = Recipe(steps=100, warmup_steps=10, lr=1.0, min_lr=0.1, seed=3)
    x2 = r.with_lr_factor(2.0)
    assert (x2.lr, x2.min_lr) == (2.0, 0.2)
    assert all(x2.lr_at(s) == pytest.approx(2 * r.lr_at(s)) for s in range(0, 101, 7))
    assert {k: v for k, v in x2.to_dict().items() if k not in ("lr", "min_lr")} == \
        {k: v for k, v in r.to_dict().items() if k not in ("lr", "min_lr")}
    assert r.with_lr_factor(1.0) == r


def test_repo_root_holds_the_package():
    assert (repo_root() / "npas" / "training" / "recipe.py").is_file()
    assert Path(repo_root() / "trials").is_dir()
    assert Path(repo_root() / "trials" / "smoke.yaml").is_file()


def test_split_and_parameterization_fields_are_validated():
    assert Recipe().test_fraction == 0.1 and Recipe().parameterization == "fair"
    assert Recipe(parameterization="uniform").parameterization == "uniform"
    with pytest.raises(ConfigError) as err:
        Recipe.from_dict({"test_fraction": 0.0, "parameterization": "fiar"})
    msg = str(err.value)
    assert "test_fraction: must be in (0, 0.5], got 0.0" in msg
    assert "parameterization: must be one of fair, uniform, got 'fiar'; did you mean 'fair'?" in msg
    with pytest.raises(ConfigError, match=r"val_fraction \+ test_fraction must be <= 0.5"):
        Recipe.from_dict({"val_fraction": 0.3, "test_fraction": 0.3})


def test_version_1_recipes_keep_their_single_learning_rate():
    old = {k: v for k, v in Recipe().to_dict().items() if k not in ("parameterization", "test_fraction")}
    assert Recipe.from_dict({**old, "version": 1}).parameterization == "uniform"  # as stored by older studies
    assert Recipe.from_dict({k: v for k, v in old.items() if k != "version"}).parameterization == "fair"
    assert Recipe.from_dict({**old, "version": 1, "parameterization": "fair"}).parameterization == "fair"
