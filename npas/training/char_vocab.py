"""The character vocabulary: one token per distinct character, the bundled corpus' tokenizer.

Why a module of its own: it is the one tokenizer npas defines itself (no Hugging Face model behind it),
with its own serialized form (``vocab.json``, versioned by ``CHAR_VOCAB_VERSION``) that every model
trained on characters carries; `npas.training.tokenizers.CharLevel` puts it behind the tokenizer
protocol.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch

from npas.errors import DataError

CHAR_VOCAB_VERSION = 1  # version of the character vocabulary JSON ({"type": "char", ...})


@dataclass(frozen=True)
class CharTokenizer:
    """One token per distinct character, ids in sorted code-point order.

    Sorting makes the vocabulary a pure function of the character set, so two corpora with the
    same characters get identical ids and a model stays usable with its saved ``vocab.json``.
    """

    chars: tuple[str, ...]
    _stoi: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.chars:
            raise DataError("a tokenizer needs at least one character, got an empty vocabulary; "
                            "build it from non-empty text")
        if any(len(c) != 1 for c in self.chars):
            bad = [c for c in self.chars if len(c) != 1][:5]
            raise DataError(f"a character vocabulary holds single characters, got {bad!r}; "
                            "rebuild it with CharTokenizer.from_text")
        if list(self.chars) != sorted(set(self.chars)):
            raise DataError("a character vocabulary must be sorted and free of duplicates; "
                            "rebuild it with CharTokenizer.from_text")
        object.__setattr__(self, "_stoi", {c: i for i, c in enumerate(self.chars)})

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        return cls(tuple(sorted(set(text))))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def unknown(self, text: str) -> list[str]:
        """Characters of ``text`` outside the vocabulary, sorted, so errors can name them all."""
        return sorted(set(text) - self._stoi.keys())

    def encode(self, text: str) -> list[int]:
        missing = self.unknown(text)
        if missing:
            shown = ", ".join(repr(c) for c in missing[:10]) + (" ..." if len(missing) > 10 else "")
            raise DataError(f"text holds {len(missing)} character(s) not in the {self.vocab_size}-character "
                            f"vocabulary: {shown}; remove them or train on data that contains them")
        return [self._stoi[c] for c in text]

    def encode_tensor(self, text: str) -> torch.Tensor:
        """Encode a long text in bulk (code points -> ids by binary search); about 50x faster than
        ``encode`` on the 3.5M-character bundled corpus."""
        missing = self.unknown(text)
        if missing:
            self.encode("".join(missing))  # raises the same message as encode
        if not text:
            return torch.empty(0, dtype=token_dtype(self.vocab_size))
        points = torch.frombuffer(bytearray(text.encode("utf-32-le")), dtype=torch.int32)
        table = torch.tensor([ord(c) for c in self.chars], dtype=torch.int32)
        return torch.searchsorted(table, points).to(token_dtype(self.vocab_size))

    def decode(self, ids: list[int] | torch.Tensor) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.reshape(-1).tolist()
        try:
            return "".join(self.chars[i] for i in ids)
        except IndexError:
            bad = sorted({i for i in ids if not 0 <= i < self.vocab_size})[:10]
            raise DataError(f"token ids {bad} are outside the vocabulary of {self.vocab_size}; "
                            "decode with the tokenizer the model was trained with") from None

    def to_dict(self) -> dict:
        return {"type": "char", "version": CHAR_VOCAB_VERSION, "chars": list(self.chars)}

    @classmethod
    def from_dict(cls, d: dict) -> CharTokenizer:
        if not isinstance(d, dict) or d.get("type") != "char" or not isinstance(d.get("chars"), list):
            raise DataError("a vocabulary file must be a JSON object with type 'char' and a 'chars' list, "
                            f"got keys {sorted(d) if isinstance(d, dict) else type(d).__name__}; "
                            "write it with CharTokenizer.to_json")
        if d.get("version", CHAR_VOCAB_VERSION) > CHAR_VOCAB_VERSION:
            raise DataError(f"vocabulary version {d['version']} is newer than this npas understands "
                            f"({CHAR_VOCAB_VERSION}); upgrade npas")
        return cls(tuple(d["chars"]))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=True)

    @classmethod
    def from_json(cls, text: str) -> CharTokenizer:
        try:
            d = json.loads(text)
        except json.JSONDecodeError as err:
            raise DataError(f"vocabulary file is not valid JSON ({err}); re-export the model") from None
        return cls.from_dict(d)


def token_dtype(vocab_size: int) -> torch.dtype:
    """Smallest integer dtype for the ids: the bundled corpus fits uint8 (3.5 MB instead of 28 MB)."""
    return torch.uint8 if vocab_size <= 256 else torch.int32
