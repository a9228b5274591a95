"""Study storage: a SQLAlchemy URL resolved to Optuna's own `RDBStorage`, one engine per process.

npas never writes its own storage layer; the database stays readable by `optuna-dashboard` and a
plain `optuna.load_study`. What this module adds: the URL resolution order (flag, `NPAS_STORAGE`,
default SQLite under trials/), errors that name the problem without ever printing a password, and
trial heartbeats so a resume can tell a dead driver's trials from a live one's.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from pathlib import Path

import optuna
import sqlalchemy
from sqlalchemy.engine import make_url

from npas.errors import StorageError

log = logging.getLogger(__name__)

DEFAULT_STORAGE = "sqlite:///trials/npas.db"
SUPPORTED = ("sqlite", "postgresql", "mysql")
HEARTBEAT_S = 10  # a driver beats for its running trials this often...
GRACE_S = 60  # ...and a trial silent this long belongs to a dead driver

_CACHE: dict[str, optuna.storages.RDBStorage] = {}
# heartbeats and metric names are "experimental" in Optuna; npas relies on them knowingly
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def resolve_url(url: str | None = None) -> str:
    """`--storage`, else `NPAS_STORAGE`, else SQLite at trials/npas.db (relative to the cwd)."""
    return url or os.environ.get("NPAS_STORAGE") or DEFAULT_STORAGE


def redact(url: str) -> str:
    """The URL with any password replaced by ***, for every message a user may see."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # an unparsable URL may still hold a secret: show only its scheme
        return url.split(":", 1)[0] + "://…"


def _check(url: str) -> sqlalchemy.engine.URL:
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
    if backend == "sqlite" and parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    return parsed


def open_storage(url: str | None = None) -> optuna.storages.RDBStorage:
    """Optuna's RDBStorage for `url`; cached, so each process holds one engine per database."""
    raw = resolve_url(url)
    if raw in _CACHE:
        return _CACHE[raw]
    parsed = _check(raw)
    full = parsed.render_as_string(hide_password=False)
    engine_kwargs: dict = {"pool_pre_ping": True}
    if parsed.get_backend_name() == "sqlite":
        engine_kwargs["connect_args"] = {"timeout": 60}  # wait for the lock rather than fail at once
    try:
        storage = _create(full, engine_kwargs)
    except Exception as e:  # sqlalchemy OperationalError, psycopg errors, alembic errors ...
        reason = " ".join(str(getattr(e, "orig", None) or e).split())
        reason = reason.replace(parsed.password or "\0", "***") if parsed.password else reason
        raise StorageError(
            f"cannot open storage {redact(raw)}: {reason[:300]}; check the server is running and the URL is right"
        ) from None
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        _tune_sqlite(storage.engine)
    _CACHE[raw] = storage
    return storage


def _is_schema_race(e: Exception) -> bool:
    """Two drivers opening an empty database at once both create Optuna's tables and types; the
    loser gets a unique-violation or 'already exists' error although the schema is now complete."""
    text = str(getattr(e, "orig", None) or e).lower()
    return isinstance(e, sqlalchemy.exc.IntegrityError) or "already exists" in text


def _create(full: str, engine_kwargs: dict, retries: int = 4) -> optuna.storages.RDBStorage:
    def make() -> optuna.storages.RDBStorage:
        return optuna.storages.RDBStorage(
            full, engine_kwargs=engine_kwargs, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S)

    for attempt in range(retries):
        try:
            return make()
        except Exception as e:
            if not _is_schema_race(e):
                raise
            time.sleep(0.2 * (attempt + 1))  # the winner's schema transaction commits within that
    return make()


def _tune_sqlite(engine: sqlalchemy.engine.Engine) -> None:
    """WAL journal and synchronous=NORMAL: a commit costs ~1 ms instead of ~10 ms, and the driver
    commits a few dozen attributes per trial. Still durable against a process crash (kill -9);
    WAL needs a local filesystem, which is what SQLite is for here anyway (clusters use PostgreSQL)."""

    def pragmas(dbapi_conn, _record) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    sqlalchemy.event.listen(engine, "connect", pragmas)
    engine.dispose()  # connections opened before the listener get replaced by tuned ones


def is_sqlite(url: str | None = None) -> bool:
    return _check(resolve_url(url)).get_backend_name() == "sqlite"


def study_names(storage: optuna.storages.BaseStorage) -> list[str]:
    return [s.study_name for s in storage.get_all_studies()]
