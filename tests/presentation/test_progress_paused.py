"""The progress line tells trials paused at a ladder rung (holding no worker) from those training."""

from __future__ import annotations

from npas.presentation.cli.search import _progress_printer
from npas.service.search.progress import Progress


def test_the_progress_line_counts_paused_trials_apart(capsys):
    show = _progress_printer()
    show(Progress(done=1, running=5, paused=3, target=8, study_counted=6))
    line = capsys.readouterr().err
    assert "done 1 running 2 paused 3 " in line
    show(Progress(done=1, running=2, target=8, study_counted=3))  # a cosine search never pauses
    assert "running 2 stopped" in capsys.readouterr().err
