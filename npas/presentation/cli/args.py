"""Argument types for numeric flags, checked while the command line is parsed.

Parsing is the first thing `npas` does, so a bad count or fraction is refused before any file is read,
any database is touched or Ray is started. Each type names the bad value, the allowed range and an
example, and the parser prints that as one line with exit code 2.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from pathlib import Path

from npas.service.execution.outcome import MAX_REPEATS
from npas.service.study.names import study_name_problem

SEED_MAX = 2**32 - 1  # numpy's RandomState, under Optuna's samplers, takes seeds in [0, 2**32)
COUNT_MAX = 1_000_000  # a bound on trials and workers that no real run approaches; stops 10**30


class Parser(argparse.ArgumentParser):
    """argparse, with its two-line usage-plus-error replaced by one line that names the fix."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}; see `{self.prog} --help`\n")


def _int(text: str) -> int:
    try:
        return int(text.strip().replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def int_in(low: int, high: int, example: int) -> Callable[[str], int]:
    """An integer in [low, high]."""

    def parse(text: str) -> int:
        v = _int(text)
        if not low <= v <= high:
            raise argparse.ArgumentTypeError(f"{v} is out of range; give a whole number from {low:,} to {high:,}, "
                                             f"e.g. {example}")
        return v

    parse.__name__ = "integer"
    return parse


def fraction_of_devices(text: str) -> float:
    """GPUs per trial as Ray takes them: 0, a fraction below 1, or a whole number."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; give e.g. 0, 0.5 or 1") from None
    if not math.isfinite(v) or v < 0 or v > 1024:
        raise argparse.ArgumentTypeError(f"{text!r} is out of range; give 0, a fraction such as 0.5, or a "
                                         f"whole number of GPUs")
    if v > 1 and not v.is_integer():
        raise argparse.ArgumentTypeError(f"{v} GPUs: Ray shares a GPU only as a fraction below 1; give 0.5 or a "
                                         f"whole number such as 2")
    return v


def temperature(text: str) -> float:
    """A sampling temperature: 0 (greedy) or a finite positive number. NaN would pass a `< 0` check
    and turn every probability into NaN deep inside torch.multinomial."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; give 0 (greedy) or e.g. 0.8") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is out of range; give 0 (greedy) or a positive number such "
                                         f"as 0.8")
    return v


def text_arg(what: str) -> Callable[[str], str]:
    """A non-empty string without NUL bytes (which no file system or database name accepts)."""

    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"{what} is empty; give a value")
        if "\x00" in text:
            raise argparse.ArgumentTypeError(f"{what} {text!r} contains a NUL byte; remove it")
        return text

    parse.__name__ = what
    return parse


TRIALS = int_in(1, COUNT_MAX, 20)
WORKERS = int_in(1, 4096, 2)
SEED = int_in(0, SEED_MAX, 0)
POSITIVE = int_in(1, COUNT_MAX, 32)
REPEATS = int_in(1, MAX_REPEATS, 3)


def tokenizer_arg(text: str) -> str:
    """``char``, ``bpe:N`` or a tokenizer.json path, checked now (a file is loaded) so a bad spec costs
    one line before any corpus is read; the spec travels on as the text the user typed."""
    from npas.errors import DataError
    from npas.training.tokenizers import parse_tokenizer_spec

    try:
        parse_tokenizer_spec(text)
    except DataError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text.strip()


tokenizer_arg.__name__ = "tokenizer"


def add_data_args(p: argparse.ArgumentParser, default_note: str = "bundled Shakespeare") -> None:
    """The corpus flags shared by `search` and `train`: where the text is, how to read it, how to tokenize it."""
    p.add_argument("--data", help="corpus: a .txt file, a directory (see --data-glob), .jsonl / .jsonl.gz or "
                   f".parquet with documents in --text-field (default: {default_note})")
    p.add_argument("--data-glob", type=text_arg("--data-glob"), default=None,
                   help="files of a --data directory to read, recursively (default: **/*.txt)")
    p.add_argument("--text-field", type=text_arg("--text-field"), default=None,
                   help="the JSONL field or Parquet column holding each document (default: text)")
    p.add_argument("--tokenizer", type=tokenizer_arg, default=None,
                   help="char (default), bpe:N (byte-level BPE with N tokens, trained on the training split) "
                        "or the path of a tokenizer.json")


# ---- every flag of one meaning checked the same way, in every command ----------------------------------
# `harden` below gives each flag (or positional) whose destination is named here the same check in every
# command that has it, composed with the type the command declared. One table, so a new command with a
# `--storage` or an `--out` gets the check without anyone remembering it: an empty string, an in-memory
# database or a study name with a `/` was once taken to mean something else in one command but not another.

DEVICE_KINDS = ("cpu", "cuda", "cuda:N", "mps")


def _study_name(text: str) -> str:
    problem = study_name_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def storage_url(text: str) -> str:
    """A storage URL that parses, names a supported backend and keeps what is written: an empty string
    would silently mean the default database, and `sqlite://` an in-memory one that vanishes at exit."""
    from npas.errors import StorageError
    from npas.service.study.urls import check_url

    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; give a URL such as sqlite:///trials/npas.db, or omit it for "
                                         "$NPAS_STORAGE or the default")
    try:
        check_url(text)
    except StorageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def device(text: str) -> str:
    """cpu, cuda, cuda:N or mps, and present on this machine: torch would otherwise fail deep inside
    `.to()` with a list of twenty device types, after the corpus and the model were loaded."""
    t = text.strip()
    m = re.fullmatch(r"(cpu|cuda|mps)(?::(\d+))?", t)
    if not m or (m.group(1) != "cuda" and m.group(2) is not None):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device; give one of {', '.join(DEVICE_KINDS)}")
    kind, index = m.group(1), m.group(2)
    if kind == "cpu":
        return t
    import torch  # only for an accelerator: cpu, every default, costs nothing

    if kind == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise argparse.ArgumentTypeError("mps is not available on this machine; give cpu")
        return t
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n == 0:
        raise argparse.ArgumentTypeError(f"{t}: this machine has no CUDA device (or torch was built without "
                                         f"CUDA); give cpu")
    if index is not None and int(index) >= n:
        raise argparse.ArgumentTypeError(f"{t}: this machine has {n} CUDA device(s), cuda:0 to cuda:{n - 1}")
    return t


def _path_component_problem(p: Path) -> str | None:
    """A part of `p` above it that exists as a file: nothing can be created below it."""
    for parent in p.parents:
        if parent.exists() and not parent.is_dir():
            return f"{parent} is a file, so nothing can be created below it"
    return None


def out_dir(text: str) -> str:
    """An output directory: not empty (that would mean the working directory), not an existing file."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty (that would write into the working directory); give a "
                                         "directory, e.g. trials/runs/my-model")
    p = Path(text).expanduser()
    if p.exists() and not p.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file; give a directory to write into")
    problem = _path_component_problem(p)
    if problem:
        raise argparse.ArgumentTypeError(f"{text}: {problem}; give another directory")
    return text


def out_file(text: str) -> str:
    """An output file: not empty, not an existing directory, not below a file."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; give a file to write, e.g. best.yaml")
    p = Path(text).expanduser()
    if p.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; give a file path such as {p / 'best.yaml'}")
    problem = _path_component_problem(p)
    if problem:
        raise argparse.ArgumentTypeError(f"{text}: {problem}; give another path")
    return text


def _dashboard_dir(text: str) -> str:
    return text if text == "" else out_dir(text)  # `--dashboard` alone means dashboards/STUDY


def _named(what: str) -> Callable[[str], str]:
    return text_arg(what)


# (command or "*", destination) -> check. Positionals and flags alike; "*" is every command.
CHECKS: dict[tuple[str, str], Callable[[str], str]] = {
    ("*", "storage"): storage_url,
    ("*", "device"): device,
    ("*", "data"): _named("--data"),
    ("*", "init_from"): _named("--init-from"),
    ("*", "recipe"): _named("--recipe"),
    ("*", "space"): _named("--space"),
    ("*", "ray_address"): _named("--ray-address"),
    ("*", "alloc"): _named("--to"),
    ("*", "config"): _named("CONFIG"),
    ("*", "file"): _named("FILE"),
    ("*", "model_dir"): _named("MODEL_DIR"),
    ("*", "dense_dir"): _named("DENSE_DIR"),
    ("*", "dashboard"): _dashboard_dir,
    ("search", "study"): _study_name,
    ("resume", "name"): _study_name,  # resume and validate start runs whose folders the name names
    ("validate", "name"): _study_name,
    ("*", "name"): _named("NAME"),
    ("export", "out"): out_file,
    ("*", "out"): out_dir,
}


def _composed(check: Callable[[str], str], declared: Callable[[str], object] | None) -> Callable[[str], object]:
    def parse(text: str) -> object:  # the command's own check first: its message names its flag
        value = text if declared is None else declared(text)
        return check(value) if isinstance(value, str) else value

    parse.__name__ = getattr(declared, "__name__", None) or getattr(check, "__name__", "value")
    return parse


def harden(parser: argparse.ArgumentParser) -> None:
    """Give every command's arguments the checks of `CHECKS` by destination (see above)."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for command, sub in action.choices.items():
            for arg in sub._actions:
                check = CHECKS.get((command, arg.dest)) or CHECKS.get(("*", arg.dest))
                if check is not None and arg.nargs in (None, "?"):
                    arg.type = _composed(check, arg.type)
