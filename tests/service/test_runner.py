"""Ray start-up: the background start that overlaps the driver's own set-up."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.slow  # a Ray started in a subprocess
def test_ray_started_in_the_background_stays_up(tmp_path):
    """Ray fate-shares its daemons with the thread that spawned them; the early start's thread must
    outlive init, or the embedded cluster dies as soon as it is ready. A fresh process checks it."""
    code = (
        "import time, ray\n"
        "from npas.service.execution.session import start_ray_early, init_ray\n"
        "start_ray_early(None)\n"
        "init_ray()\n"
        "time.sleep(3)\n"  # a returned thread would have had its daemons SIGKILLed by now
        "print('tasks', sum(ray.get([ray.remote(lambda i: i).remote(i) for i in range(4)])))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "tasks 6" in out.stdout
    assert "Token authentication is enabled" not in out.stderr


def test_auto_with_a_stale_cluster_record_fails_fast(tmp_path, monkeypatch):
    """`ray start --head` records its address; after that head stopped, `--ray-address auto` must say
    so at once instead of ray.init retrying for minutes."""
    import socket

    from npas.errors import RayError
    from npas.service.execution import session as runner

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nobody listens there
    (tmp_path / "ray_current_cluster").write_text(f"127.0.0.1:{port}\n")
    monkeypatch.setattr(runner, "RAY_TEMP", tmp_path)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(RayError, match=r"cannot reach Ray at '127\.0\.0\.1:\d+' from the cluster record .*stale"):
        runner.check_address_reachable("auto", timeout_s=2)
    (tmp_path / "ray_current_cluster").unlink()
    with pytest.raises(RayError, match="found no Ray cluster"):
        runner.check_address_reachable("auto")


@pytest.mark.slow  # a Ray started in a subprocess
def test_a_run_that_raises_is_reported_once_not_retried(tmp_path):
    """A proxy run that raises would raise again on every attempt: the trainable reports it as the
    trial's failure, so Tune's FailureConfig (for lost workers and nodes) does not retry it."""
    code = (
        "import json, ray\n"
        "from ray import tune\n"
        "from npas.allocation.config import Chassis, reference_config\n"
        "from npas.service.execution.worker import WorkerSpec, trainable\n"
        "from npas.training.data import load_corpus\n"
        "from npas.training.recipe import load_recipe\n"
        "ray.init(address='local', num_cpus=1, include_dashboard=False, log_to_driver=False)\n"
        f"rec = load_recipe({str(ROOT / 'tests' / 'data' / 'fast.yaml')!r})\n"
        "corpus = load_corpus(None)\n"
        "cfg = reference_config(Chassis(vocab_size=corpus.vocab_size, context=16, d_model=32, n_layers=2,\n"
        "                               n_heads=4, d_ff=64, activation='gelu'))  # shorter than seq_len 32\n"
        "tuner = tune.Tuner(tune.with_parameters(trainable, spec=WorkerSpec.embedded(corpus)),\n"
        "                   param_space={'allocation': cfg.to_dict(), 'recipe': rec.to_dict()},\n"
        f"                   run_config=tune.RunConfig(storage_path={str(tmp_path)!r}, verbose=0,\n"
        "                                             failure_config=tune.FailureConfig(max_failures=2)))\n"
        "r = tuner.fit()[0]\n"
        "print('ERROR', r.error is not None)\n"
        "print('PROXY', json.loads(r.metrics['proxy'])['failure_reason'] if r.metrics and 'proxy' in r.metrics else None)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ERROR False" in out.stdout, out.stdout + out.stderr[-2000:]
    assert "PROXY the proxy run raised ConfigError: recipe 'fast' has seq_len=32" in out.stdout
