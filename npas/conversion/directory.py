"""`npas convert` on disk: read a `npas train` directory, write the converted model beside its record.

The output is a `npas train` directory (model.safetensors, tokenizer.json, config.yaml, metrics.json),
so `npas sample`, `load_trained`, `npas search --init-from` and `npas train OUT` (which continues from
its weights) read it like any trained model, plus provenance.json, the origin of every tensor.
metrics.json holds the converted model's validation loss before any training, measured on the
source's own validation batches (its recipe, corpus and tokenizer), next to the source's, so the two
numbers are comparable, and the reference chassis the source trained against (its own, unless it
recorded another), which further training scales against; narrower MLPs are fitted on a few thousand
tokens of the corpus's training split (`calibration`). Everything a user can get wrong (paths, the
allocation, an incompatible chassis, an occupied --out) is checked before anything is written.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from npas.allocation.config import ArchConfig
from npas.conversion.calibration import calibration_ids
from npas.conversion.convert import Conversion, convert_model, convertible_problems
from npas.conversion.tying import TieInit
from npas.errors import ConfigError, DataError, NpasError
from npas.files import read_text
from npas.training.corpora import DEFAULT_GLOB, DEFAULT_TEXT_FIELD
from npas.training.data import Corpus, load_corpus, load_known_corpus
from npas.training.proxy import eval_batches, evaluate, pick_device
from npas.training.recipe import Recipe
from npas.training.tokenizers import Tokenizer
from npas.training.train import (
    METRICS_FILE,
    MODEL_FILE,
    REFERENCE_KEY,
    load_trained,
    read_chassis,
    read_metrics,
    save_trained,
)
from npas.version import __version__

PROVENANCE_FILE = "provenance.json"


@dataclass
class ConvertResult:
    conversion: Conversion
    val_loss: float  # converted model, before any training, on the source's validation batches
    source_val_loss: float | None  # the source model's own, from its metrics.json
    out: Path
    metrics: dict
    note: str | None = None  # a Hugging Face source converted without a loss pass: why (`hf_convert`)
    written: dict | None = None  # what --format hf wrote ({"kind", "params", "bytes"}, `hf_export.write_hf`)


def fingerprint_weights(model_dir: str | Path) -> str:
    """sha256 (16 hex) of a trained directory's weights file: which source a conversion started from."""
    h = hashlib.sha256()
    with open(Path(model_dir) / MODEL_FILE, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def read_allocation(path: str | Path) -> ArchConfig:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"allocation file {p} does not exist; write one with `npas export NAME --out best.yaml`")
    return ArchConfig.from_yaml(read_text(p, "allocation file"))


def source_corpus(metrics: dict, recipe: Recipe, data: str | None, tokenizer: Tokenizer | None = None) -> Corpus:
    """The corpus the source was trained on (refused if its text changed), or `data` when given, read
    with the source's own `tokenizer` (a BPE model's ids mean nothing under a character vocabulary)."""
    described = metrics.get("data") or {}
    glob, field = described.get("glob") or DEFAULT_GLOB, described.get("text_field") or DEFAULT_TEXT_FIELD
    if data is not None:
        return load_corpus(data, val_fraction=recipe.val_fraction, test_fraction=recipe.test_fraction,
                           tokenizer=tokenizer, glob=glob, text_field=field)
    try:
        return load_known_corpus(described.get("source"), recipe.val_fraction, recipe.test_fraction,
                                 described.get("fingerprint", ""),
                                 None if tokenizer is None else tokenizer.to_json(), glob, field)
    except DataError as err:
        raise DataError(f"{err}; pass --data with the text the model was trained on") from None


def convert_dir(dense_dir: str | Path, alloc: str | Path | ArchConfig, out: str | Path,
                tie_init: TieInit = "auto", data: str | None = None, force: bool = False,
                device: str | None = "cpu", seed: int = 0) -> ConvertResult:
    """Convert the model in `dense_dir` into allocation `alloc` and write it to `out`."""
    cfg = alloc if isinstance(alloc, ArchConfig) else read_allocation(alloc)
    source, tokenizer, src_cfg = load_trained(dense_dir)
    problems = convertible_problems(src_cfg, cfg)
    if problems:
        raise ConfigError(f"cannot convert {dense_dir}: " + "; ".join(problems))
    out = Path(out)
    if (out / MODEL_FILE).exists() and not force:
        raise NpasError(f"{out} already holds a model; pass --force to overwrite or choose another --out")
    if out.resolve() == Path(dense_dir).resolve():
        raise NpasError(f"--out {out} is the source directory; choose another --out")
    metrics = read_metrics(dense_dir)
    try:
        recipe = Recipe.from_dict(metrics.get("recipe"), f"{dense_dir}/{METRICS_FILE} recipe")
    except ConfigError as err:
        raise DataError(f"{err}; retrain the source with `npas train`") from None
    if recipe.seq_len > cfg.chassis.context:  # the check pass reads the source's own windows, at its seq_len
        raise ConfigError(f"cannot convert {dense_dir}: the allocation's context={cfg.chassis.context} is shorter "
                          f"than the seq_len {recipe.seq_len} the source was trained and is checked at; use "
                          f"context >= {recipe.seq_len}")
    corpus = source_corpus(metrics, recipe, data, tokenizer)
    if corpus.vocab_size != tokenizer.vocab_size or corpus.tokenizer.fingerprint != tokenizer.fingerprint:
        raise DataError(f"the corpus {corpus.source} reads into other tokens than {dense_dir}'s tokenizer; "
                        "pass --data with the text the model was trained on")
    ref = metrics.get(REFERENCE_KEY)  # further training scales against what the source trained against
    reference = (src_cfg.chassis if ref is None else read_chassis(ref, f"{dense_dir}/{METRICS_FILE}")).to_dict()

    calibration = calibration_ids(corpus, recipe.seq_len)  # training text only: never the validation split
    conversion = convert_model(source, cfg, tie_init=tie_init, seed=seed, calibration=calibration)
    dev = pick_device(device)
    prev = torch.get_num_threads()
    if dev.type == "cpu" and recipe.threads > 0:
        torch.set_num_threads(recipe.threads)  # as the recipe trains: one thread per process by default
    try:
        val = evaluate(conversion.model.to(dev), eval_batches(corpus, recipe), dev, recipe)
    finally:
        torch.set_num_threads(prev)
    conversion.model.to("cpu")
    src_result = metrics.get("result") or {}
    doc = {
        "conversion": {
            "source_dir": str(dense_dir), "source_hash": src_cfg.hash, "source_weights": fingerprint_weights(dense_dir),
            "source_val_loss": src_result.get("val_loss"), "tie_init": tie_init,
            "val_loss": val if math.isfinite(val) else None, "val_bpc": val / math.log(2) if math.isfinite(val) else None,
            "provenance": conversion.provenance.counts(), "calibration_tokens": calibration.numel(),
            "max_weight_error": max(conversion.errors.values(), default=0.0),
        },
        "recipe": recipe.to_dict(), "data": corpus.describe(), REFERENCE_KEY: reference,
        "npas_version": __version__,
    }
    save_trained(conversion.model, cfg, tokenizer, out)
    (out / PROVENANCE_FILE).write_text(json.dumps(conversion.provenance.to_dict(), indent=1) + "\n",
                                       encoding="utf-8")
    (out / METRICS_FILE).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")  # last: marks complete
    return ConvertResult(conversion, val, src_result.get("val_loss"), out, doc)


__all__ = ["ConvertResult", "convert_dir", "fingerprint_weights", "read_allocation"]
