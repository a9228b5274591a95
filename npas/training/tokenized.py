"""The seam between split text and training: one tokenizer, every split's ids from the token cache.

``npas.training.data`` splits a corpus's *text* into train / validation / test; this module turns
those texts into token streams. The tokenizer is built from the training text only (BPE never sees
held-out text), or reloaded from a saved ``tokenizer.json`` so a resumed study or a Ray worker uses
the very tokenizer the study started with instead of retraining one. Each split is tokenized
through the token cache, so workers on one machine tokenize it once between them.

A character vocabulary is the exception: it is built from all the splits, as npas always has,
because an alphabet is not a learned statistic, and leaving a held-out character out of it would
make that split impossible to encode at all.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from npas.training.metrics import bits_per_byte, scored_bytes
from npas.training.token_cache import TokenFile, cached_tokens
from npas.training.tokenizers import Tokenizer, TokenizerSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TokenizedSplits:
    """Each split's ids (read-only, memory-mapped) with the tokenizer that made them."""

    tokenizer: Tokenizer
    files: dict[str, TokenFile]
    byte_lengths: np.ndarray  # (vocab_size,) UTF-8 bytes per id, for bits per byte of scored windows

    def ids(self, split: str) -> np.ndarray:
        return self.files[split].ids

    def window_batch(self, split: str, starts: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)`` windows, each (B, seq_len) int64, from a memory-mapped uint8/16/32 stream.

        Gathered with numpy (torch cannot index a read-only uint16 map), then handed to torch.
        """
        idx = starts.numpy()[:, None] + np.arange(seq_len + 1)  # (B, T+1)
        windows = torch.from_numpy(self.ids(split)[idx].astype(np.int64))
        return windows[:, :-1], windows[:, 1:]

    def bits_per_byte(self, loss_nats_per_token: float, targets: torch.Tensor) -> float:
        """Bits per byte of a mean loss over ``targets``: the bytes are those the target ids spell."""
        y = targets.reshape(-1).cpu().numpy()
        return bits_per_byte(loss_nats_per_token, len(y), scored_bytes(y, self.byte_lengths))

    def describe(self) -> dict:
        """JSON-safe record for a study or a trained model's metadata."""
        return {"tokenizer": self.tokenizer.name, "tokenizer_fingerprint": self.tokenizer.fingerprint,
                "vocab_size": self.tokenizer.vocab_size,
                **{f"{s}_tokens": len(f.ids) for s, f in self.files.items()},
                **{f"{s}_bytes": f.n_bytes for s, f in self.files.items()}}


def tokenize_splits(texts: Mapping[str, str], tokenizer: TokenizerSpec | Tokenizer,
                    cache_dir: str | Path | None = None) -> TokenizedSplits:
    """Tokenize every split of ``texts`` (which must hold ``"train"``) with one tokenizer.

    ``tokenizer`` is a spec to build (``bpe:N`` trains on ``texts["train"]`` alone) or an already
    built tokenizer, e.g. one reloaded from a study's saved ``tokenizer.json``.
    """
    if "train" not in texts:
        raise ValueError(f"texts must hold a 'train' split, got {sorted(texts)}")
    if isinstance(tokenizer, TokenizerSpec):
        source = "".join(texts.values()) if tokenizer.kind == "char" else texts["train"]
        tok = tokenizer.build(source)
    else:
        tok = tokenizer
    files = {name: cached_tokens(text, tok, cache_dir=cache_dir, label=name) for name, text in texts.items()}
    log.info("tokenized with %s (%s): %s", tok.name, tok.fingerprint,
             ", ".join(f"{n} {len(f.ids)} tokens{' (cached)' if f.hit else ''}" for n, f in files.items()))
    return TokenizedSplits(tokenizer=tok, files=files, byte_lengths=tok.token_byte_lengths())
