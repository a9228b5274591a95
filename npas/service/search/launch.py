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
    if problems:
        raise StudyError("; ".join(problems))
    return launch
