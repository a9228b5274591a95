"""Search-space loading, validation (every problem at once), sampling and fitting."""

from __future__ import annotations

import subprocess
import sys

import optuna
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npas.allocation.layer_maps import taper_profile, tying_map
from npas.allocation.space_parser import load_space, parse_space
from npas.errors import NpasError, SpaceError
from tests.conftest import SPACES, space_refusal

GOOD = """
chassis: {vocab_size: 68, context: 64, d_model: 64, n_layers: 4, n_heads: 4, d_ff: 256}
budget: 0.5x
knobs:
  tying: {mode: [none, cycle], unique_blocks: 2}
"""


@pytest.mark.parametrize("path", SPACES, ids=lambda p: p.stem)
def test_shipped_spaces_load_and_open_with_their_command(path):
    space = load_space(path)
    first = path.read_text().splitlines()[:3]
    assert any(f"npas search search_spaces/{path.name}" in line for line in first)
    assert 0 < space.budget_params
    assert space.objectives[0] in ("val_loss", "val_bpc")


def test_every_problem_reported_at_once_with_suggestions():
    text = """
chassis: {vocab_size: 68, context: 64, d_model: 66, n_layers: 4, n_heads: 4, d_ff: 256, activatoin: gelu}
budget: 0.25y
objectives: [val_loss, memroy]
knobs:
  taperr: {schedule: cosine}
  tying: {mode: [cylce], unique_blocks: {low: 5, high: 2}}
  relaxation: {rank: [-1, 4]}
"""
    with pytest.raises(SpaceError) as info:
        parse_space(text, "bad.yaml")
    msg = str(info.value)
    assert msg.startswith("bad.yaml: 8 problems")
    for fragment in ["chassis.activatoin: unknown key", "did you mean 'activation'", "does not divide d_model=66",
                     "space.budget", "'memroy'", "knobs.taperr", "did you mean 'cycle'", "unique_blocks: 5 is out of range [1, 4]",
                     "knobs.relaxation.rank: -1 is out of range"]:
        assert fragment in msg, fragment
    assert isinstance(info.value, NpasError)


@pytest.mark.parametrize("text, fragment", [
    ("chassis: [1, 2", "YAML does not parse"),
    ("- a\n- b\n", "top level must be a mapping"),
    ("budget: 1x\n", "space.chassis: missing"),
    (GOOD.replace("0.5x", "5k"), "embeddings alone need"),
    (GOOD.replace("0.5x", "9k") + "fit: {width: mlp}\n", None),  # parses: infeasibility is per candidate, with a reason
])
def test_malformed_files(text, fragment):
    if fragment is None:
        space = parse_space(text)
        cand = space.sample(optuna.create_study().ask())
        assert not cand.feasible and "budget" in cand.reason
        return
    with pytest.raises(SpaceError, match=fragment):
        parse_space(text)


def test_missing_file():
    with pytest.raises(SpaceError, match="no such file"):
        load_space("search_spaces/nope.yaml")


def test_sampling_is_deterministic_and_define_by_run():
    space = parse_space(GOOD)
    a = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=5))
    b = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=5))
    for _ in range(6):
        ta, tb = a.ask(), b.ask()
        ca, cb = space.sample(ta), space.sample(tb)
        assert ca.config.hash == cb.config.hash
        # unique_blocks is only a parameter of trials whose tying needs it (conditional knobs)
        assert ("unique_blocks" in ta.params) is False  # fixed in the file, never suggested
        a.tell(ta, 0.0)
        b.tell(tb, 0.0)


def test_fixed_values_override_the_sampler():
    space = parse_space(GOOD)
    cand = space.sample(optuna.create_study().ask(), fixed={"tying": "cycle", "unique_blocks": 2})
    assert cand.config.block_of_layer == (0, 1, 0, 1)


@pytest.mark.parametrize("schedule", ["uniform", "linear", "cosine", "step", "reverse", "hourglass"])
@pytest.mark.parametrize("L", [1, 2, 5, 8])
def test_taper_profiles_have_mean_one(schedule, L):
    prof = taper_profile(schedule, L, 3.0)
    assert sum(prof) / L == pytest.approx(1.0)
    if schedule == "cosine" and L > 1:
        assert prof[0] == pytest.approx(1.5) and prof[-1] == pytest.approx(0.5)  # 1.5x -> 0.5x of d_ff
    if schedule == "reverse" and L > 1:
        assert prof[0] < prof[-1]


@pytest.mark.parametrize("mode, U, expected", [
    ("none", 0, (0, 1, 2, 3, 4, 5)),
    ("all", 0, (0,) * 6),
    ("sequential", 2, (0, 0, 0, 1, 1, 1)),
    ("cycle", 2, (0, 1, 0, 1, 0, 1)),
    ("middle_loop", 3, (0, 1, 1, 1, 1, 2)),
    ("middle_loop", 4, (0, 1, 2, 1, 2, 3)),
])
def test_tying_maps(mode, U, expected):
    assert tying_map(mode, 6, U) == expected


def test_baselines_fit_the_budget():
    space = load_space(SPACES[0])
    for name, vals in space.baselines().items():
        cand = space.candidate({**{k: kn.default for k, kn in space.chassis.items()}, **vals})
        assert cand.feasible, (name, cand.reason)
        assert 0.99 <= cand.fill <= 1.0


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "npas", *args], capture_output=True, text=True, timeout=120)


def test_cli_count_on_space_and_allocation(tmp_path):
    out = run_cli("count", str(SPACES[0]))
    assert out.returncode == 0, out.stderr
    assert "stored params" in out.stdout and "baseline narrow_untied" in out.stdout
    from npas.allocation.config import reference_config

    cfg = reference_config(load_space(SPACES[0]).reference_chassis)
    f = tmp_path / "a.yaml"
    f.write_text(cfg.to_yaml())
    out = run_cli("count", str(f), "--format", "json")
    assert out.returncode == 0, out.stderr
    assert '"stored_params": 1600128' in out.stdout and cfg.hash in out.stdout


def test_cli_bad_space_exits_2_with_every_problem(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("chassis: {vocab_size: 68, context: 64, d_model: 64, n_layers: 4, n_heads: 4, d_ff: 256}\n"
                 "budget: 1x\nknobs: {tying: {mode: [cylce]}, taper: {ratio: 0.5}}\n")
    out = run_cli("count", str(f))
    assert out.returncode == 2
    assert "2 problems" in out.stderr and "did you mean 'cycle'" in out.stderr
    assert "Traceback" not in out.stderr


BARE = "chassis: {vocab_size: 68, context: 64, d_model: 64, n_layers: 6, n_heads: 4, d_ff: 256}\nbudget: 0.5x\n"


@pytest.mark.parametrize("knobs", [
    "{taper: {schedule: cosine}}",
    "{tying: {mode: cycle}}",
    "{tying: {mode: middle_loop}, relaxation: {rank: 4}}",
    "{tying: {mode: sequential}, relaxation: {rank: 2, targets: mlp}, untied_norms: false}",
    "{pools: {enabled: true}}",
    "{pools: {enabled: true, generator: slice}}",
])
def test_sample_and_candidate_agree_on_defaults(knobs):
    # one knob table: a knob the file leaves out gets the same default whether a trial samples it or a
    # caller builds the candidate from the values the file does give (baselines, count, evidence)
    from npas.allocation.knob_table import BY_NAME, CHASSIS_KEYS

    space = parse_space(BARE + f"knobs: {knobs}\n")
    cand = space.sample(optuna.create_study().ask())
    given = {k: v for k, v in cand.values.items() if k in CHASSIS_KEYS or k in space.knobs}
    assert space.candidate(given).config == cand.config
    for name, v in cand.values.items():
        if name not in given and name in BY_NAME:
            assert v == BY_NAME[name].default_for(cand.values), name
    if "taper_ratio" in cand.values:
        assert cand.values["taper_ratio"] == 2.0  # the one taper_ratio default (was 1.0 in candidate)


def test_lora_alpha_and_scaling_are_fixed_settings_of_the_relaxation():
    text = BARE + "knobs: {tying: {mode: all}, relaxation: {rank: 4, alpha: 8, scaling: rslora}}\n"
    cfg = parse_space(text).sample(optuna.create_study().ask()).config
    assert (cfg.lora_alpha, cfg.lora_scaling, cfg.lora_mlp[0]) == (8.0, "rslora", 4)
    with pytest.raises(SpaceError) as info:
        parse_space(BARE + "knobs: {relaxation: {alpha: [8, 16], scaling: rs}}\n")
    assert "knobs.relaxation.alpha: takes one fixed value" in str(info.value)
    assert "knobs.relaxation.scaling: unknown value 'rs'" in str(info.value)


# ---- hardening: whatever load_space accepts, sample() turns into a Candidate --------------------------
def _knob_values(spec):
    """Hypothesis strategy for what a user might write for one knob: good values, near misses, junk."""
    from hypothesis import strategies as st

    if spec.allowed:
        scalar = st.sampled_from(list(spec.allowed))
    elif spec.kind is bool:
        scalar = st.booleans()
    else:
        scalar = st.one_of(st.integers(0, 9), st.sampled_from([0.5, 1.0, 2.5, 1024, -1]))
    rng = st.fixed_dictionaries({"low": st.integers(0, 4), "high": st.integers(0, 9)},
                                optional={"step": st.sampled_from([0, 1, 2, 0.5, -1]), "log": st.booleans()})
    return st.one_of(scalar, st.lists(scalar, min_size=1, max_size=3, unique_by=repr), rng)


def _space_texts():
    import yaml
    from hypothesis import strategies as st

    from npas.allocation.knob_table import KNOBS

    specs = [s for s in KNOBS if s.section != "chassis"]

    @st.composite
    def build(draw):
        knobs: dict = {}
        for spec in specs:
            if draw(st.booleans()):
                body = knobs if spec.section == "" else knobs.setdefault(spec.section, {})
                body[spec.key] = draw(_knob_values(spec))
        if draw(st.booleans()):
            knobs.setdefault("tying", {})["groups"] = draw(st.sampled_from([[[0, 1], [2, 3]], [[0, 2], [1], [3]]]))
        if draw(st.booleans()):
            knobs.setdefault("pools", {})["groups"] = draw(st.sampled_from([[[0, 1]], [[2, 3]], [[3], [0, 1]]]))
        layers = draw(st.sampled_from([4, [2, 4], {"low": 2, "high": 4}]))
        space = {"chassis": {"vocab_size": 20, "context": 16, "d_model": 16, "n_layers": layers, "n_heads": 2,
                             "d_ff": 32, "activation": draw(st.sampled_from(["gelu", "swiglu"]))},
                 "budget": draw(st.sampled_from(["0.3x", "1x", "2x"])), "knobs": knobs}
        return yaml.safe_dump(space)

    return build()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_space_texts(), seed=st.integers(0, 2**16))
def test_a_loaded_space_samples_without_raising(text, seed):
    try:
        space = parse_space(text)
    except SpaceError:
        return  # refused at load, with its reasons: fine
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    for _ in range(4):
        cand = space.sample(study.ask())  # anything but a Candidate here fails the test
        assert cand.feasible or (isinstance(cand.reason, str) and cand.reason)


def test_sample_turns_an_unforeseen_failure_into_a_sample_error(monkeypatch):
    from npas.errors import SampleError

    space = parse_space(GOOD)

    def broken(*args, **kwargs):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr("npas.allocation.space.fit_width", broken)
    with pytest.raises(SampleError, match="ZeroDivisionError: division by zero"):
        space.sample(optuna.create_study().ask())


@pytest.mark.parametrize("extra, fragment", [
    # each of these used to load and then raise inside sample(), or to crash or pass silently at load
    ("knobs: {tying: {mode: explicit, groups: [[0, 1], [2, 3]]}}\n", "n_layers is searched over [2, 3, 4]"),
    ("knobs: {pools: {enabled: true, rule: explicit, generator: template_mix, groups: [[5, 6]]}}\n",
     "block 6 does not exist"),
    ("knobs: {tying: {mode: cycle, unique_blocks: {low: 1, high: 4, step: 0.5}}}\n", "whole step >= 1, got 0.5"),
    ("knobs: {tying: {mode: cycle, unique_blocks: {low: 1, high: 4, step: -1}}}\n", "whole step >= 1, got -1"),
    ("knobs: {tying: {mode: cycle, unique_blocks: {low: 1, high: 4, step: 0}}}\n", "whole step >= 1, got 0"),
    ("knobs: {taper: {ratio: {low: 1.0, high: 4.0, step: 0.5, log: true}}}\n", "step and log cannot be combined"),
    ("knobs: {taper: {ratio: .nan}}\n", "not a finite number"),
    ("dtype: [float32]\n", "space.dtype: takes one fixed value"),
    ("fit: {max_width_scale: [2, 3]}\n", "fit.max_width_scale: takes one fixed value"),
    ("fit: {width: [mlp, all]}\n", "fit.width: takes one fixed value"),
    ("fit: {max_templates: 4}\nknobs: {pools: {templates: [2, 8]}}\n", "exceeds fit.max_templates=4"),
    ("objectives: [val_loss, val_loss]\n", "each objective once"),
    ("recipe: [proxy]\n", "space.recipe: must be text"),
])
def test_load_refuses_what_sampling_could_not_build(extra, fragment):
    text = ("chassis: {vocab_size: 68, context: 64, d_model: 64, n_layers: {low: 2, high: 4}, n_heads: 4, d_ff: 256}\n"
            "budget: 0.5x\n" + extra)
    err = space_refusal(text)
    assert fragment in str(err) and len(err.problems) == 1, err.problems


def test_budget_overflow_is_one_line_at_load_and_bind():
    from npas.errors import BudgetError

    with pytest.raises(SpaceError, match="space.budget: budget '1e400' is more than"):
        parse_space(GOOD.replace("0.5x", "1e400"))
    with pytest.raises(BudgetError, match="is more than"):
        parse_space(GOOD).bind(budget="1e400")


def test_conditional_knobs_are_suggested_only_when_they_apply():
    # define-by-run for real: unique_blocks is searched, yet a trial has it only when its tying uses it
    space = parse_space(GOOD.replace("unique_blocks: 2", "unique_blocks: {low: 2, high: 3}") +
                        "  relaxation: {rank: [0, 2], targets: [attn, mlp]}\n")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    modes = set()
    for _ in range(20):
        t = study.ask()
        cand = space.sample(t)
        study.tell(t, 0.0)
        mode = t.params["tying"]
        modes.add(mode)
        assert ("unique_blocks" in t.params) == (mode == "cycle")
        assert ("lora_rank" in t.params) == (mode == "cycle")  # relaxation applies to tied positions only
        assert ("lora_targets" in t.params) == bool(t.params.get("lora_rank"))
        if cand.feasible and mode == "cycle":
            assert cand.config.n_blocks == t.params["unique_blocks"]
    assert modes == {"none", "cycle"}


@pytest.mark.parametrize("path", SPACES, ids=lambda p: p.stem)
def test_baselines_fit_the_budget_in_every_shipped_space(path):
    space = load_space(path)
    assert set(space.baselines()) >= {"narrow_untied", "full_tying"}
    for name, vals in space.baselines().items():
        cand = space.candidate({**{k: kn.default for k, kn in space.chassis.items()}, **vals})
        assert cand.feasible, (path.stem, name, cand.reason)
        assert cand.fill <= 1.0 and (cand.fit.capped or cand.fill >= 0.99), (path.stem, name, cand.fill)


def test_explicit_tying_groups_and_explicit_pools():
    text = BARE + ("knobs:\n  tying: {mode: explicit, groups: [[0, 5], [1, 2], [3, 4]]}\n"
                   "  pools: {enabled: true, rule: explicit, generator: slice, groups: [[0, 1], [2]]}\n")
    cfg = parse_space(text).sample(optuna.create_study().ask()).config
    assert cfg.block_of_layer == (0, 1, 1, 2, 2, 0)
    # one bank per slot per group, members exactly the listed blocks, in slot order
    groups = sorted({tuple(b for b, _ in bank.members) for bank in cfg.banks})
    assert groups == [(0, 1), (2,)]
    assert len(cfg.banks) == 2 * 6  # two groups x (q, k, v, o, up, down)
    assert all(len({s for _, s in bank.members}) == 1 for bank in cfg.banks)
