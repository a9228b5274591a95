"""A damaged ladder checkpoint, as a resumed trial reads it: one `DataError` naming the file, never a
KeyError or AttributeError from inside the restore (part of the round-three input corpus,
tests/presentation/test_inputs_round3.py, which counts these cases with its own)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import npas
from tests.conftest import ROOT

TINY = str(ROOT / "tests" / "data" / "tiny.yaml")


def _state(change: Callable[[dict], Any]) -> Callable[[Path], None]:
    def damage(d: Path) -> None:
        state = json.loads((d / "state.json").read_text())
        change(state)
        (d / "state.json").write_text(json.dumps(state))

    return damage


CHECKPOINT_CASES: dict[str, tuple[Callable[[Path], Any], str]] = {
    "state-a-json-list": (lambda d: (d / "state.json").write_text("[]"), "holds a JSON list"),
    "state-without-its-recipe": (_state(lambda s: s.pop("recipe")), "lacks recipe"),
    "state-without-rung-losses": (_state(lambda s: s.pop("rung_losses")), "lacks rung_losses"),
    "state-not-json": (lambda d: (d / "state.json").write_text("{step: 8"), "not valid JSON"),
    "state-missing": (lambda d: (d / "state.json").unlink(), "is missing"),
    "state-other-format": (_state(lambda s: s.update(format=99)), "checkpoint format 99"),
    "tensors-truncated": (lambda d: (d / "tensors.safetensors").write_bytes(b"\0" * 12), "the checkpoint is damaged"),
    "other-allocation": (_state(lambda s: s.update(config_hash="0123456789ab")), "not of"),
}
CHECKPOINT_FAILED_BEFORE = {"state-a-json-list", "state-without-its-recipe", "state-without-rung-losses"}


@pytest.fixture(scope="module")
def climb_checkpoint(tmp_path_factory):
    """A ladder climb of the tiny reference, paused at its first rung and saved (a few steps)."""
    from npas.allocation.config import reference_config
    from npas.training import checkpoint, climb
    from npas.training.data import load_corpus
    from npas.training.recipe import Recipe

    recipe = Recipe(name="wsd-r3", seq_len=16, batch_size=2, steps=8, lr=1e-2, min_lr=1e-3, warmup_steps=1,
                    eval_every=4, eval_batches=1, threads=1, schedule="wsd", horizon=8, rungs=(4, 8))
    cfg = reference_config(npas.load_space(TINY).reference_chassis)
    corpus = load_corpus()
    paused = climb.start(cfg, recipe, corpus, device="cpu")
    paused.step_up()
    d = checkpoint.save(paused, tmp_path_factory.mktemp("climb") / "ckpt")
    return d, cfg, corpus


@pytest.mark.parametrize("name", list(CHECKPOINT_CASES))
def test_a_damaged_ladder_checkpoint_is_one_data_error(name: str, climb_checkpoint, tmp_path):
    """What a resumed ladder trial reports as its failure: a DataError naming the file, never a KeyError
    or AttributeError from inside the restore."""
    from npas.errors import DataError
    from npas.training import checkpoint

    source, cfg, corpus = climb_checkpoint
    d = tmp_path / "ckpt"
    shutil.copytree(source, d)
    damage, fragment = CHECKPOINT_CASES[name]
    damage(d)
    with pytest.raises(DataError) as info:
        checkpoint.load(d, cfg, corpus, device="cpu")
    assert fragment in str(info.value) and "\n" not in str(info.value), str(info.value)
