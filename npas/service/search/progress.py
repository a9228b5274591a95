"""What a running search reports: counts for the progress line and its ETA."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field


@dataclass
class Progress:
    """What the progress line shows. ``done``, ``stopped``, ``failed`` and ``best_loss`` count from what
    the study held when this driver started (a resume shows the trials it continues, not 0) and add this
    driver's own (``*_before``: the part it found); the other counts are this driver's unless named
    study_*, and the front is the study's."""

    done: int = 0
    running: int = 0  # handed to a worker and not yet told: training, or paused at a ladder rung
    paused: int = 0  # of the running, those paused at a rung (the ladder), holding no worker
    failed: int = 0
    infeasible: int = 0
    stopped: int = 0
    duplicates: int = 0
    best_loss: float = math.inf
    front_size: int = 0
    study_counted: int = 0  # trials of the whole study that count toward the target
    target: int = 0
    started: float = field(default_factory=time.time)
    done_before: int = 0  # of done, stopped, failed: the study's when this driver started
    stopped_before: int = 0
    failed_before: int = 0

    def start_from(self, done: int, stopped: int, failed: int, best_loss: float, front_size: int,
                   study_counted: int) -> None:
        """What the study already holds as this driver starts."""
        self.done, self.stopped, self.failed = self.done_before, self.stopped_before, self.failed_before = (
            done, stopped, failed)
        self.best_loss, self.front_size, self.study_counted = best_loss, front_size, study_counted

    @property
    def elapsed(self) -> float:
        return time.time() - self.started

    def eta(self) -> float | None:
        """Seconds left at this driver's own pace so far; None before it finished a trial."""
        finished = (self.done - self.done_before) + (self.failed - self.failed_before) + (
            self.stopped - self.stopped_before)
        left = self.target - self.study_counted + self.running
        return None if finished == 0 else self.elapsed / finished * max(left, 0)
