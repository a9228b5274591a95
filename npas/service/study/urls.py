"""Storage URLs: where a study lives, checked before anything starts, and shown without secrets.

A URL can carry a secret in its password and in query parameters (`password=`, `sslpassword=`,
`...token=` ...); every message shows `redact(url)`, and errors from SQLAlchemy or psycopg, which
echo the URL or a connection string, pass through `scrub`. Only SQLAlchemy is imported here, so the
CLI can check a URL before it starts Ray in the background.
"""

from __future__ import annotations

import os
import re
from urllib.parse import parse_qsl

import sqlalchemy
from sqlalchemy.engine import make_url

from npas.errors import StorageError

DEFAULT_STORAGE = "sqlite:///trials/npas.db"
SUPPORTED = ("sqlite", "postgresql", "mysql")
SECRET_KEY = re.compile(r"pass|secret|token|key|auth|cred", re.I)  # query parameters that may hold a secret
HIDDEN = "***"


def resolve_url(url: str | None = None) -> str:
    """`--storage`, else `NPAS_STORAGE`, else SQLite at trials/npas.db (relative to the cwd)."""
    return url or os.environ.get("NPAS_STORAGE") or DEFAULT_STORAGE


def _secrets(url: str) -> list[str]:
    """Every secret value the URL carries: its password and sensitive query parameters."""
    found: list[str] = []
    try:
        parsed = make_url(url)
        if parsed.password:
            found.append(str(parsed.password))
        for k, v in parsed.query.items():
            if SECRET_KEY.search(k):
                found.extend([v] if isinstance(v, str) else list(v))
    except Exception:  # unparsable: fall back to the raw text
        _, _, query = url.partition("?")
        found.extend(v for k, v in parse_qsl(query, keep_blank_values=False) if SECRET_KEY.search(k))
        m = re.match(r"[^:/]+://[^:/@]*:([^@]*)@", url)
        if m:
            found.append(m.group(1))
    return [s for s in found if s]


_KV_SECRET = re.compile(r"(\b\w*(?:pass|secret|token|key|auth|cred)\w*\s*[=:]\s*)('[^']*'|\"[^\"]*\"|[^\s&;,)]+)", re.I)
_USERINFO = re.compile(r"(\w[\w+.-]*://[^:/@\s]*:)([^@\s]+)(@)")


def scrub(text: str, url: str | None = None) -> str:
    """`text` with every secret of `url` and anything shaped like `password=...` or `user:pw@` hidden:
    SQLAlchemy and psycopg echo the URL or the connection string in their errors."""
    for secret in sorted(_secrets(url), key=len, reverse=True) if url else []:
        text = text.replace(secret, HIDDEN)
    text = _USERINFO.sub(lambda m: m.group(1) + HIDDEN + m.group(3), text)
    return _KV_SECRET.sub(lambda m: m.group(1) + HIDDEN, text)


def redact(url: str) -> str:
    """The URL with its password and every sensitive query parameter replaced by ***."""
    try:
        parsed = make_url(url)
        query = {k: (HIDDEN if SECRET_KEY.search(k) else v) for k, v in parsed.query.items()}
        return parsed.set(query=query).render_as_string(hide_password=True).replace("%2A%2A%2A", HIDDEN)
    except Exception:  # an unparsable URL may still hold a secret: show only its scheme
        return url.split(":", 1)[0] + "://…"


def parse_url(url: str) -> sqlalchemy.engine.URL:
    try:
        parsed = make_url(url)
    except Exception:
        raise StorageError(
            f"storage URL {redact(url)!r} does not parse; use e.g. sqlite:///trials/npas.db or "
            f"postgresql+psycopg://user@host:5432/db"
        ) from None
    backend = parsed.get_backend_name()
    if backend not in SUPPORTED:
        raise StorageError(
            f"unknown storage backend {backend!r} in {redact(url)}; supported: {', '.join(SUPPORTED)} "
            f"(e.g. sqlite:///trials/npas.db, postgresql+psycopg://user@host/db)"
        )
    if backend == "postgresql" and parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")  # the driver npas installs (psycopg 3)
    return parsed


def check_url(url: str | None = None) -> None:
    """Refuse a URL that does not parse, names an unsupported backend, or keeps nothing: an in-memory
    SQLite database (`sqlite://`, `sqlite:///:memory:`, `mode=memory`) vanishes when npas exits, taking
    the study with it. All before anything starts."""
    if url is not None and not url.strip():
        raise StorageError("storage URL is empty; give one such as sqlite:///trials/npas.db, or omit --storage "
                           "for $NPAS_STORAGE or the default")
    raw = resolve_url(url)
    parsed = parse_url(raw)
    if parsed.get_backend_name() == "sqlite":
        db = str(parsed.database or "")
        if db in ("", ":memory:") or "mode=memory" in db or parsed.query.get("mode") == "memory" \
                or db.startswith("file::memory:"):
            raise StorageError(f"storage {redact(raw)} is an in-memory SQLite database: the study would vanish "
                               f"when npas exits; give a file, e.g. sqlite:///trials/npas.db")
