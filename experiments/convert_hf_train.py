"""What one run of `experiments/convert.py --hf` trains, in a pool worker (`experiments/convert_hf.py` plans the
runs, keeps their cache and reports them; this module is the other side of the pool).

A worker is a spawned process, so a run arrives as plain data (`Cache.spec`) and everything else is
rebuilt here: the allocation, the recipes, the corpus (once per process), and for the converted arm
the dense model, read back from its cached Hugging Face directory.
"""

from __future__ import annotations

import functools
import math
import shutil
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from experiments.harness.version import stamp
from npas import ArchConfig, Recipe, reference_config


def with_lr(recipe: Recipe, mult: float, seed: int, steps: int | None = None) -> Recipe:
    """``recipe`` at ``mult`` x its rate (the floor with it: `Recipe.with_lr_factor`), on ``seed``, cut to ``steps``."""
    out = Recipe.from_dict({**recipe.with_lr_factor(mult).to_dict(), "seed": seed})
    return out if steps is None else out.with_steps(steps)


@functools.cache
def _corpus(val_fraction: float, test_fraction: float) -> Any:
    from npas import load_corpus

    return load_corpus(None, val_fraction, test_fraction)


def train_job(spec: dict[str, Any]) -> dict[str, Any]:
    """One run, in a pool worker: a spawned process, so everything arrives as plain data (`Cache.spec`)
    and is rebuilt here. One torch thread: the pool runs one worker per core. An exception comes back
    as a record with status "error", which is not cached (the round loop reports it and stops)."""
    torch.set_num_threads(1)
    t = time.perf_counter()
    try:
        return _train_dense(spec) if spec["arm"] == "dense" else _train_arm(spec)
    except Exception as err:  # a broken run must not take the pool's finished runs with it
        return {"arm": spec["arm"], "mult": spec["mult"], "seed": spec["seed"], "steps": spec["steps"],
                "status": "error", "val_loss": None, "wall_s": time.perf_counter() - t,
                "failure_reason": f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=4)}"[:2000]}


def _device(spec: dict[str, Any]) -> torch.device:
    return torch.device(spec["device"] or ("cuda" if torch.cuda.is_available() else "cpu"))


def _test_loss(model: torch.nn.Module, corpus: Any, recipe: Recipe, dev: torch.device) -> float | None:
    from npas.training.proxy import eval_batches, evaluate

    loss = evaluate(model, eval_batches(corpus, recipe, split="test"), dev, recipe)
    return loss if math.isfinite(loss) else None


def _train_arm(spec: dict[str, Any]) -> dict[str, Any]:
    """One arm's run: the converted arm reads the cached dense model back (`read_hf_dir`), converts it
    (`convert_model`, seeded, MLP widths refit on calibration text) and uptrains; the scratch arms train
    the allocation from the recipe's fresh init."""
    from npas import convert_model, read_hf_dir
    from npas.conversion.calibration import calibration_ids
    from npas.training.forks import train_model
    from npas.training.proxy import eval_batches, evaluate

    cfg = ArchConfig.from_json(spec["config"])
    uptrain = Recipe.from_dict(spec["uptrain"])
    recipe = with_lr(uptrain, spec["mult"], spec["seed"], spec["steps"])
    corpus = _corpus(uptrain.val_fraction, uptrain.test_fraction)
    dev = _device(spec)
    init, converted = None, {}
    if spec["arm"] == "converted":
        ck = read_hf_dir(spec["dense_dir"])
        conv = convert_model(ck.model, cfg, seed=spec["seed"], calibration=calibration_ids(corpus, uptrain.seq_len))
        init = {k: v.clone() for k, v in conv.model.state_dict().items()}
        # what conversion cost before any uptraining (one pass over the validation batches; a diagnostic)
        converted = {"converted_val_loss": evaluate(conv.model.to(dev), eval_batches(corpus, recipe), dev, recipe)}
    model, res = train_model(cfg, recipe, corpus, device=dev, init_state=init)
    return {"arm": spec["arm"], "mult": spec["mult"], "seed": spec["seed"], "steps": spec["steps"], "lr": recipe.lr,
            "status": res.status, "val_loss": res.val_loss, **converted,
            "test_loss": _test_loss(model, corpus, recipe, dev) if res.status == "ok" else None,
            "failure_reason": res.failure_reason, "steps_done": res.steps_done, "wall_s": res.wall_s,
            "tokens_per_s": res.tokens_per_s, "device": res.device, "code_version": spec["code_version"],
            **stamp(recipe, cfg)}


def _train_dense(spec: dict[str, Any]) -> dict[str, Any]:
    """The dense reference: trained, written by `write_hf` (via a temporary folder, renamed into place,
    so a killed run never leaves a half-written model under the cached name), read back with
    `read_hf_dir` and scored on the uptraining's validation batches (the arms' seed-0 batches)."""
    from npas import read_hf_dir, write_hf
    from npas.training.forks import train_model
    from npas.training.proxy import eval_batches, evaluate

    t = time.perf_counter()
    dense, uptrain = Recipe.from_dict(spec["dense"]), Recipe.from_dict(spec["uptrain"])
    ref = reference_config(ArchConfig.from_json(spec["config"]).chassis)
    corpus = _corpus(dense.val_fraction, dense.test_fraction)
    dev = _device(spec)
    model, res = train_model(ref, dense, corpus, device=dev)
    rec = {"arm": "dense", "steps": dense.steps, "lr": dense.lr, "status": res.status,
           "train_val_loss": res.val_loss, "failure_reason": res.failure_reason, "steps_done": res.steps_done,
           "device": res.device, "code_version": spec["code_version"], **stamp(dense, ref)}
    if res.status != "ok":
        return {**rec, "val_loss": None, "wall_s": time.perf_counter() - t}
    final = Path(spec["dense_dir"])
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    written = write_hf(model.to("cpu"), ref, tmp, corpus.tokenizer)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    ck = read_hf_dir(final)
    val = evaluate(ck.model.to(dev), eval_batches(corpus, uptrain), dev, uptrain)
    return {**rec, "val_loss": val, "test_loss": _test_loss(ck.model, corpus, uptrain, dev),
            "hf_dir": final.name, "hf_kind": written["kind"], "params": written["params"], "bytes": written["bytes"],
            "wall_s": time.perf_counter() - t}
