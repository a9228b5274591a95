"""Bits per byte: a loss that compares models across tokenizers.

Cross-entropy per token depends on how much text a token covers: a BPE model's loss per token is
larger than a character model's on the same text simply because its tokens are longer. Dividing the
total loss by the UTF-8 bytes of the text that was scored removes the tokenizer from the number, so
a char-level search and a BPE search can share a front.
"""

from __future__ import annotations

import math

import numpy as np


def bits_per_byte(loss_nats_per_token: float, n_tokens: int, n_bytes: int) -> float:
    """Total nats over ``n_tokens`` scored tokens, in bits, per UTF-8 byte of the text they spell.

    ``n_bytes`` is the bytes of the scored (target) tokens, e.g. ``scored_bytes(y, lengths)``; on
    ASCII text under a character tokenizer it equals ``n_tokens``, and bits per byte is bits per char.
    """
    if n_tokens < 0 or n_bytes <= 0:
        raise ValueError(f"bits_per_byte needs n_tokens >= 0 and n_bytes > 0, got {n_tokens=}, {n_bytes=}")
    return float(loss_nats_per_token) * n_tokens / math.log(2) / n_bytes


def scored_bytes(targets: np.ndarray, byte_lengths: np.ndarray) -> int:
    """UTF-8 bytes spelled by the target ids (any shape), from ``Tokenizer.token_byte_lengths()``."""
    return int(np.asarray(byte_lengths)[np.asarray(targets).reshape(-1)].sum())
