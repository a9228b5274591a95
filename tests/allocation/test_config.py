from __future__ import annotations

import json

import pytest

import npas
from npas.allocation.config import ArchConfig, Bank, Chassis, reference_config
from npas.errors import ConfigError, NpasError

CH = Chassis(vocab_size=68, context=32, d_model=32, n_layers=4, n_heads=4, d_ff=64, activation="swiglu")


def pooled() -> ArchConfig:
    return ArchConfig(
        chassis=CH, mlp_widths=(96, 64, 48, 32), block_of_layer=(0, 1, 0, 1), untied_norms=False,
        lora_attn=(0, 2, 2, 0), lora_mlp=(4, 0, 0, 4),
        banks=(Bank(((0, "attn_q"), (1, "attn_q"), (0, "attn_v")), "template_mix", size=1000, templates=3),
               Bank(((0, "mlp_down"), (1, "mlp_down")), "slice", size=4000)),
    )


def test_yaml_and_json_round_trip_is_lossless():
    cfg = pooled()
    assert ArchConfig.from_yaml(cfg.to_yaml()) == cfg
    assert ArchConfig.from_json(cfg.to_json()) == cfg
    assert ArchConfig.from_yaml(cfg.to_yaml()).hash == cfg.hash


def test_hash_is_stable_and_content_addressed():
    # a literal: the same allocation hashes the same on any machine and across releases of this schema
    assert reference_config(CH).hash == "079dd3d81eecd4db"  # schema 2 (schema 1: 3c1966d8c08eef29)
    assert pooled().hash != reference_config(CH).hash
    other = ArchConfig.from_dict({**pooled().to_dict(), "mlp_widths": [96, 64, 48, 33]})
    assert other.hash != pooled().hash


def test_canonical_norms_when_nothing_is_shared():
    a = ArchConfig(chassis=CH, mlp_widths=(64,) * 4, block_of_layer=(0, 1, 2, 3), untied_norms=False)
    assert a == reference_config(CH)


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"mlp_widths": [64, 64]}, "one entry per layer"),
        ({"block_of_layer": [1, 0, 1, 0]}, "order of first use"),
        ({"mlp_widths": [64, 0, 64, 64]}, "must be >= 1"),
        ({"dtype": "float8"}, "dtype"),
        ({"chassis": {**CH.__dict__, "n_heads": 5}}, "does not divide"),
        ({"banks": [{"members": [[0, "attn_k"]], "generator": "tie", "size": 5}]}, "needs size >="),
        ({"banks": [{"members": [[0, "mlp_nope"]], "generator": "slice", "size": 5}]}, "not a block slot"),
        ({"bogus": 1}, "unknown allocation keys"),
    ],
)
def test_invalid_allocations_name_the_problem(change, fragment):
    d = json.loads(reference_config(CH).to_json())
    d.update(change)
    with pytest.raises(ConfigError, match=fragment) as info:
        ArchConfig.from_dict(d)
    assert isinstance(info.value, NpasError)


def test_bad_yaml_is_a_config_error():
    with pytest.raises(ConfigError, match="does not parse"):
        ArchConfig.from_yaml("chassis: [unclosed")


def v1(**change) -> dict:
    """A schema-1 allocation as npas 699cb4d wrote it: fused attn_qkv (3d x d) and attn_out slots."""
    d = {"chassis": {**CH.__dict__}, "mlp_widths": [64, 64, 64, 64], "block_of_layer": [0, 1, 0, 1],
         "banks": [{"members": [[0, "attn_qkv"], [1, "attn_qkv"], [0, "attn_out"]], "generator": "slice",
                    "size": 2000, "templates": 1},
                   {"members": [[0, "mlp_up"], [1, "attn_qkv"]], "generator": "tie", "size": 3 * 32 * 32}],
         "lora_attn": [0, 0, 0, 0], "lora_mlp": [0, 0, 0, 0], "untied_norms": True, "dtype": "float32",
         "version": 1}
    d.update(change)
    return d


def test_schema_1_loads_as_schema_2_with_the_same_parameter_count():
    from npas.allocation.budget import stored_params

    bad = v1()  # attn_qkv in two banks is not a valid v1 allocation: keep one member per slot
    bad["banks"][1]["members"] = [[0, "mlp_up"], [1, "mlp_up"]]
    cfg = ArchConfig.from_dict(bad)
    assert cfg.version == 2
    assert cfg.banks[0].members == ((0, "attn_q"), (0, "attn_k"), (0, "attn_v"), (1, "attn_q"), (1, "attn_k"),
                                    (1, "attn_v"), (0, "attn_o"))
    # 17776 is what the schema-1 code (699cb4d) counts and builds for this file: embeddings and ln_f
    # 68*32 + 32*32 + 32, 4 layers x 2 norms x 32, block 1's attn_out and both blocks' mlp_gate and
    # mlp_down direct, and the two banks' sizes
    assert stored_params(cfg) == 68 * 32 + 32 * 32 + 32 + 4 * 2 * 32 + 32 * 32 + 4 * 64 * 32 + 2000 + 3072 == 17776
    assert npas.build_model(cfg).num_params() == 17776
    assert ArchConfig.from_yaml(cfg.to_yaml()) == cfg  # and it writes itself back as schema 2


@pytest.mark.parametrize("change, fragment", [
    ({"banks": [{"members": [[0, "attn_qkv"], [1, "attn_qkv"]], "generator": "template_mix", "size": 100,
                 "templates": 2}]}, "set version: 2"),
    ({"banks": [], "lora_attn": [0, 4, 0, 4]}, "set version: 2"),
    ({"version": 3}, "not a schema version"),
])
def test_schema_1_that_cannot_keep_its_count_is_refused_with_the_fix(change, fragment):
    with pytest.raises(ConfigError, match=fragment) as info:
        ArchConfig.from_dict(v1(**change))
    assert "\n" not in str(info.value)


def test_lora_scale_travels_with_the_allocation():
    cfg = ArchConfig.from_dict({**pooled().to_dict(), "lora_alpha": 8, "lora_scaling": "rslora"})
    assert (cfg.lora_alpha, cfg.lora_scaling) == (8.0, "rslora")
    assert ArchConfig.from_yaml(cfg.to_yaml()) == cfg and cfg.hash != pooled().hash
    assert cfg.lora_scale(4) == 8.0 / 2 and pooled().lora_scale(4) == 16.0 / 4  # default alpha 16, alpha / r
    # without LoRA ranks the scale computes nothing: it does not change the allocation or its hash
    plain = ArchConfig.from_dict({**reference_config(CH).to_dict(), "lora_alpha": 3.0, "lora_scaling": "rslora"})
    assert plain == reference_config(CH)


@pytest.mark.parametrize("change, fragment", [
    ({"untied_norms": "false"}, "untied_norms: must be true or false"),
    ({"untied_norms": 0}, "untied_norms: must be true or false"),
    ({"chassis": {**CH.__dict__, "d_model": "32"}}, "chassis.d_model: must be an integer"),
    ({"chassis": {**CH.__dict__, "d_model": 32.0}}, "chassis.d_model: must be an integer"),
    ({"chassis": {**CH.__dict__, "n_layers": True}}, "chassis.n_layers: must be an integer"),
    ({"chassis": {**CH.__dict__, "d_ff": -64}}, "chassis.d_ff: must be a positive integer"),
    ({"chassis": [68, 32]}, "chassis: must be a mapping"),
    ({"mlp_widths": [64, 64, 64, 64.0]}, "mlp_widths: must be a list of integers"),
    ({"mlp_widths": "64,64,64,64"}, "mlp_widths: must be a list of integers"),
    ({"mlp_widths": 64}, "mlp_widths: must be a list of integers"),
    ({"block_of_layer": [0, 1, True, 3]}, "block_of_layer: must be a list of integers"),
    ({"lora_mlp": [0, 1, 0, -2]}, "lora ranks must be >= 0"),
    ({"lora_alpha": "16"}, "lora_alpha: must be a number"),
    ({"lora_alpha": -1.0, "lora_mlp": [1, 1, 1, 1]}, "lora_alpha: must be a positive finite number"),
    ({"lora_scaling": "rs", "lora_mlp": [1, 1, 1, 1]}, "lora_scaling: 'rs' is not one of"),
    ({"dtype": ["float32"]}, "dtype: must be one of"),
    ({"version": "2"}, "version: '2' is not a schema version"),
    ({"version": 2.0}, "version: 2.0 is not a schema version"),
    ({"banks": {"members": []}}, "banks: must be a list"),
    ({"banks": [{"members": [[0, "attn_q"]], "generator": "tie", "size": "1024"}]}, r"banks\[0\].size: must be an integer"),
    ({"banks": [{"members": [[0, "attn_q"]], "generator": "tie", "size": 1024.0}]}, r"banks\[0\].size: must be an integer"),
    ({"banks": [{"members": [["0", "attn_q"]], "generator": "tie", "size": 1024}]}, r"banks\[0\].members: must be a list"),
    ({"banks": [{"members": [[0, 7]], "generator": "tie", "size": 1024}]}, r"banks\[0\].members: must be a list"),
    ({"banks": [{"members": [0, "attn_q"], "generator": "tie", "size": 1024}]}, r"banks\[0\].members: must be a list"),
    ({"banks": [{"members": [[0, "attn_q"]], "generator": ["tie"], "size": 1024}]}, r"banks\[0\].generator: must be"),
    ({"banks": [{"members": [[0, "attn_q"]], "generator": "tile", "size": -5}]}, "size and templates must be >= 1"),
    ({"banks": [{"members": [[0, "attn_q"]], "generator": "tile", "size": 5, "templates": True}]},
     r"banks\[0\].templates: must be an integer"),
    ({"banks": [{"members": [[0, "attn_q"]], "generator": "tile", "size": 5, "extra": 1}]}, r"banks\[0\]: must be a mapping"),
])
def test_wrongly_typed_fields_are_refused_not_coerced(change, fragment):
    d = json.loads(pooled().to_json())
    d.update(change)
    with pytest.raises(ConfigError, match=fragment) as info:
        ArchConfig.from_dict(d)
    assert "\n" not in str(info.value)


def test_every_wrongly_typed_field_is_named_at_once():
    d = {**json.loads(pooled().to_json()), "untied_norms": "no", "mlp_widths": [1.5] * 4, "lora_alpha": None}
    with pytest.raises(ConfigError) as info:
        ArchConfig.from_dict(d)
    assert all(k in str(info.value) for k in ("untied_norms", "mlp_widths", "lora_alpha"))
