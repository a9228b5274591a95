"""Argument types for numeric flags, checked while the command line is parsed.

Parsing is the first thing `npas` does, so a bad count or fraction is refused before any file is read,
any database is touched or Ray is started. Each type names the bad value, the allowed range and an
example, and the parser prints that as one line with exit code 2.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from npas.service.outcome import MAX_REPEATS

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
