"""The README's Ray cluster block, run as written: token, head, a second node, a driver, a joiner.

Everything runs on loopback (127.0.0.1, every node's IP pinned there) on free ports, with a fresh
HOME (where Ray keeps ~/.ray/auth_token) and a fresh RAY_TMPDIR (where `ray start` records the
head, for `--ray-address auto`), so nothing of the machine's own Ray or token is read or written.
What the test changes in the block, and why, is in `as_run`; everything else is the README's text.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.conftest import ROOT
from tests.docs.blocks import CLUSTER, block, commands
from tests.service.test_faults import free_port

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray_cluster")]  # one at a time: see pyproject
RAY = str(Path(sys.executable).parent / "ray")
TINY = str(ROOT / "tests" / "data" / "tiny.yaml")
FAST = str(ROOT / "tests" / "data" / "fast.yaml")


def cluster_block() -> list[str]:
    """The commands of the README's cluster block, continuation lines joined, comments dropped."""
    return [" ".join(shlex.split(line, comments=True)) for line in commands(block(CLUSTER))]


def as_run(line: str, port: int, db: Path, first_driver: bool) -> tuple[dict[str, str], list[str]]:
    """(environment assignments, argv) of one README line, with only what a test must change:
    the placeholders (HEAD -> 127.0.0.1, port 6379 -> a free port; no PostgreSQL server here, so the
    storage is a SQLite file: the drivers below run one after another, as SQLite allows), the search
    space and, for the driver that creates the study, recipe and trials (full.yaml's proxy trials take
    minutes each; tiny.yaml with the test recipe and two trials exercises the same path; a joiner
    takes them from the study), and for `ray start` what keeps the node on loopback, small
    and killable (its IP, free ports, 1 CPU, --block so its process group holds its daemons)."""
    line = line.replace("HEAD:6379", f"127.0.0.1:{port}").replace("--port 6379", f"--port {port}")
    line = re.sub(r"postgresql\+psycopg://\S+", f"sqlite:///{db}", line)
    words = shlex.split(line)
    env = {}
    while re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    prog, args = words[0], words[1:]
    if prog == "ray":
        argv = [RAY, *args]
        if args[0] == "start":
            argv += ["--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--disable-usage-stats", "--block",
                     "--node-manager-port", str(free_port()), "--object-manager-port", str(free_port()),
                     "--dashboard-agent-listen-port", str(free_port()), "--metrics-export-port", str(free_port()),
                     "--runtime-env-agent-port", str(free_port()),
                     "--dashboard-agent-grpc-port", str(free_port())]
            if "--head" in args:
                argv += ["--include-dashboard", "false", "--dashboard-port", str(free_port())]
        return env, argv
    assert prog == "npas", line
    args = [TINY if a == "search_spaces/full.yaml" else a for a in args]
    return env, [sys.executable, "-m", "npas", *args, *(["--recipe", FAST, "--trials", "2"] if first_driver else [])]


def ours(marker: str) -> list[int]:
    """Pids of processes whose command line names this test's temp dir: this test's Ray daemons."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if marker in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(proc.name))
    return pids


def test_the_readme_cluster_block_runs_a_search(tmp_path):
    lines = cluster_block()
    home = tmp_path / "home"
    home.mkdir()
    ray_tmp = tempfile.mkdtemp(prefix="nrc-", dir="/tmp")  # short: Ray's unix socket paths have a length limit
    # the user's environment as a fresh machine has it: no Ray auth mode, token or address of our own
    base = {k: v for k, v in os.environ.items()
            if k not in {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS"}}
    base.update(HOME=str(home), RAY_TMPDIR=ray_tmp)
    port, db = free_port(), tmp_path / "npas.db"
    nodes: list[subprocess.Popen] = []
    drivers: list[subprocess.CompletedProcess] = []
    started = 0

    def status() -> str:  # the test's own look at the cluster, with the token the nodes use
        out = subprocess.run([RAY, "status", "--address", f"127.0.0.1:{port}"], capture_output=True, text=True,
                             env={**base, "RAY_AUTH_MODE": "token"}, timeout=60)
        return out.stdout if out.returncode == 0 else ""

    def start(argv: list[str], env: dict[str, str]) -> None:
        """`ray start` until the cluster shows one more node. Ray gives a node 30 s to register with
        the head, hard-coded; on a loaded machine that can pass, and the node is started again."""
        for attempt in range(3):
            log = tmp_path / f"node{len(nodes)}-{attempt}.log"
            node = subprocess.Popen(argv, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                                    start_new_session=True)
            nodes.append(node)
            want, end = rf"/{sum(n.poll() is None for n in nodes)}\.0 CPU", time.time() + 180
            while time.time() < end and node.poll() is None and not re.search(want, status()):
                time.sleep(1)
            if node.poll() is None and re.search(want, status()):
                return
            text = log.read_text()
            assert node.poll() is not None and "timed out during startup" in text, f"{argv}\n{text[-3000:]}"
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.pid, signal.SIGKILL)  # what the failed start left running
        raise AssertionError(f"{argv} timed out during startup 3 times")

    try:
        for line in lines:
            env, argv = as_run(line, port, db, first_driver=not drivers)
            if argv[:2] == [RAY, "start"]:
                start(argv, {**base, **env})
                started += 1
            elif argv[0] == RAY:
                out = subprocess.run(argv, env={**base, **env}, capture_output=True, text=True, timeout=60)
                assert out.returncode == 0, out.stderr[-2000:]
            else:
                out = subprocess.run(argv, env={**base, **env}, cwd=ROOT, capture_output=True, text=True,
                                     timeout=600)
                assert out.returncode == 0, f"{line}\n{out.stderr[-3000:]}"
                drivers.append(out)
        assert (home / ".ray" / "auth_token").is_file(), "the block did not give the cluster a token"
        assert started == 2 and len(drivers) == 2, lines
        trials = optuna.load_study(study_name="full-025", storage=f"sqlite:///{db}").trials
        assert sum(t.state == TrialState.COMPLETE for t in trials) == 2, [(t.number, t.state) for t in trials]
    finally:
        for node in nodes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.pid, signal.SIGKILL)
        for node in nodes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.wait(timeout=60)
        for pid in ours(ray_tmp):  # a daemon that left the node's process group
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        subprocess.run(["rm", "-rf", ray_tmp], check=False)
