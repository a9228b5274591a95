"""Save a climbing WSD run between rungs and resume it elsewhere, bit for bit: no step trained twice.

A promotion ladder pauses most trials at a rung and resumes a few later, possibly in another worker
process or on another node. What decides the rest of a run is more than its weights: the optimizer's
moments and step counts, the data stream's position (its generator and the batch block it is
reading) and torch's global RNG. All of it is written to one directory:

  tensors.safetensors   model weights (fp32 masters), optimizer tensors, stream generator state and
                        current offset block, torch RNG state (and CUDA's, on a GPU)
  state.json            the step, the recipe, the optimizer's groups and scalar state, the stream's
                        block index, the rungs passed with their losses, the forks' steps, lr_factor

Safetensors and JSON only: no pickle, so a checkpoint from shared storage cannot run code on load.
JSON writes floats with ``repr``, which reads back to the same double, so hyperparameters and rung
losses round-trip exactly. ``load`` rebuilds the model from the allocation (the caller's ``cfg``) and
overwrites every tensor; a climb resumed from a checkpoint reaches the same losses at every later
rung as one that never stopped (tests/training/test_checkpoint.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from npas.errors import DataError
from npas.training.climb import Climb, recipe_threads
from npas.training.data import Corpus
from npas.training.forks import build
from npas.training.proxy import check_compatible, eval_batches, make_optimizer, pick_device
from npas.training.recipe import Recipe
from npas.training.trainer import Stream, Trainer

FORMAT = 1
TENSORS = "tensors.safetensors"
STATE = "state.json"


def _finite_or_none(v: float) -> float | None:
    return v if math.isfinite(v) else None


def save(climb: Climb, directory: str | Path) -> Path:
    """Write ``climb``'s whole state under ``directory`` (created); returns the directory. The JSON is
    written last, so a directory without it is an interrupted save and ``load`` refuses it."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    tr = climb.trainer
    tensors: dict[str, torch.Tensor] = {f"model.{k}": v.detach() for k, v in tr.model.state_dict().items()}
    opt = tr.opt.state_dict()
    scalars: dict[str, dict[str, Any]] = {}
    for idx, st in opt["state"].items():
        for name, v in st.items():
            if isinstance(v, torch.Tensor):
                tensors[f"opt.{idx}.{name}"] = v
            else:
                scalars.setdefault(str(idx), {})[name] = v
    tensors["stream.gen"] = tr.stream.gen.get_state()
    tensors["stream.offsets"] = tr.stream.offsets
    tensors["rng.cpu"] = torch.get_rng_state()
    if tr.device.type == "cuda":
        tensors["rng.cuda"] = torch.cuda.get_rng_state(tr.device)
    save_file({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}, str(d / TENSORS),
              metadata={"format": "npas-climb", "version": str(FORMAT)})
    groups = [{k: list(v) if isinstance(v, tuple) else v for k, v in g.items()} for g in opt["param_groups"]]
    state = {
        "format": FORMAT, "step": tr.step, "recipe": climb.recipe.to_dict(), "stream_block": tr.stream.block,
        "param_groups": groups, "opt_scalars": scalars, "lr_factor": climb.lr_factor,
        "lr_factor_in_loop": True,
        "rung_losses": {str(t): _finite_or_none(v) for t, v in climb.rung_losses.items()},
        "fork_steps": climb.fork_steps, "failed": climb.failed,
        "config_hash": str(getattr(getattr(tr.model, "cfg", None), "hash", "")),
    }
    tmp = d / (STATE + ".tmp")
    tmp.write_text(json.dumps(state, indent=1) + "\n", encoding="utf-8")
    tmp.replace(d / STATE)
    return d


def read_state(directory: str | Path) -> dict[str, Any]:
    """A checkpoint's JSON: what it holds without loading a tensor (its step, rungs, recipe)."""
    path = Path(directory) / STATE
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{path} is missing: {directory} is not a complete climb checkpoint (the save was "
                        "interrupted); resume from an earlier checkpoint or restart the trial") from None
    except json.JSONDecodeError as err:
        raise DataError(f"{path} is not valid JSON ({err}); the checkpoint is damaged") from None
    if not isinstance(state, dict):
        raise DataError(f"{path} holds a JSON {type(state).__name__}, not a checkpoint's state; the checkpoint is "
                        "damaged: restart the trial")
    if state.get("format") != FORMAT:
        raise DataError(f"{path} has checkpoint format {state.get('format')!r}; this npas reads {FORMAT}")
    if missing := [k for k in _STATE_KEYS if k not in state]:
        raise DataError(f"{path} lacks {', '.join(missing)}; the checkpoint is damaged: restart the trial")
    return state


# what `load` reads from state.json (written by every `save`)
_STATE_KEYS = ("step", "recipe", "stream_block", "param_groups", "opt_scalars", "rung_losses", "fork_steps",
               "lr_factor")


def load(directory: str | Path, cfg: Any, corpus: Corpus, device: str | torch.device | None = None,
         reference: Any = None) -> Climb:
    """The climb saved in ``directory``, ready to step up from where it stopped. ``cfg``, ``corpus`` and
    ``reference`` must be the ones it was started with (the checkpoint holds the weights, not the
    allocation); torch's global RNG is set to the saved state last, after the model is built."""
    d = Path(directory)
    state = read_state(d)
    recipe = Recipe.from_dict(state["recipe"], source=str(d / STATE))
    saved, given = state.get("config_hash") or "", str(getattr(cfg, "hash", ""))
    if saved and given and saved != given:
        raise DataError(f"{d} holds a run of allocation {saved}, not of {given}; resume it with the allocation "
                        "it was started with")
    dev = pick_device(device)
    check_compatible(cfg, recipe, corpus)
    try:
        tensors = load_file(str(d / TENSORS))
    except (SafetensorError, OSError) as err:
        raise DataError(f"cannot read {d / TENSORS}: {str(err).splitlines()[0]}; the checkpoint is damaged "
                        "or incomplete") from None
    with recipe_threads(recipe, dev):
        model = build(cfg, recipe, reference)
    model.load_state_dict({k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")})
    model = model.to(dev)
    model.train()
    opt = make_optimizer(model, recipe, dev, reference)
    opt_state: dict[int, dict[str, Any]] = {}
    for key, v in tensors.items():
        if key.startswith("opt."):
            _, idx, name = key.split(".", 2)
            opt_state.setdefault(int(idx), {})[name] = v
    for idx, values in state["opt_scalars"].items():
        opt_state.setdefault(int(idx), {}).update(values)
    groups = [{k: tuple(v) if k == "betas" else v for k, v in g.items()} for g in state["param_groups"]]
    opt.load_state_dict({"state": opt_state, "param_groups": groups})
    data = corpus.train.to(dev)
    stream = Stream(len(data), recipe.batch_size, recipe.seq_len, recipe.seed, dev)
    stream.gen.set_state(tensors["stream.gen"])
    stream.block = int(state["stream_block"])
    stream.offsets = tensors["stream.offsets"].to(dev)
    # the loop applies the factor (Trainer.lr_factor); a checkpoint written before it did carries the
    # factor inside its groups' lr_mult instead, and is continued at x1 on top of those
    in_loop = bool(state.get("lr_factor_in_loop"))
    tr = Trainer(model, opt, stream, recipe, data, dev, int(state["step"]),
                 lr_factor=float(state["lr_factor"]) if in_loop else 1.0)
    evals = tuple(t.to(dev) for t in eval_batches(corpus, recipe))
    torch.set_rng_state(tensors["rng.cpu"])
    if dev.type == "cuda" and "rng.cuda" in tensors:
        torch.cuda.set_rng_state(tensors["rng.cuda"], dev)
    losses = {int(t): math.nan if v is None else float(v) for t, v in state["rung_losses"].items()}
    return Climb(tr, evals, losses, int(state["fork_steps"]), float(state["lr_factor"]),  # type: ignore[arg-type]
                 state.get("failed"))
