"""The Ray session a search or a certificate runs in: Ray start-up (early, beside the plan's checks),
an address checked before anything is written, the cluster's resources against a trial's needs, and
SIGTERM as an interrupt. The Optuna study is the source of truth; Ray Tune's experiment directory
(trials/runs/) is scratch. What runs in the session is `npas.service.search.runner` (a search's Tuner)
or `npas.service.certify.retrain` (a certificate's retrainings)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from npas.errors import RayError
from npas.service.execution import ray_adapter

log = logging.getLogger(__name__)

RUNS_DIR = Path("trials") / "runs"  # scratch: Tune's experiment directories and `npas train` outputs
# where `ray start` records the head it started; None: Ray's default temp dir ($RAY_TMPDIR, $TMPDIR or
# /tmp, then ray/), as `ray.init(address="auto")` reads it (tests point it elsewhere)
RAY_TEMP: Path | None = None
AUTH_HINT = ("the cluster uses token authentication: set RAY_AUTH_MODE=token for this driver too "
             "(the token is read from ~/.ray/auth_token or RAY_AUTH_TOKEN, as on the cluster's nodes)")


def init_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Start an embedded Ray (default) or join a cluster (`auto`, `host:port`, `ray://host:port`).

    Waits for a start begun by `start_ray_early`, or starts Ray here if none was begun.
    """
    import ray

    if _EARLY is not None:
        _EARLY.wait()
    if ray.is_initialized():
        return
    _init_ray(address, num_cpus)


def _drop_auth_enabled_notice(record: logging.LogRecord) -> bool:
    """Ray announces on stderr that token auth is on (its secure default); npas's stderr is for its
    own one-line errors and progress. A warning that auth is *disabled* still shows."""
    return not record.getMessage().startswith("Token authentication is enabled for this Ray cluster")


def _init_ray(address: str | None, num_cpus: int | None) -> None:
    import ray

    _quiet_auth_notice()
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
    try:
        if address:
            if address.startswith("ray://"):
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(address=address, **kwargs)
        else:
            # "local": never attach to a cluster that `ray start` left on this machine
            ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), **kwargs)
    except Exception as e:
        text = " ".join(str(e).split())
        if address and (_is_auth_error(e) or "InvalidAuthToken" in text or "auth" in type(e).__name__.lower()):
            raise RayError(f"Ray at {address!r} refused this driver: {text[:160]}; {AUTH_HINT}") from None
        if not isinstance(e, (ConnectionError, RuntimeError, ValueError, TimeoutError)):
            raise
        where = f"Ray at {address!r}" if address else "an embedded Ray"
        hint = ("start a head with `ray start --head` (and RAY_AUTH_MODE=token on joining nodes), or omit "
                "--ray-address to run locally") if address else "check free memory and /tmp space"
        raise RayError(f"cannot start or reach {where}: {' '.join(str(e).split())[:200]}; {hint}") from None


def _quiet_auth_notice() -> None:

    notice = logging.getLogger(ray_adapter.AUTH_NOTICE_LOGGER)
    if _drop_auth_enabled_notice not in notice.filters:
        notice.addFilter(_drop_auth_enabled_notice)


def _is_auth_error(e: BaseException) -> bool:
    from ray.exceptions import AuthenticationError

    return isinstance(e, AuthenticationError)


def ray_start_begun() -> bool:
    """Whether this process began starting Ray in the background (`start_ray_early`). The CLI asks,
    to know whether exiting on an error may skip Ray's graceful shutdown."""
    return _EARLY is not None


class _EarlyStart:
    """`ray.init` on a background thread, so Ray's daemons boot while the driver imports torch, reads
    the corpus and opens the study: the first trial starts seconds sooner.

    The thread stays parked for the life of the process instead of returning: Ray fate-shares the
    daemons it spawns with the *thread* that spawned them (PR_SET_PDEATHSIG on Linux), so a thread
    that returned would take the embedded cluster down with it.
    """

    def __init__(self, address: str | None) -> None:
        self.address = address
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="npas-ray-start", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        try:

            quiet = logging.getLogger(ray_adapter.WORKER_LOGGER)  # "SIGTERM handler is not set ...": npas sets its own
            level = quiet.level
            quiet.setLevel(logging.ERROR)
            try:
                _init_ray(self.address, None)
            finally:
                quiet.setLevel(level)
        except BaseException as e:  # handed to the main thread by wait()
            self._error = e
        finally:
            self._ready.set()
        threading.Event().wait()  # park: see the class docstring

    def wait(self) -> None:
        self._ready.wait()
        if self._error is not None:
            error, self._error = self._error, None
            raise error


_EARLY: _EarlyStart | None = None


def start_ray_early(address: str | None) -> None:
    """Begin starting Ray now, in the background; `init_ray` later waits for it. Idempotent."""
    global _EARLY
    ray = sys.modules.get("ray")  # not imported yet means not initialised; the thread imports it
    if _EARLY is None and not (ray is not None and ray.is_initialized()):
        _EARLY = _EarlyStart(address)


def resolve_address(address: str) -> tuple[str, str]:
    """What `ray.init(address)` would connect to, and where that came from, without connecting:
    `auto` means $RAY_ADDRESS, else the head last started on this machine (Ray's own order)."""
    if address != "auto":
        return address, "--ray-address"
    env = os.environ.get("RAY_ADDRESS", "")
    if env and env != "auto":
        return env, "RAY_ADDRESS"
    if RAY_TEMP is None:

        record = ray_adapter.cluster_record()
    else:
        record = RAY_TEMP / "ray_current_cluster"
    try:
        recorded = record.read_text().strip()
    except OSError:
        recorded = ""
    if not recorded:
        raise RayError("--ray-address auto found no Ray cluster (no RAY_ADDRESS, no head started on this "
                       "machine); start one with `ray start --head`, or pass --ray-address host:port")
    return recorded, f"the cluster record {record}"


def check_address_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast on a `host:port` nobody listens on (ray.init would retry for minutes), including a
    stale record of a head that has since stopped."""
    import socket

    if not address:
        return
    target, origin = resolve_address(address)
    hostport = target.removeprefix("ray://")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise RayError(f"Ray address {target!r} (from {origin}) is not auto, host:port or ray://host:port")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except OSError as e:
        stale = " (a stale record: that head has stopped)" if origin.startswith("the cluster record") else ""
        raise RayError(f"cannot reach Ray at {target!r} from {origin}{stale}: {e.strerror or e}; start a head "
                       f"with `ray start --head --port {port}`, fix the address, or omit --ray-address to run "
                       f"locally") from None
    if not target.startswith("ray://"):
        if origin.startswith("the cluster record"):
            authenticate_like_a_node()
        _probe_gcs(f"{host}:{port}", origin)


def authenticate_like_a_node() -> bool:
    """Token authentication for this driver when RAY_AUTH_MODE is unset and this machine holds a Ray
    token; returns whether the driver now sends its token.

    Ray does the same for `ray start --head` and for `ray.init(address="auto")` when the address comes
    from the cluster record, and npas calls this only then, so the driver of a cluster started on this
    machine connects as its nodes do, with no RAY_AUTH_MODE to remember. The check must come before
    the probe below (Ray would turn auth on only later, inside `ray.init`). An address the user
    named (--ray-address host:port, RAY_ADDRESS) is left to RAY_AUTH_MODE, as Ray leaves it: the
    token goes only to a head this machine started or joined, or where the user said to send it.
    RAY_AUTH_MODE=disabled (or anything set) is the user saying otherwise, and is kept.
    """

    mode = os.environ.get(ray_adapter.AUTH_MODE_ENV)
    if mode is not None:
        return mode.lower() == "token"
    try:
        available = ray_adapter.token_available()
    except Exception as e:  # Ray's loader raises AuthenticationError on a token file it cannot read
        raise RayError(f"cannot read this machine's Ray token: {' '.join(str(e).split())[:160]}; fix "
                       f"~/.ray/auth_token (or RAY_AUTH_TOKEN_PATH), or set RAY_AUTH_MODE=disabled for a "
                       f"cluster without authentication") from None
    if not available:
        return False
    ray_adapter.enable_token_auth()
    _quiet_auth_notice()  # ray.init later sees the mode set and says nothing; quiet it in case it does
    return True


def _auth_refused_hint() -> str:
    """What to do about a refused token, from what this driver sent."""

    try:
        sent, held = ray_adapter.token_auth_enabled(), ray_adapter.token_available()
    except Exception:  # an unreadable token file: the general advice
        return AUTH_HINT
    if not sent:
        return AUTH_HINT
    if not held:
        return ("RAY_AUTH_MODE=token is set but this machine has no Ray token: copy the head's "
                "~/.ray/auth_token here or set RAY_AUTH_TOKEN")
    return ("this machine's Ray token (~/.ray/auth_token, RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH) is not the "
            "cluster's: copy the head's ~/.ray/auth_token here")


def _probe_gcs(hostport: str, origin: str, timeout_ms: int = 5000) -> None:
    """Ask the cluster's GCS for its id, as `ray.init` does first, but once and with a deadline:
    `ray.init` retries a refused token for ~20 s and then reports only "Failed to connect".

    The request is `npas.service.execution.ray_adapter.probe_gcs` (a private Ray client; no public call does
    one bounded request). Its C++ core logs each failed attempt straight to stderr; that one line is
    silenced here because npas reports the failure itself, in one line.
    """
    from ray.exceptions import AuthenticationError


    try:
        with _stderr_silenced():
            ray_adapter.probe_gcs(hostport, timeout_ms)
    except AuthenticationError:
        raise RayError(f"Ray at {hostport} (from {origin}) refused this driver's token; "
                       f"{_auth_refused_hint()}") from None
    except Exception as e:
        raise RayError(f"Ray at {hostport} (from {origin}) does not answer as a Ray head: "
                       f"{' '.join(str(e).split())[:160]}; check the address, or omit --ray-address to run "
                       f"locally") from None


@contextlib.contextmanager
def _stderr_silenced():
    """fd 2 to /dev/null for the duration (the C++ core writes there directly, not through Python)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def check_resources(workers: int, cpus_per_trial: float, gpus_per_trial: float) -> dict[str, float]:
    """Validate the ask against `ray.cluster_resources()` before anything is launched."""
    import ray

    res = ray.cluster_resources()
    cpus, gpus = res.get("CPU", 0.0), res.get("GPU", 0.0)
    if workers < 1:
        raise RayError(f"--workers must be >= 1, got {workers}")
    if cpus_per_trial > cpus:
        raise RayError(f"each trial needs {cpus_per_trial:g} CPUs but the Ray cluster has {cpus:g}; "
                       f"lower the recipe's threads or add nodes")
    if gpus_per_trial > 0 and gpus_per_trial > gpus:
        raise RayError(f"--gpus-per-trial {gpus_per_trial:g} but the Ray cluster has {gpus:g} GPUs; "
                       f"use --gpus-per-trial 0 on CPU machines")
    if workers * cpus_per_trial > cpus:
        log.warning("%d workers x %g CPUs exceed the cluster's %g CPUs; Ray will queue trials",
                    workers, cpus_per_trial, cpus)
    return {"CPU": cpus, "GPU": gpus}


@contextlib.contextmanager
def sigterm_as_interrupt():
    """SIGTERM behaves like Ctrl-C for the duration (a search's trials or a certificate's
    retrainings are recorded as stopped, and a rerun continues); the previous handler is restored.

    Only the main thread may install a signal handler, so off it (`npas.search` run from a worker
    thread of the caller's program) nothing is installed: SIGTERM keeps the program's own handling,
    and stopping such a search is the caller's business (Ctrl-C reaches the main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)

    def _term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
