"""Study storage: a SQLAlchemy URL resolved to Optuna's own `RDBStorage`, one engine per process.

npas never writes its own storage layer; the database stays readable by `optuna-dashboard` and a
plain `optuna.load_study`. What this module adds: the URL resolution order (flag, `NPAS_STORAGE`,
default SQLite under trials/, in `npas.service.study.urls` with the redaction of secrets), one
`StorageHandle` per database and process that carries the URL, its redacted form for messages and
the opened storage together, and read-only opening that never creates a file.
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import optuna
import sqlalchemy

from npas.errors import StorageError
from npas.service.study.faults import GRACE_S, HEARTBEAT_S
from npas.service.study.urls import parse_url, redact, resolve_url, scrub

log = logging.getLogger(__name__)

# heartbeats and metric names are "experimental" in Optuna; npas relies on them knowingly
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


@dataclass(frozen=True)
class StorageHandle:
    """One opened database: the full URL (never shown), its redacted form (for every message) and
    Optuna's storage over it. `open_storage` returns the same handle for the same URL in a process."""

    url: str
    redacted: str
    storage: optuna.storages.RDBStorage
    backend: str
    read_only: bool = False

    @property
    def is_sqlite(self) -> bool:
        return self.backend == "sqlite"

    def scrub(self, text: str) -> str:
        return scrub(text, self.url)

    @property
    def sqlite_path(self) -> Path | None:
        """The database file of a SQLite URL (files a study keeps beside it go next to it), else None."""
        return _sqlite_file(parse_url(self.url)) if self.is_sqlite else None


_CACHE: dict[tuple[str, bool], StorageHandle] = {}


def _sqlite_file(parsed: sqlalchemy.engine.URL) -> Path | None:
    db = parsed.database
    return None if db in (None, "", ":memory:") or str(db).startswith("file:") else Path(db)


def open_storage(url: str | None = None, *, read_only: bool = False) -> StorageHandle:
    """The handle for `url`, opened once per process.

    `read_only` (studies, front, export, dashboard) never creates anything: a SQLite file that does
    not exist is an error, not a new empty database, and Optuna's tables are not created.
    A writable open creates the SQLite file's directory.
    """
    raw = resolve_url(url)
    for key in ((raw, False), (raw, True)) if read_only else ((raw, False),):
        if key in _CACHE:
            return _CACHE[key]
    parsed = parse_url(raw)
    redacted = redact(raw)
    backend = parsed.get_backend_name()
    path = _sqlite_file(parsed) if backend == "sqlite" else None
    if path is not None and read_only and not path.is_file():
        raise StorageError(f"no database at {path} (from {redacted}); check the path or --storage, "
                           f"or create a study there with `npas search`")
    if path is not None and not read_only:
        path.parent.mkdir(parents=True, exist_ok=True)
    full = parsed.render_as_string(hide_password=False)
    engine_kwargs: dict = {"pool_pre_ping": True}
    if backend == "sqlite":
        engine_kwargs["connect_args"] = {"timeout": 60}  # wait for the lock rather than fail at once
    try:
        storage = _create(full, engine_kwargs, skip_table_creation=read_only)
    except Exception as e:  # sqlalchemy OperationalError, psycopg errors, alembic errors ...
        reason = scrub(" ".join(str(getattr(e, "orig", None) or e).split()), raw)
        hint = ("it is not an Optuna database, or holds no study yet" if read_only
                else "check the server is running and the URL is right")
        raise StorageError(f"cannot open storage {redacted}: {reason[:300]}; {hint}") from None
    if path is not None:
        _tune_sqlite(storage.engine)
    handle = StorageHandle(url=raw, redacted=redacted, storage=storage, backend=backend, read_only=read_only)
    _CACHE[(raw, read_only)] = handle
    return handle


def _is_schema_race(e: Exception) -> bool:
    """Two drivers opening an empty database at once both create Optuna's tables and types; the
    loser gets a unique-violation or 'already exists' error although the schema is now complete."""
    text = str(getattr(e, "orig", None) or e).lower()
    return isinstance(e, sqlalchemy.exc.IntegrityError) or "already exists" in text


def _create(full: str, engine_kwargs: dict, skip_table_creation: bool = False,
            retries: int = 4) -> optuna.storages.RDBStorage:
    def make() -> optuna.storages.RDBStorage:
        storage = optuna.storages.RDBStorage(
            full, engine_kwargs=engine_kwargs, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S,
            skip_table_creation=skip_table_creation)
        if skip_table_creation:
            storage.get_all_studies()  # prove it is an Optuna database before anyone reads it
        return storage

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


def study_names(storage: optuna.storages.BaseStorage) -> list[str]:
    return [s.study_name for s in storage.get_all_studies()]


def reachable(url: str) -> bool:
    """Whether the database at `url` accepts a connection now. For callers that skip (or, in CI, fail)
    their PostgreSQL runs on a missing server rather than raising: the benches and the service tests."""
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect():
            return True
    except Exception:  # a missing server, a driver not installed, a refused login: all mean "not here"
        return False
    finally:
        engine.dispose()
