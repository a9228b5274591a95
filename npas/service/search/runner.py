"""Ray Tune execution of proxy trials: Ray start-up, resource checks, the trainable, ASHA.

The Optuna study is the source of truth; Ray Tune's experiment directory (trials/runs/) is scratch.
Tune brings what is hard to do well by hand: placing trials on workers across a cluster, retrying a
trial whose worker or node died (FailureConfig), and asynchronous successive halving on the
validation loss (ASHA). The searcher in `npas.service.search.searcher` does the Optuna side.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from npas.errors import RayError

if TYPE_CHECKING:
    from npas.service.search.ladder_run import SearchLadder
    from npas.service.search.worker import WorkerSpec

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
    from npas.service.search.ray_adapter import AUTH_NOTICE_LOGGER

    notice = logging.getLogger(AUTH_NOTICE_LOGGER)
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
            from npas.service.search.ray_adapter import WORKER_LOGGER

            quiet = logging.getLogger(WORKER_LOGGER)  # "SIGTERM handler is not set ...": npas sets its own
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
        from npas.service.search.ray_adapter import cluster_record

        record = cluster_record()
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
    from npas.service.search import ray_adapter

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
    from npas.service.search import ray_adapter

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

    The request is `npas.service.search.ray_adapter.probe_gcs` (a private Ray client; no public call does
    one bounded request). Its C++ core logs each failed attempt straight to stderr; that one line is
    silenced here because npas reports the failure itself, in one line.
    """
    from ray.exceptions import AuthenticationError

    from npas.service.search.ray_adapter import probe_gcs

    try:
        with _stderr_silenced():
            probe_gcs(hostport, timeout_ms)
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


def run_trials(searcher, *, study_name: str, recipe_steps: int, eval_every: int, worker: WorkerSpec,
               workers: int, cpus_per_trial: float, gpus_per_trial: float, early_stop: bool,
               max_retries: int = 2, ladder: SearchLadder | None = None,
               checkpoint_storage: str | None = None) -> bool:
    """Run Tune until the searcher finishes. Returns False if the run was interrupted: Tune ended
    before the searcher said FINISHED (a SIGINT between trials makes Tune return normally), or with
    trials still live. With ``ladder`` (``SearchPlan.fidelity == "ladder"``) the trials climb their
    WSD rungs under it (``npas.service.search.climber``) instead of ASHA's stops on proxy runs.
    ``checkpoint_storage``: Tune's storage (a path or URI every node reaches) instead of this
    machine's ``RUNS_DIR``: a multi-node ladder pauses a trial on one node and may resume it on another."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, TrialScheduler

    from npas.service.search.ladder_run import Checkpoints
    from npas.service.search.worker import trainable

    class _Errors(tune.Callback):
        """Keep each failed trial's error text for the study (Tune's Searcher hook gets only a flag)."""

        def on_trial_error(self, iteration, trials, trial, **info):
            err = getattr(trial, "error_message", None) or ""
            if not err and getattr(trial, "error_file", None):
                with contextlib.suppress(OSError):
                    err = Path(trial.error_file).read_text()[-1500:]
            last = [ln for ln in str(err).strip().splitlines() if ln.strip()]
            searcher.record_error(trial.trial_id, "worker error: " + (last[-1] if last else "trial raised or worker died"))

        def on_trial_recover(self, iteration, trials, trial, **info):
            searcher.record_retry(trial.trial_id)

    class _ASHA(ASHAScheduler):
        """ASHA on validation loss, except for the enqueued baselines: they always run to full fidelity
        so every front shows what hand-crafted sharing would have given (their results still feed the rungs)."""

        def on_trial_result(self, tune_controller, trial, result):
            action = super().on_trial_result(tune_controller, trial, result)
            return TrialScheduler.CONTINUE if trial.config.get("baseline") else action

    # max_t one past the last step: the last evaluation (at `steps`) must not end the trial before it
    # sends its final report with the proxy metrics
    scheduler = (ladder if ladder is not None else
                 _ASHA(time_attr="step", metric="val_loss", mode="min", max_t=recipe_steps + 1,
                       grace_period=max(1, min(eval_every, recipe_steps)), reduction_factor=3)
                 if early_stop else FIFOScheduler())
    resources = {"cpu": cpus_per_trial, "gpu": gpus_per_trial}
    # Tune's default CSV, JSON and TensorBoard loggers copy every result into its scratch directory,
    # which nothing reads (the study is the record), and the TensorBoard one imports torch into the
    # driver (tensorboardX does), seconds and hundreds of MB that the driver otherwise never needs.
    # Tune reads this variable when the run starts; set here, it leaves a user's explicit choice alone.
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    runs = (RUNS_DIR / "ray").resolve()
    runs.mkdir(parents=True, exist_ok=True)
    callbacks: list = [_Errors()]
    checkpoints = None
    if ladder is not None:
        # paused trials count against max_concurrent_trials: the ladder caps *running* trials itself
        ladder.max_running = workers
        searcher.admits = ladder.admits
        callbacks.append(Checkpoints(searcher))
        checkpoints = tune.CheckpointConfig(num_to_keep=1)  # a trial resumes from its last rung only
        # a checkpoint at every rung is the point: Tune's warning about frequent syncs does not apply
        os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    name = f"{study_name}-{int(time.time())}"
    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(trainable, spec=dataclasses.replace(worker, ladder=ladder is not None)),
                            resources),
        tune_config=tune.TuneConfig(search_alg=searcher, scheduler=scheduler, num_samples=-1,
                                    max_concurrent_trials=None if ladder is not None else workers,
                                    reuse_actors=True),
        run_config=tune.RunConfig(name=name, storage_path=checkpoint_storage or str(runs), verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=max_retries),
                                  callbacks=callbacks, checkpoint_config=checkpoints),
    )
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
    # Tune's own "resume with Tuner.restore(...)" advice does not apply: `npas resume` restores from the study
    logging.getLogger("ray.tune.tune").setLevel(logging.ERROR)
    # nor its closing "Failed to fetch metrics" from the result files the loggers above no longer write
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    interrupted = False
    try:
        with sigterm_as_interrupt():  # Tune stops its trials, the searcher records them
            tuner.fit()
    except KeyboardInterrupt:
        interrupted = True
    if ladder is not None:  # keep only the checkpoints a re-enqueued trial will resume from
        from npas.service.search.ladder_run import pending_checkpoints, sweep

        sweep(searcher.study, checkpoint_storage or str(runs),
              searcher.recorded_checkpoints() | pending_checkpoints(searcher.study))
    return not interrupted and searcher.finished and not searcher.has_live


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
