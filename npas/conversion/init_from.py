"""`npas search --init-from DENSE_DIR`: every trial starts from the trained model, converted.

The model's tokenizer.json becomes the study's tokenizer (`source_tokenizer`), so a model trained on
BPE tokens is searched on those tokens; another --tokenizer is refused. A study records which model
its trials start from (`describe_source`: the directory and a fingerprint of its weights), because a
trial's result depends on it as much as on its recipe; `resume` and joining drivers refuse a directory
whose weights differ. In a worker, `initial_state` loads the model once per process (checking the
fingerprint again: every node must start from the same weights) and converts it into each trial's
allocation; the proxy recipe then trains from those weights.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import Tensor

from npas.allocation.config import ArchConfig, Chassis, reference_config
from npas.conversion.calibration import calibration_ids
from npas.conversion.convert import convert_model, convertible_problems
from npas.conversion.directory import MODEL_FILE, fingerprint_weights
from npas.conversion.hf_source import fingerprint_hf_weights, is_hf_dir, read_hf_dir, read_hf_tokenizer
from npas.errors import ConfigError, DataError, StudyError
from npas.training.init_source import InitSource
from npas.training.train import TOKENIZER_FILE, VOCAB_FILE, load_trained


def _load(d: str | Path) -> tuple[Any, Any, ArchConfig]:
    """(model, tokenizer or None, cfg) of an npas model directory or a Hugging Face checkpoint
    (`hf_source` reads those: config.json + safetensors, tokenizer.json when it has one)."""
    if is_hf_dir(d):
        ck = read_hf_dir(d)
        return ck.model, ck.tokenizer, ck.cfg
    return load_trained(d)


def _fingerprint(d: str | Path) -> str:
    return fingerprint_hf_weights(d) if is_hf_dir(d) else fingerprint_weights(d)


def describe_source(dense_dir: str | Path, reference: Chassis, corpus: Any) -> InitSource:
    """The `InitSource` of a trained model a study's trials can start from, or the
    reason it cannot be (its chassis does not fit the space's reference, its vocabulary the corpus).
    `dense_dir` is an npas model directory or a Hugging Face LLaMA checkpoint (`hf_source`)."""
    d = Path(dense_dir).expanduser().resolve()
    _, tokenizer, cfg, weights = read_source(d)
    if tokenizer is None:  # a checkpoint without tokenizer.json: the user's --tokenizer, if its ids fit
        if corpus.tokenizer.vocab_size != cfg.chassis.vocab_size:
            raise DataError(f"--init-from {dense_dir} has no tokenizer.json and its vocab_size is "
                            f"{cfg.chassis.vocab_size}, but --tokenizer {corpus.tokenizer.name} has "
                            f"{corpus.tokenizer.vocab_size} tokens; pass the model's tokenizer.json")
    elif tokenizer.fingerprint != corpus.tokenizer.fingerprint:  # first: another vocabulary size follows from it
        raise DataError(f"--init-from {dense_dir} reads text with its own {tokenizer.name} ({tokenizer.vocab_size} "
                        f"tokens, fingerprint {tokenizer.fingerprint}), not with tokenizer {corpus.tokenizer.name} "
                        f"({corpus.tokenizer.vocab_size} tokens, fingerprint {corpus.tokenizer.fingerprint}); drop "
                        "--tokenizer: a study that starts from this model searches with the model's tokenizer")
    rows = cfg.chassis.vocab_size
    if tokenizer is not None and rows != corpus.vocab_size:  # its own tokenizer (checked above), not its rows
        how = "padded past its tokenizer's ids" if rows > corpus.vocab_size else "fewer rows than tokens"
        raise DataError(f"--init-from {dense_dir} has {rows} embedding rows but its tokenizer has {corpus.vocab_size} "
                        f"tokens ({how}); a search's trials need one row per token: convert it with `npas convert` "
                        "and continue it with `npas train` instead")
    problems = convertible_problems(cfg, reference_config(reference))
    if problems:
        if is_hf_dir(d):  # the space must state the checkpoint's chassis: say which, ready to paste
            import yaml

            chassis = yaml.safe_dump(cfg.chassis.to_dict(), default_flow_style=True, width=1 << 16).strip()
            problems.append(f"give the space the checkpoint's chassis: {chassis}")
        raise ConfigError(f"--init-from {dense_dir}: " + "; ".join(problems))
    return InitSource(str(d), weights, cfg.hash)


def source_chassis(dense_dir: str | Path) -> Chassis | None:
    """The chassis a search starting from `dense_dir` has: a Hugging Face checkpoint's own (its weights
    fix every dimension, and its config.json is all a user has; `Space.bind(chassis=...)` pins it),
    or None for an npas model directory, whose weights convert into the space's chassis, narrowed
    where it is narrower. An unreadable checkpoint is refused here, in the reader's words."""
    if not is_hf_dir(dense_dir):
        return None
    return read_source(dense_dir)[2].chassis


def source_tokenizer(dense_dir: str | Path, tokenizer: Any = None) -> Any:
    """The tokenizer a study starting from `dense_dir` searches with: the model's own tokenizer.json
    (its embeddings index those tokens) when none is given; a given one is kept, and `describe_source`
    refuses it unless it is that very tokenizer. A directory that cannot be read is left to
    `describe_source` to refuse, with its own message."""
    d = Path(dense_dir).expanduser()
    if is_hf_dir(d) and not (d / TOKENIZER_FILE).is_file() and tokenizer is None:
        _, note = read_hf_tokenizer(d, 0)
        raise DataError(f"--init-from {dense_dir}: {note}; pass --tokenizer path/to/tokenizer.json with the "
                        "model's vocabulary")
    if tokenizer is not None:
        return tokenizer
    for name in (TOKENIZER_FILE, VOCAB_FILE):
        if (d / name).is_file():
            return str(d / name)
    return None


def check_same_source(study_name: str, stored: Mapping[str, str] | None, given: Mapping[str, str] | None) -> None:
    """Refuse to continue a study from another starting model than the one it was created with."""
    if stored is None and given is None:
        return
    if stored is None:
        raise StudyError(f"study {study_name!r} trains its trials from scratch; drop --init-from, or start a "
                         "new study")
    if given is None:
        return
    if given["weights"] != stored["weights"]:
        raise StudyError(f"study {study_name!r} starts its trials from {stored['dir']} (weights "
                         f"{stored['weights']}), but --init-from {given['dir']} holds weights {given['weights']}; "
                         "pass the original model, or start a new study")


def read_source(directory: str | Path) -> tuple[Any, Any, ArchConfig, str]:
    """(model, tokenizer, config, weights fingerprint) of a trained directory, read and hashed once
    per process (a driver's plan, its learned groups and each worker's trials all ask): the cache is
    keyed by the weights file's path, size and modification time, so a replaced model is read again."""
    d = Path(directory).expanduser().resolve()
    try:  # an npas directory's weights file, or every safetensors shard of a Hugging Face checkpoint
        files = [d / MODEL_FILE] if (d / MODEL_FILE).exists() else sorted(d.glob("*.safetensors")) or [d / MODEL_FILE]
        stamp = tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    except OSError:
        stamp = None  # missing: the loader says why, in its own words
    return _read_source(str(d), stamp)


@functools.lru_cache(maxsize=2)
def _read_source(directory: str, stamp: tuple | None) -> tuple[Any, Any, ArchConfig, str]:
    model, tokenizer, cfg = _load(directory)
    return model, tokenizer, cfg, _fingerprint(directory)


def _source(directory: str, weights: str):
    model, _, _, held = read_source(directory)
    if held != weights:
        raise DataError(f"{directory} here holds other weights than the study started from ({weights}); give "
                        "every node the same model")
    return model


def initial_state(init: Mapping[str, str], cfg: ArchConfig, seed: int, corpus: Any = None, seq_len: int = 64
                  ) -> dict[str, Tensor]:
    """The state dict of `cfg` converted from the study's starting model (MLPs narrowed on the
    corpus's training text when one is given, see `calibration`)."""
    cal = None if corpus is None else calibration_ids(corpus, seq_len)
    conv = convert_model(_source(init["dir"], init["weights"]), cfg, seed=seed, calibration=cal)
    return conv.model.state_dict()
