"""Tokenize-and-cache throughput vs calling Hugging Face ``tokenizers`` directly; cache size and load time.

    python benchmarks/data.py            # a 100 MB corpus (about 10 minutes on the shared 2-core machine)
    python benchmarks/data.py --quick    # about 2 MB, for the smoke test

The corpus is generated: the bundled Shakespeare's paragraphs, shuffled with a seeded RNG and
repeated until the size is reached, joined with the corpus separator (so it reads like many
documents, not one text repeated). A byte-level ``bpe:4096`` tokenizer is trained on the bundled
text once, outside every timer.

Three ways to get the ids of the same text are timed, interleaved round by round, median reported:

- ``encode_batch`` and ``encode_batch_fast`` (tokenizers' own batch calls) on the very pieces the
  npas pipeline encodes, cut beforehand and outside the timer, ids read into Python lists and then
  dropped: the least work that yields the ids;
- ``npas.training.token_cache.cached_tokens`` into an empty cache directory: hashing the text,
  cutting it into pieces, batch encoding, writing the ids to a uint16 file, renaming it into place.

Target: npas >= 0.80x the faster direct call. Token counts must agree (a mismatch exits 1); a speed
miss prints MISS and exits 0, as the machine is shared and noisy. Then the cache's size on disk, the
time to map it on a hit (with and without hashing the text), and the time to read it through.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from npas.training.corpora import SEPARATOR
from npas.training.data import bundled_text, fingerprint_text
from npas.training.token_cache import cached_tokens
from npas.training.tokenizers import BATCH_PIECES, split_pieces, train_bpe

TARGET = 0.80
MB = 1_000_000


def make_corpus(n_bytes: int, seed: int = 0) -> tuple[str, int]:
    """About ``n_bytes`` of shuffled Shakespeare paragraphs (the bundled text is ASCII: chars = bytes)."""
    paragraphs = [p for p in bundled_text().split("\n\n") if p.strip()]
    rng = random.Random(seed)
    docs: list[str] = []
    size = 0
    while size < n_bytes:
        order = paragraphs[:]
        rng.shuffle(order)
        for p in order:
            docs.append(p)
            size += len(p) + len(SEPARATOR)
            if size >= n_bytes:
                break
    return SEPARATOR.join(docs), len(docs)


def direct(tok, pieces: list[str], fast: bool) -> int:
    call = tok.hf.encode_batch_fast if fast else tok.hf.encode_batch
    n = 0
    for b in range(0, len(pieces), BATCH_PIECES):
        ids = [e.ids for e in call(pieces[b:b + BATCH_PIECES], add_special_tokens=False)]
        n += sum(len(i) for i in ids)
    return n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="about 2 MB, 2 rounds: a smoke test")
    ap.add_argument("--mb", type=float, default=None, help="corpus size in MB (default 100, quick 2)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 2)")
    ap.add_argument("--vocab", type=int, default=4096)
    args = ap.parse_args()
    mb = args.mb if args.mb is not None else (2.0 if args.quick else 100.0)
    rounds = args.rounds or 2

    t0 = time.perf_counter()
    text, n_docs = make_corpus(int(mb * MB))
    n_bytes = len(text.encode("utf-8"))
    print(f"corpus: {n_bytes / MB:.1f} MB, {n_docs:,} documents (shuffled bundled paragraphs, seed 0), "
          f"generated in {time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    train_text = bundled_text()[: 1 * MB] if args.quick else bundled_text()
    tok = train_bpe(train_text, args.vocab)
    print(f"tokenizer: {tok.name} trained on {len(train_text) / MB:.1f} MB of the bundled text in "
          f"{time.perf_counter() - t0:.1f} s (fingerprint {tok.fingerprint}, not timed below)")
    pieces = split_pieces(text)

    times: dict[str, list[float]] = {"encode_batch": [], "encode_batch_fast": [], "npas tokenize+cache": []}
    counts: dict[str, int] = {}
    scratch = Path(tempfile.mkdtemp(prefix="npas-bench-data-"))
    try:
        for r in range(rounds):
            for name in times:
                t0 = time.perf_counter()
                if name == "npas tokenize+cache":
                    got = cached_tokens(text, tok, cache_dir=scratch / f"round{r}")
                    n = len(got.ids)
                else:
                    n = direct(tok, pieces, fast=name.endswith("fast"))
                times[name].append(time.perf_counter() - t0)
                counts[name] = n

        print(f"\n{'path':<22}{'median s':>10}{'MB/s':>9}{'tokens':>14}")
        rate = {}
        for name, ts in times.items():
            med = statistics.median(ts)
            rate[name] = n_bytes / MB / med
            print(f"{name:<22}{med:>10.2f}{rate[name]:>9.2f}{counts[name]:>14,}")
        if len(set(counts.values())) != 1:
            print(f"MISMATCH: token counts differ {counts}")
            return 1
        best = max(("encode_batch", "encode_batch_fast"), key=rate.get)
        ratio = rate["npas tokenize+cache"] / rate[best]
        verdict = "PASS" if ratio >= TARGET else "MISS"
        print(f"ratio: tokenize+cache {rate['npas tokenize+cache']:.2f} MB/s vs {best} "
              f"{rate[best]:.2f} MB/s = {ratio:.2f}x (target >= {TARGET:.2f}x) {verdict}")

        cache_dir = scratch / "round0"
        fp = fingerprint_text(text)
        t0 = time.perf_counter()
        hit = cached_tokens(text, tok, cache_dir=cache_dir, text_fingerprint=fp)
        t_map = time.perf_counter() - t0
        t0 = time.perf_counter()
        cached_tokens(text, tok, cache_dir=cache_dir)
        t_hash = time.perf_counter() - t0
        t0 = time.perf_counter()
        total = int(np.asarray(hit.ids).sum(dtype=np.int64))
        t_read = time.perf_counter() - t0
        size = hit.path.stat().st_size
        print(f"cache: {len(hit.ids):,} tokens, {size / MB:.1f} MB on disk ({hit.ids.dtype}, "
              f"{hit.ids.dtype.itemsize} bytes/token; text {n_bytes / MB:.1f} MB, "
              f"{len(hit.ids) / n_bytes:.3f} tokens/byte)")
        print(f"load: hit={hit.hit}, memory-mapped in {t_map * 1e3:.1f} ms given the text fingerprint, "
              f"{t_hash * 1e3:.0f} ms hashing the text first; reading all ids {t_read * 1e3:.0f} ms "
              f"(checksum {total})")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
