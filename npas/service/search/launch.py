"""How and where a search runs (Ray Tune's RunConfig concerns), apart from what it searches, and
the checks on it that need nothing started: the CLI runs them before it boots Ray in the background.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from npas.errors import ArgumentError, StudyError
from npas.service.study.urls import check_url

if TYPE_CHECKING:
    import optuna

    from npas.service.search.progress import Progress


@dataclass(frozen=True)
class Launch:
    """How and where to run (Ray Tune's RunConfig concerns), apart from what to search.

    `early_stop=None` means: the study's stored setting (ASHA on, for a new study)."""

    ray_address: str | None = None
    workers: int = 2
    gpus_per_trial: float = 0.0
    early_stop: bool | None = None
    max_retries: int = 2
    # where Tune keeps the trials' checkpoints (the ladder pauses and resumes trials from them): a path or
    # a storage URI (s3://, gs://, hdfs://) every node can reach; None: trials/runs/ray on this machine
    checkpoint_storage: str | None = None
    on_progress: Callable[[Progress], None] | None = None
    on_trial_done: Callable[[optuna.Study], None] | None = None  # e.g. refresh the HTML report


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# Launch field -> (its test, what it must be): the Python API builds a Launch by hand
_LAUNCH_TYPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "ray_address": (lambda v: v is None or isinstance(v, str), "None or an address string"),
    "workers": (_is_int, "an int"),
    "gpus_per_trial": (lambda v: isinstance(v, int | float) and not isinstance(v, bool), "a number"),
    "early_stop": (lambda v: v is None or isinstance(v, bool), "None, True or False"),
    "max_retries": (_is_int, "an int"),
    "checkpoint_storage": (lambda v: v is None or isinstance(v, str | os.PathLike), "None or a path or URI string"),
    "on_progress": (lambda v: v is None or callable(v), "None or a callable"),
    "on_trial_done": (lambda v: v is None or callable(v), "None or a callable"),
}


def check_types(trials: Any, launch: Any, storage: Any) -> None:
    """The Python API's types of what `check_inputs` checks, each refused in one line (ArgumentError)."""
    if trials is not None and not _is_int(trials):
        raise ArgumentError(f"trials must be an int or None, got {trials!r} ({type(trials).__name__})")
    if storage is not None and not isinstance(storage, str):
        raise ArgumentError(f"storage must be a URL string such as 'sqlite:///trials/npas.db' or None, got "
                            f"{storage!r} ({type(storage).__name__})")
    if not isinstance(launch, Launch):
        raise ArgumentError(f"launch must be an npas.service.search.launch.Launch, got {type(launch).__name__}; "
                            "e.g. Launch(workers=2)")
    for name, (ok, what) in _LAUNCH_TYPES.items():
        value = getattr(launch, name)
        if not ok(value):
            raise ArgumentError(f"Launch.{name} must be {what}, got {value!r} ({type(value).__name__})")


def check_inputs(trials: int | None, launch: Launch, storage: str | None) -> Launch:
    """Counts that can never work and a storage URL that cannot, refused before the database or Ray
    is touched (the CLI calls this before it starts Ray in the background). Returns the launch with a
    local --checkpoint-storage written out in full (`~` expanded)."""
    check_types(trials, launch, storage)
    check_url(storage)
    if launch.checkpoint_storage is not None and not isinstance(launch.checkpoint_storage, str):
        launch = replace(launch, checkpoint_storage=os.fspath(launch.checkpoint_storage))
    problems = []
    if trials is not None and trials < 1:
        problems.append(f"--trials must be >= 1, got {trials}")
    if launch.workers < 1:
        problems.append(f"--workers must be >= 1, got {launch.workers}")
    if not launch.gpus_per_trial >= 0:  # also NaN
        problems.append(f"--gpus-per-trial must be >= 0, got {launch.gpus_per_trial}")
    if launch.max_retries < 0:
        problems.append(f"max_retries must be >= 0, got {launch.max_retries}")
    if launch.checkpoint_storage is not None:
        problems += checkpoint_storage_problems(launch.checkpoint_storage)
    if problems:
        raise StudyError("; ".join(problems))
    where = launch.checkpoint_storage
    if where is not None and "://" not in where and where.startswith("~"):
        launch = replace(launch, checkpoint_storage=str(Path(where).expanduser()))
    return launch


# storage URI schemes pyarrow's filesystems read (Ray Tune's storage goes through them), and the scheme
# each filesystem's ``type_name`` is written back as (``climb_store.checkpoint_uri``)
STORAGE_SCHEMES = ("s3", "gs", "gcs", "hdfs", "viewfs", "file")


PROBE_S = 10.0  # how long a storage URI may take to answer npas's one look at it before it is refused
_REACHED: set[str] = set()  # URIs that answered in this process: a plan checked twice probes once


def checkpoint_storage_problems(where: str) -> list[str]:
    """A ``--checkpoint-storage`` that cannot work, refused before the study is written: empty; a local
    path that is relative (each Ray worker would resolve it in its own working directory), a file, below
    a file, or not writable; a URI whose scheme no pyarrow filesystem reads, that names no bucket, or
    that pyarrow cannot open or get an answer from within ``PROBE_S`` (an unreachable bucket, missing
    credentials: Ray Tune would otherwise retry for minutes after the study was written)."""
    if not where.strip():
        return ["--checkpoint-storage is empty; give a path every node can reach, or an s3:// or gs:// URI"]
    if "\0" in where:
        return ["--checkpoint-storage holds a NUL byte; give a path every node can reach, or an s3:// or gs:// URI"]
    scheme, sep, rest = where.partition("://")
    if not sep:
        return _local_problems(where, Path(where).expanduser())
    if scheme.lower() not in STORAGE_SCHEMES:
        return [f"--checkpoint-storage {_shown(where)}: {scheme}:// is not a storage Ray Tune reads; use a path "
                f"every node can reach or a URI with one of {', '.join(s + '://' for s in STORAGE_SCHEMES)}"]
    if scheme.lower() == "file":
        if not rest.startswith("/"):
            return [f"--checkpoint-storage {where}: a file:// URI takes an absolute path (file:///abs/dir), "
                    "or give the path itself"]
        return _local_problems(where, Path(rest))
    if not rest.split("?")[0].split("/")[0].rpartition("@")[2]:
        return [f"--checkpoint-storage {_shown(where)} names no bucket or host; give e.g. {scheme}://bucket/npas"]
    problem = _probe(where)
    return [] if problem is None else [problem]


def _local_problems(where: str, path: Path) -> list[str]:
    """A local (or mounted, shared) directory Ray Tune can create and write."""
    if not path.is_absolute():
        return [f"--checkpoint-storage {where} is a relative path, which each Ray worker resolves in its own "
                f"working directory; give an absolute path every node can reach, e.g. {path.resolve()}"]
    if path.exists() and not path.is_dir():
        return [f"--checkpoint-storage {where} is a file; give a directory (it is created if missing)"]
    parent = next(p for p in (path, *path.parents) if p.exists())
    if not parent.is_dir():
        return [f"--checkpoint-storage {where}: {parent} is a file, so nothing can be created below it; give "
                "another directory"]
    if not os.access(parent, os.W_OK | os.X_OK):
        return [f"--checkpoint-storage {where}: {parent} is not writable; give a directory you can write"]
    return []


def _shown(uri: str) -> str:
    """A storage URI without its credentials (user:secret@) or options (?access_key=...)."""
    scheme, _, rest = uri.partition("://")
    host, slash, path = rest.split("?")[0].partition("/")
    return f"{scheme}://{host.rpartition('@')[2]}{slash}{path}"


def _probe(uri: str) -> str | None:
    """Why pyarrow cannot look at `uri` (the filesystem Ray Tune will use), or None. The look runs in a
    daemon thread given ``PROBE_S``: a cloud filesystem retries an unreachable endpoint for minutes."""
    if uri in _REACHED:
        return None
    outcome: dict[str, BaseException] = {}

    def look() -> None:
        try:
            from pyarrow.fs import FileSystem

            fs, path = FileSystem.from_uri(uri)
            fs.get_file_info(path)
        except BaseException as e:  # noqa: BLE001 - any failure is the reason given to the user
            outcome["error"] = e

    thread = threading.Thread(target=look, name="npas-checkpoint-storage-probe", daemon=True)
    thread.start()
    thread.join(PROBE_S)
    if thread.is_alive():
        return (f"--checkpoint-storage {_shown(uri)} did not answer within {PROBE_S:g} s (an unreachable "
                "endpoint or bucket, or missing credentials?); check it from this machine, or give a path every "
                "node can reach")
    if "error" in outcome:
        reason = " ".join(str(outcome["error"]).split())[:200] or type(outcome["error"]).__name__
        return (f"--checkpoint-storage {_shown(uri)} cannot be opened ({reason}); check the URI and its "
                "credentials from this machine, or give a path every node can reach")
    _REACHED.add(uri)
    return None


