"""The CPU training pool every bench trains its missing runs on (the lent GPU's runner,
``experiments/device.py run``, has its own per-group pools with a deadline)."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any


def run_pool(todo: Sequence[Any], worker: Any, args: Any, save: Any, workers: int, fits: Any = None) -> int:
    """The CPU benches' one training loop: ``worker(*args(job))`` for each job of ``todo``, at most
    ``workers`` at a time on spawned processes (in this process when ``workers`` is 1), in order;
    ``save(job, record)`` runs here the moment a job finishes, so a killed bench keeps every finished
    run. With ``fits(job) -> bool`` (a time box), a job starts only while it fits: one that would overrun
    gives way to a cheaper one behind it, and none starts once nothing fits. Returns how many ran."""
    queue = list(todo)

    def take() -> Any:
        for i, job in enumerate(queue):
            if fits is None or fits(job):
                return queue.pop(i)
        return None

    ran = 0
    if workers <= 1:
        while queue and (job := take()) is not None:
            save(job, worker(*args(job)))
            ran += 1
        return ran
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        live: dict[Future, Any] = {}
        while queue or live:
            while queue and len(live) < workers and (job := take()) is not None:
                live[pool.submit(worker, *args(job))] = job
            if not live:
                break
            done, _ = wait(list(live), return_when=FIRST_COMPLETED)
            for fut in done:
                save(live.pop(fut), fut.result())
                ran += 1
    return ran
