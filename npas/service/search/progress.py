"""What a running search reports: counts for the progress line and its ETA."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field


@dataclass
class Progress:
    """What the progress line shows; counts are this driver's unless named study_*."""

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

    @property
    def elapsed(self) -> float:
        return time.time() - self.started

    def eta(self) -> float | None:
        finished = self.done + self.failed + self.stopped
        left = self.target - self.study_counted + self.running
        return None if finished == 0 else self.elapsed / finished * max(left, 0)
