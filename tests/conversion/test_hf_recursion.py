"""A Hugging Face LLaMA converts into a recursion allocation (per-token depth) the way a dense npas model
does: the shared stack from the dense layers as tying makes it, the routers set so every token takes
every pass. Without the gate the converted model's logits are the tied conversion's and what it writes
reloads to them; a sigmoid gate (sigmoid(0) = 0.5 at the zeroed router) halves each pass's update until
training moves it, and the provenance says so. (Writing one back out as `--format hf` is refused: the
round-three input corpus.)"""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("transformers")

from npas.allocation.config import ArchConfig  # noqa: E402
from npas.allocation.recursion import RecursionSpec  # noqa: E402
from npas.allocation.recursion_allocation import recursion_config  # noqa: E402
from npas.allocation.transformer import build_model, load_weights  # noqa: E402
from npas.conversion.hf_convert import convert_hf_dir  # noqa: E402
from npas.conversion.hf_source import read_hf_dir  # noqa: E402
from tests.conversion.test_hf import ids, make_llama  # noqa: E402


def test_a_hugging_face_llama_converts_into_a_recursion_allocation(tmp_path):
    src = tmp_path / "src"
    make_llama(src, layers=4)
    source = read_hf_dir(src).cfg
    mor = recursion_config(source.chassis, RecursionSpec(steps=2, stack=1, first=1, last=1, capacities=(1.0, 0.5),
                                                         gate="none"))
    assert mor.chassis.family == "llama" and mor.block_of_layer == (0, 1, 1, 2)
    converted = convert_hf_dir(src, mor, tmp_path / "mor").conversion.model.eval()
    tied = convert_hf_dir(src, dataclasses.replace(mor, recursion=None), tmp_path / "tied").conversion.model.eval()
    x = ids()
    with torch.no_grad():
        want = tied(x)[0]
        assert torch.equal(converted(x)[0], want)  # the causal rule keeps every token at every pass
        assert converted.recursion.active_share.tolist() == [1.0, 1.0]
        assert not torch.equal(want, build_model(mor).eval()(x)[0])  # the weights came from the checkpoint
    text = (tmp_path / "mor" / "config.yaml").read_text()
    written = ArchConfig.from_yaml(text)
    assert written.recursion == mor.recursion
    model = build_model(written).eval()
    load_weights(model, tmp_path / "mor" / "model.safetensors", text)
    with torch.no_grad():
        assert torch.equal(model(x)[0], want)


def test_a_sigmoid_gated_conversion_says_its_passes_start_halved(tmp_path):
    src = tmp_path / "src"
    make_llama(src, layers=4)
    source = read_hf_dir(src).cfg
    spec = RecursionSpec(steps=2, stack=1, first=1, last=1, capacities=(1.0, 0.5))
    assert spec.gate == "sigmoid"  # the default, what the spaces mostly sample
    res = convert_hf_dir(src, recursion_config(source.chassis, spec), tmp_path / "mor")
    line = next(x for x in res.conversion.provenance.lines() if "recursion.router" in x)
    assert "starts halved" in line and "gate: none" in line
    ungated = convert_hf_dir(src, recursion_config(source.chassis, dataclasses.replace(spec, gate="none")),
                             tmp_path / "none")
    assert "halved" not in next(x for x in ungated.conversion.provenance.lines() if "recursion.router" in x)
