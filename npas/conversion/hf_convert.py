"""`npas convert HF_DIR [--to ALLOC.yaml] --out DIR`: a Hugging Face LLaMA checkpoint into an allocation.

The checkpoint is read by `hf_source` as the untied uniform allocation of its chassis; without `--to`
the target is that same allocation (the identity conversion: its config.yaml is the starting point for
any other allocation of the chassis, and it reproduces the source's logits). The output keeps the
source's dtype (bf16 weights are upcast only for the fits) unless `dtype` says otherwise.

A checkpoint has no npas record of its training text, so the loss pass reads `data` (default: the
bundled corpus) with the checkpoint's own tokenizer.json, at the `smoke` recipe's windows, scoring the
source and the converted model on the same batches; MLP narrowing is calibrated on its training split.
Without a tokenizer.json (only tokenizer.model, or none) the conversion runs without a loss pass and
says so in `ConvertResult.note`. A tokenizer.json with more tokens than the model has embedding rows is
refused before anything is written: the output would carry it, and npas refuses to train or sample a
model that cannot embed its tokenizer's ids (fewer tokens is a padded vocabulary and fine).
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from npas.allocation.config import ArchConfig
from npas.allocation.transformer import export_state
from npas.conversion.calibration import calibration_ids
from npas.conversion.convert import Conversion, convert_model, convertible_problems
from npas.conversion.directory import PROVENANCE_FILE, ConvertResult, read_allocation
from npas.conversion.hf_export import RECURSION_NOT_HF, unroll_problems, write_hf
from npas.conversion.hf_source import fingerprint_hf_weights, read_hf_dir, require_transformers
from npas.conversion.tying import TieInit
from npas.errors import ConfigError, DataError, NpasError
from npas.training.data import load_corpus
from npas.training.proxy import eval_batches, evaluate
from npas.training.recipe import load_recipe
from npas.training.train import CONFIG_FILE, METRICS_FILE, MODEL_FILE, TOKENIZER_FILE, load_trained
from npas.version import __version__

LOSS_RECIPE = "smoke"  # the loss pass's windows: 4 batches of 16 x 64 tokens
FORMATS = ("npas", "hf")


def check_format(fmt: str, unroll: bool) -> None:
    """Refuse a format request before any work: unknown format, --unroll without hf, no transformers."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r} is not one of {list(FORMATS)}")
    if unroll and fmt != "hf":
        raise ConfigError("--unroll writes a stock LlamaForCausalLM; pass it with --format hf")
    if fmt == "hf":
        require_transformers("--format hf")


def check_output(cfg: ArchConfig, fmt: str, unroll: bool) -> None:
    """Refuse an output `cfg` cannot be written as, before any training or conversion writes the
    directory: `--unroll` of an allocation a stock LlamaForCausalLM cannot express, and any Hugging Face
    format of a recursion allocation."""
    if fmt == "hf" and cfg.recursion is not None:
        raise ConfigError(RECURSION_NOT_HF)
    if fmt == "hf" and unroll:
        if problems := unroll_problems(cfg):
            raise ConfigError("cannot write a stock LlamaForCausalLM: " + "; ".join(problems))


def _target(src_cfg: ArchConfig, alloc: str | Path | ArchConfig | None, dtype: str | None,
            source_dtype: str) -> ArchConfig:
    cfg = src_cfg if alloc is None else alloc if isinstance(alloc, ArchConfig) else read_allocation(alloc)
    return replace(cfg, dtype=dtype or source_dtype)


def _loss_pass(ck: Any, data: str | None, conversion: Conversion | None = None) -> tuple[Any, Any, float]:
    """(recipe, corpus, source val loss) on `data` read with the checkpoint's tokenizer."""
    recipe = load_recipe(LOSS_RECIPE)
    if recipe.seq_len > ck.cfg.chassis.context:
        recipe = replace(recipe, seq_len=ck.cfg.chassis.context)
    corpus = load_corpus(data, val_fraction=recipe.val_fraction, test_fraction=recipe.test_fraction,
                         tokenizer=ck.tokenizer)
    val = evaluate(ck.model, eval_batches(corpus, recipe), torch.device("cpu"), recipe)
    return recipe, corpus, val


def write_output(model: torch.nn.Module, cfg: ArchConfig, tokenizer: Any, out: Path, fmt: str,
                 unroll: bool) -> dict[str, Any] | None:
    """The model directory in `fmt`: npas's (model.safetensors, config.yaml, tokenizer.json) or Hugging
    Face's (see `hf_export.write_hf`); returns write_hf's summary for hf."""
    if fmt == "hf":
        return write_hf(model, cfg, out, tokenizer, unroll=unroll)
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file(export_state(model), str(out / MODEL_FILE), metadata={"format": "npas", "config_hash": cfg.hash})
    if tokenizer is not None:
        (out / TOKENIZER_FILE).write_text(tokenizer.to_json(), encoding="utf-8")
    (out / CONFIG_FILE).write_text(cfg.to_yaml(), encoding="utf-8")
    return None


def convert_hf_dir(hf_dir: str | Path, alloc: str | Path | ArchConfig | None, out: str | Path,
                   tie_init: TieInit = "auto", data: str | None = None, force: bool = False, seed: int = 0,
                   fmt: str = "npas", unroll: bool = False, dtype: str | None = None) -> ConvertResult:
    """Convert the Hugging Face checkpoint in `hf_dir` into `alloc` (None: its identity allocation)."""
    check_format(fmt, unroll)
    if dtype is not None and dtype not in ("float32", "bfloat16", "float16"):
        raise ConfigError(f"--dtype {dtype!r} is not one of float32, bfloat16, float16")
    out = Path(out)
    if out.resolve() == Path(hf_dir).expanduser().resolve():
        raise NpasError(f"--out {out} is the source directory; choose another --out")
    if (out / MODEL_FILE).exists() and not force:
        raise NpasError(f"{out} already holds a model; pass --force to overwrite or choose another --out")
    ck = read_hf_dir(hf_dir)
    if ck.tokenizer is not None and ck.tokenizer_note is not None:  # more tokens than embedding rows
        raise DataError(f"{ck.tokenizer_note}: the converted model could not read its own tokenizer (npas train "
                        "and npas sample refuse it); put the model's own tokenizer.json beside config.json, or "
                        "remove tokenizer.json to convert the weights alone")
    cfg = _target(ck.cfg, alloc, dtype, ck.dtype)
    problems = convertible_problems(ck.cfg, cfg)
    if problems:
        raise ConfigError(f"cannot convert {hf_dir}: " + "; ".join(problems))
    check_output(cfg, fmt, unroll)
    note = ck.tokenizer_note
    recipe = corpus = None
    source_val = val = math.nan
    if note is None:
        recipe, corpus, source_val = _loss_pass(ck, data)
    conversion = convert_model(ck.model, cfg, tie_init=tie_init, seed=seed,
                               calibration=None if corpus is None else calibration_ids(corpus, recipe.seq_len))
    if corpus is not None:
        val = evaluate(conversion.model, eval_batches(corpus, recipe), torch.device("cpu"), recipe)
    if out.exists() and force:
        for name in ("model.safetensors", "config.json", "config.yaml", "model.safetensors.index.json"):
            (out / name).unlink(missing_ok=True)
    written = write_output(conversion.model, cfg, ck.tokenizer, out, fmt, unroll)
    finite = math.isfinite(val)
    doc: dict[str, Any] = {
        "conversion": {
            "source_dir": str(hf_dir), "source_format": "huggingface", "source_dtype": ck.dtype,
            "source_hash": ck.cfg.hash, "source_weights": fingerprint_hf_weights(ck.dir),
            "source_val_loss": source_val if math.isfinite(source_val) else None, "tie_init": tie_init,
            "val_loss": val if finite else None, "val_bpc": val / math.log(2) if finite else None,
            "provenance": conversion.provenance.counts(),
            "max_weight_error": max(conversion.errors.values(), default=0.0),
            "loss_pass": None if note is None else f"skipped: {note}",
            "format": fmt if not unroll else "hf-unrolled",
        },
        "reference": ck.cfg.chassis.to_dict(), "npas_version": __version__,
    }
    if corpus is not None:
        doc["recipe"] = recipe.to_dict()
        doc["data"] = corpus.describe()
    if written is not None:
        doc["conversion"]["written"] = written
    (out / PROVENANCE_FILE).write_text(json.dumps(conversion.provenance.to_dict(), indent=1) + "\n",
                                       encoding="utf-8")
    (out / METRICS_FILE).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return ConvertResult(conversion, val, source_val if math.isfinite(source_val) else None, out, doc, note, written)


def reformat_dir(model_dir: str | Path, unroll: bool) -> dict[str, Any]:
    """Rewrite an npas model directory (`npas train --out`, `npas convert --out`) in place as a Hugging
    Face checkpoint: its model.safetensors and config.yaml become config.json and HF weights;
    tokenizer.json, metrics.json and provenance.json stay."""
    d = Path(model_dir)
    model, tokenizer, cfg = load_trained(d)
    tmp = d / ".hf-tmp"
    shutil.rmtree(tmp, ignore_errors=True)

    written = write_hf(model, cfg, tmp, tokenizer, unroll=unroll)
    (d / CONFIG_FILE).unlink(missing_ok=True)
    for f in tmp.iterdir():
        f.replace(d / f.name)
    tmp.rmdir()
    return written


__all__ = ["FORMATS", "check_format", "check_output", "convert_hf_dir", "reformat_dir"]
