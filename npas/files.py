"""Reading the files a user names (spaces, recipes, allocations, vocabularies), defensively.

A file may be missing, a directory, unreadable, UTF-16 or Latin-1 encoded, or binary; each of those
becomes one line that names the file and the fix (exit 2), never a traceback.
"""

from __future__ import annotations

from pathlib import Path

from npas.errors import ConfigError, NpasError


def read_text(path: Path, what: str, error: type[NpasError] = ConfigError) -> str:
    """The UTF-8 text of `path`; `what` names the file's role in the message (e.g. "allocation")."""
    try:
        blob = path.read_bytes()
    except IsADirectoryError:
        raise error(f"{what} {path} is a directory; give a file") from None
    except OSError as e:
        raise error(f"cannot read {what} {path} ({e.strerror}); check the path and its permissions") from None
    if blob.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise error(f"{what} {path} is UTF-16 text; save it as UTF-8") from None
    if b"\x00" in blob:
        raise error(f"{what} {path} holds NUL bytes (binary, or UTF-16 without a byte-order mark); "
                    f"give a UTF-8 text file") from None
    try:
        return blob.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{what} {path} is not UTF-8 (undecodable byte at offset {e.start}); save it as UTF-8 "
                    f"(e.g. iconv -f latin1 -t utf-8)") from None
