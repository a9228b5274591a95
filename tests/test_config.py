from __future__ import annotations

import json

import pytest

from npas.allocation.config import ArchConfig, Bank, Chassis, reference_config
from npas.errors import ConfigError, NpasError

CH = Chassis(vocab_size=68, context=32, d_model=32, n_layers=4, n_heads=4, d_ff=64, activation="swiglu")


def pooled() -> ArchConfig:
    return ArchConfig(
        chassis=CH, mlp_widths=(96, 64, 48, 32), block_of_layer=(0, 1, 0, 1), untied_norms=False,
        lora_attn=(0, 2, 2, 0), lora_mlp=(4, 0, 0, 4),
        banks=(Bank(((0, "attn_qkv"), (1, "attn_qkv")), "template_mix", size=1000, templates=3),
               Bank(((0, "mlp_down"), (1, "mlp_down")), "slice", size=4000)),
    )


def test_yaml_and_json_round_trip_is_lossless():
    cfg = pooled()
    assert ArchConfig.from_yaml(cfg.to_yaml()) == cfg
    assert ArchConfig.from_json(cfg.to_json()) == cfg
    assert ArchConfig.from_yaml(cfg.to_yaml()).hash == cfg.hash


def test_hash_is_stable_and_content_addressed():
    # a literal: the same allocation hashes the same on any machine and across releases of this schema
    assert reference_config(CH).hash == "3c1966d8c08eef29"
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
        ({"banks": [{"members": [[0, "attn_qkv"]], "generator": "tie", "size": 5}]}, "needs size >="),
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
