"""How and where a search runs (Ray Tune's RunConfig concerns), apart from what it searches, and
the checks on it that need nothing started: the CLI runs them before it boots Ray in the background.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from npas.errors import StudyError
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


def check_inputs(trials: int | None, launch: Launch, storage: str | None) -> Launch:
    """Counts that can never work and a storage URL that cannot, refused before the database or Ray
    is touched (the CLI calls this before it starts Ray in the background)."""
    check_url(storage)
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
    return launch


# storage URI schemes pyarrow's filesystems read (Ray Tune's storage goes through them), and the scheme
# each filesystem's ``type_name`` is written back as (``checkpoint_uri``)
STORAGE_SCHEMES = ("s3", "gs", "gcs", "hdfs", "viewfs", "file")
URI_SCHEME_OF = {"s3": "s3", "gcs": "gs", "hdfs": "hdfs"}


def checkpoint_storage_problems(where: str) -> list[str]:
    """A ``--checkpoint-storage`` that cannot work, known without touching it: empty, or a URI whose
    scheme no pyarrow filesystem reads (an unreachable bucket is Ray's to report when it starts)."""
    if not where.strip():
        return ["--checkpoint-storage is empty; give a path every node can reach, or an s3:// or gs:// URI"]
    scheme, sep, _ = where.partition("://")
    if sep and scheme.lower() not in STORAGE_SCHEMES:
        return [f"--checkpoint-storage {where}: {scheme}:// is not a storage Ray Tune reads; use a path every "
                f"node can reach or a URI with one of {', '.join(s + '://' for s in STORAGE_SCHEMES)}"]
    return []


def checkpoint_uri(filesystem: object, path: str) -> str | None:
    """What a later driver can resume a checkpoint from: its path on a local (or shared, mounted)
    filesystem, else its URI on the storage it was saved to; None for a filesystem npas cannot name."""
    from pyarrow.fs import LocalFileSystem

    if isinstance(filesystem, LocalFileSystem):
        return path
    scheme = URI_SCHEME_OF.get(getattr(filesystem, "type_name", ""))
    return None if scheme is None else f"{scheme}://{path.lstrip('/')}"
