"""Every sampler `npas search --sampler` offers models the space after its start-up trials.

The asks go through the same path as a search: the baselines enqueued first (`enqueue_baselines`),
then `Space.sample` with each baseline's fixed values (`baseline_fixed`). On a synthetic objective
whose optimum is one (taper, tying) pair, a modelling sampler's later asks hit the optimum far more
often than a random sampler's. With the baselines enqueued without parameters (as before), GP and
NSGA-II had an empty intersection search space and asked exactly like random.
"""

from __future__ import annotations

import tomllib
import warnings

import optuna
import pytest

from npas.allocation.space_parser import parse_space
from npas.presentation.cli import main
from npas.service.search.samplers import (
    baseline_fixed,
    enqueue_baselines,
    make_sampler,
    modelled_knobs,
    split_baseline,
)
from npas.service.study.record import TrialAttr
from tests.conftest import ROOT

SPACE = """
name: synth
chassis: {vocab_size: 68, context: 64, d_model: 32, n_layers: 4, n_heads: 4, d_ff: 96, activation: gelu}
budget: 1x
objectives: [val_loss, train_memory_bytes]
recipe: smoke
knobs:
  taper: {schedule: [uniform, linear, cosine, step, reverse, hourglass], ratio: {low: 1.0, high: 4.0}}
  tying: {mode: [none, all, sequential, cycle, middle_loop], unique_blocks: 2}
  pools: {enabled: [false, true], rule: by_type, banks: 1, generator: slice}
"""
# (trials, seeds): NSGA-II breeds from its second population (16 per generation); GP refits at every
# ask (seconds each on a loaded CPU) and hits the optimum in nearly every late ask, so one short run
RUNS = {"tpe": (48, (0, 1, 2)), "nsga2": (96, (0, 1, 2)), "gp": (24, (0,))}


def loss(values: dict) -> float:
    """Optimum at taper=cosine, tying=cycle, no pools: 1 in 60 of the (taper, tying, pools) cells."""
    return float(values["taper"] != "cosine") + float(values["tying"] != "cycle") + 0.5 * bool(values["pools"])


def hit_rate(sampler: str, seed: int, n: int) -> tuple[float, optuna.Study]:
    space = parse_space(SPACE, "synth")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study = optuna.create_study(directions=["minimize"] * 2, sampler=make_sampler(sampler, seed, 2))
        enqueue_baselines(study, space, TrialAttr.BASELINE)
        hits = 0
        for i in range(n):
            trial = study.ask()
            cand = space.sample(trial, fixed=baseline_fixed(trial, space, TrialAttr.BASELINE))
            value = loss(cand.values)
            hits += i >= n // 2 and value == 0.0
            study.tell(trial, [value, value + 1.0])  # memory follows loss: the front is the optimum
    return hits / (n - n // 2), study


@pytest.mark.parametrize("sampler", ["tpe", "gp", "nsga2"])
def test_sampler_asks_concentrate_on_the_optimum_unlike_random(sampler):
    n, seeds = RUNS[sampler]
    model = sum(hit_rate(sampler, s, n)[0] for s in seeds) / len(seeds)
    random = sum(hit_rate("random", s, n)[0] for s in (0, 1, 2)) / 3
    assert model >= random + 0.1, f"{sampler}: {model:.2f} of late asks at the optimum, random {random:.2f}"


@pytest.mark.parametrize("sampler", ["gp", "nsga2"])
def test_intersection_samplers_see_the_always_present_knobs(sampler):
    _, study = hit_rate(sampler, 0, 12)  # the 3 baselines and 8 start-up trials, then one modelled ask
    trial = study.trials[-1]
    assert {"taper", "tying", "pools"} <= set(study.sampler.infer_relative_search_space(study, trial))


def test_baselines_carry_their_values_as_params_and_build_the_same_allocations():
    space = parse_space(SPACE, "synth")
    study = optuna.create_study(directions=["minimize"] * 2)
    names = enqueue_baselines(study, space, TrialAttr.BASELINE)
    assert names == list(space.baselines())
    for name in names:
        trial = study.ask()
        assert trial.user_attrs[TrialAttr.BASELINE] == name
        new = space.sample(trial, fixed=baseline_fixed(trial, space, TrialAttr.BASELINE))
        old = space.sample(optuna.create_study().ask(), fixed=space.baselines()[name])  # every value fixed
        assert new.config == old.config
        assert {"taper", "tying", "pools"} <= set(trial.params)
        study.tell(trial, [1.0, 1.0])
    params, fixed = split_baseline(space, space.baselines()["narrow_untied"])
    assert params == {"taper": "uniform", "tying": "none", "pools": False}
    assert fixed == {"width_fit": "all", "kv_group": 1, "atom_slots": "none"}  # knobs this space does not search


def test_a_baseline_enqueued_without_params_keeps_all_its_values_fixed():
    space = parse_space(SPACE, "synth")
    study = optuna.create_study(directions=["minimize"] * 2)
    study.enqueue_trial({}, user_attrs={TrialAttr.BASELINE: "full_tying"})  # a study from before the change
    trial = study.ask()
    assert baseline_fixed(trial, space, TrialAttr.BASELINE) == space.baselines()["full_tying"]


def test_gp_needs_scipy_and_it_is_a_declared_dependency():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(d.split(">")[0].split("=")[0].strip() == "scipy" for d in deps)
    import scipy  # noqa: F401  (GPSampler imports it when it fits)


def test_cli_says_what_gp_samples_independently(tmp_path, capsys, monkeypatch):
    import npas.service.execution.session as runner

    def no_ray(*_a, **_k):
        raise RuntimeError("stop before Ray")

    monkeypatch.setattr(runner, "start_ray_early", no_ray)
    monkeypatch.chdir(tmp_path)
    space = tmp_path / "synth.yaml"
    space.write_text(SPACE)
    with pytest.raises(RuntimeError, match="stop before Ray"):
        main(["search", str(space), "--sampler", "gp", "--storage", f"sqlite:///{tmp_path}/x.db"])
    err = capsys.readouterr().err
    assert "--sampler gp models taper, tying, pools after 8 trials; taper_ratio" in err
    assert modelled_knobs(parse_space(SPACE, "synth")) == (["taper", "tying", "pools"], ["taper_ratio"])
