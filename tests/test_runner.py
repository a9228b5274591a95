"""Ray start-up: the background start that overlaps the driver's own set-up."""

from __future__ import annotations

import subprocess
import sys


def test_ray_started_in_the_background_stays_up(tmp_path):
    """Ray fate-shares its daemons with the thread that spawned them; the early start's thread must
    outlive init, or the embedded cluster dies as soon as it is ready. A fresh process checks it."""
    code = (
        "import time, ray\n"
        "from npas.service.runner import start_ray_early, init_ray\n"
        "start_ray_early(None)\n"
        "init_ray()\n"
        "time.sleep(3)\n"  # a returned thread would have had its daemons SIGKILLed by now
        "print('tasks', sum(ray.get([ray.remote(lambda i: i).remote(i) for i in range(4)])))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "tasks 6" in out.stdout
    assert "Token authentication is enabled" not in out.stderr
