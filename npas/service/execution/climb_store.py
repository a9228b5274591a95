"""A ladder trial's climbs on disk: saved at every rung, found again after its driver stopped or died.

Tune keeps a trial's checkpoints in the trial's directory of the run's storage (``checkpoint_000000``,
``checkpoint_000001``, ...; a local path, or a URI with ``--checkpoint-storage s3://...``) and hands
the newest back to a trial it pauses and resumes itself (``tune.get_checkpoint()``). A *later* driver
(``npas resume``, or a re-enqueued trial after an interrupt) finds it from the study instead: each
trial records its directory when it starts (``TrialAttr.LADDER_DIR``) and the checkpoint Tune last
confirmed (``TrialAttr.LADDER_CHECKPOINT``). The directory is what makes a crash safe: a trial reports
its rung with the checkpoint already written, and only after that does the driver pause it and learn
(a round trip later) where the checkpoint went -- a driver killed in between leaves a checkpoint no
record names. ``restore`` therefore looks in the directory first, newest first, and takes the first
whole checkpoint that loads (a copy cut short by the crash is skipped), then the recorded path.

A re-enqueued trial also carries the optimizer steps its earlier attempt had trained by its last
progress report (``config["steps_before"]``): those past its checkpoint were lost with the driver and
are added to the trial's ``lost_steps``, so ``trained_steps`` counts every step the search paid for.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from npas.training import checkpoint
from npas.training.checkpoint import STATE

if TYPE_CHECKING:
    from npas.service.execution.trial import TrialContext, WorkerSpec
    from npas.training.climb import Climb

log = logging.getLogger(__name__)

META = "ladder.json"  # beside the seeds' checkpoints: what the trial spent so far (wall time, lost steps, ...)
CHECKPOINT = re.compile(r"checkpoint_(\d+)$")  # Tune's checkpoint directories in a trial's directory


def seed_dir(root: str | Path, i: int) -> Path:
    return Path(root) / f"seed-{i}"


def is_checkpoint(root: str | Path, repeats: int) -> bool:
    """Whether ``root`` holds a whole climb checkpoint of ``repeats`` seeds (every save finished)."""
    return (Path(root) / META).is_file() and all((seed_dir(root, i) / STATE).is_file() for i in range(repeats))


def save_climbs(climbs: list[Climb], root: str | Path, meta: dict[str, Any]) -> None:
    for i, c in enumerate(climbs):
        checkpoint.save(c, seed_dir(root, i))
    (Path(root) / META).write_text(json.dumps(meta) + "\n", encoding="utf-8")  # last: marks a whole save


def load_climbs(root: str | Path, cfg: Any, corpus: Any, spec: WorkerSpec | TrialContext, repeats: int) -> tuple[list[Climb], dict]:
    climbs = [checkpoint.load(seed_dir(root, i), cfg, corpus, reference=spec.reference) for i in range(repeats)]
    return climbs, json.loads((Path(root) / META).read_text(encoding="utf-8"))


def from_storage(uri: str, cfg: Any, corpus: Any, spec: WorkerSpec | TrialContext, repeats: int) -> tuple[list[Climb], dict] | None:
    """The climbs of a checkpoint on Ray's storage (``--checkpoint-storage s3://...``: a URI recorded by
    another driver), or None when ``uri`` is a plain path or holds no whole checkpoint (the trial
    then starts afresh, as it does when a local checkpoint is gone)."""
    if "://" not in uri:
        return None
    from ray.train import Checkpoint

    try:
        with Checkpoint(uri).as_directory() as d:
            return load_climbs(d, cfg, corpus, spec, repeats) if is_checkpoint(d, repeats) else None
    except (OSError, ValueError) as e:  # gone, or unreadable: nothing to resume from
        log.warning("cannot resume from %s (%s); the trial starts afresh", uri, e)
        return None


def filesystem(where: str) -> tuple[Any, str]:
    """A pyarrow filesystem and the path on it, for a local path or a storage URI."""
    from pyarrow.fs import FileSystem, LocalFileSystem

    if "://" in where:
        return FileSystem.from_uri(where)
    return LocalFileSystem(), str(Path(where).resolve())


# the scheme each pyarrow filesystem's ``type_name`` is written back as
URI_SCHEME_OF = {"s3": "s3", "gcs": "gs", "hdfs": "hdfs"}


def checkpoint_uri(filesystem: object, path: str) -> str | None:
    """What a later driver can resume a checkpoint from: its path on a local (or shared, mounted)
    filesystem, else its URI on the storage it was saved to; None for a filesystem npas cannot name."""
    from pyarrow.fs import LocalFileSystem

    if isinstance(filesystem, LocalFileSystem):
        return path
    scheme = URI_SCHEME_OF.get(getattr(filesystem, "type_name", ""))
    return None if scheme is None else f"{scheme}://{path.lstrip('/')}"


def name_of(fs: Any, path: str) -> str:
    """``path`` on ``fs`` as a recorded location: the path itself here, a URI on cloud storage."""
    return checkpoint_uri(fs, path) or path


def checkpoints_in(trial_dir: str) -> list[str]:
    """The checkpoint directories in a trial's directory, newest first (Tune numbers them in order);
    empty when the directory is gone or unreadable."""
    from pyarrow.fs import FileSelector, FileType

    try:
        fs, root = filesystem(trial_dir)
        found = [(int(m.group(1)), info.path) for info in fs.get_file_info(FileSelector(root, allow_not_found=True))
                 if info.type == FileType.Directory and (m := CHECKPOINT.match(info.base_name))]
    except (OSError, ValueError) as e:
        log.warning("cannot list the checkpoints in %s (%s)", trial_dir, e)
        return []
    return [name_of(fs, p) for _, p in sorted(found, reverse=True)]


def _load(where: str, cfg: Any, corpus: Any, spec: WorkerSpec | TrialContext, repeats: int) -> tuple[list[Climb], dict] | None:
    if "://" in where:
        return from_storage(where, cfg, corpus, spec, repeats)
    if not is_checkpoint(where, repeats):
        return None
    try:
        return load_climbs(where, cfg, corpus, spec, repeats)
    except Exception as e:  # a file cut short by the crash: an older checkpoint may still be whole
        log.warning("cannot resume from %s (%s: %s); trying an older checkpoint", where, type(e).__name__, e)
        return None


def restore(config: dict[str, Any], cfg: Any, corpus: Any, spec: WorkerSpec | TrialContext,
            repeats: int) -> tuple[list[Climb], dict[str, Any], str] | None:
    """A re-enqueued trial's climbs, their meta and where they were found: the newest whole checkpoint
    in the earlier attempt's directory (``config["resume_dir"]``), else the one it recorded
    (``config["resume_from"]``); None when neither holds one (the trial starts afresh)."""
    tried = [*(checkpoints_in(config["resume_dir"]) if config.get("resume_dir") else []),
             *([config["resume_from"]] if config.get("resume_from") else [])]
    for where in dict.fromkeys(tried):
        if (got := _load(where, cfg, corpus, spec, repeats)) is not None:
            return (*got, where)
    return None


def count_lost(meta: dict[str, Any], spent: int, steps_before: int | None) -> int:
    """Add to ``meta["lost_steps"]`` the steps an earlier attempt trained past what was restored
    (``spent``: the restored climbs' steps, their rate grid's and the steps already counted lost;
    ``steps_before``: what the attempt had trained by its last progress report). Returns the total."""
    lost = int(meta.get("lost_steps", 0)) + max(0, int(steps_before or 0) - spent)
    meta["lost_steps"] = lost
    return lost


def remove(where: str) -> None:
    """Delete a checkpoint directory (a path or a URI); one already gone is fine."""
    try:
        fs, path = filesystem(where)
        fs.delete_dir(path)
    except (OSError, ValueError) as e:
        if not isinstance(e, FileNotFoundError):
            log.debug("could not remove %s: %s", where, e)
