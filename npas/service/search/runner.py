"""Running a search's trials under Ray Tune: the Tuner over the searcher, ASHA or the ladder as its
scheduler, failed trials' errors kept for the study. The Ray session it runs in (start, connect,
resources) is `npas.service.execution.session`; the ladder's checkpoints are `ladder_run`'s."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
import warnings
from pathlib import Path

from npas.service.execution import session
from npas.service.execution.session import sigterm_as_interrupt
from npas.service.execution.worker import WorkerSpec, trainable
from npas.service.search.ladder_run import Checkpoints, SearchLadder, pending_checkpoints, sweep


def run_trials(searcher, *, study_name: str, recipe_steps: int, eval_every: int, worker: WorkerSpec,
               workers: int, cpus_per_trial: float, gpus_per_trial: float, early_stop: bool,
               max_retries: int = 2, ladder: SearchLadder | None = None,
               checkpoint_storage: str | None = None) -> bool:
    """Run Tune until the searcher finishes. Returns False if the run was interrupted: Tune ended
    before the searcher said FINISHED (a SIGINT between trials makes Tune return normally), or with
    trials still live. With ``ladder`` (``SearchPlan.fidelity == "ladder"``) the trials climb their
    WSD rungs under it (``npas.service.execution.climber``) instead of ASHA's stops on proxy runs.
    ``checkpoint_storage``: Tune's storage (a path or URI every node reaches) instead of this
    machine's ``session.RUNS_DIR``: a multi-node ladder pauses a trial on one node and may resume it on another."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, TrialScheduler

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
    runs = (session.RUNS_DIR / "ray").resolve()
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
        sweep(searcher.study, checkpoint_storage or str(runs),
              searcher.recorded_checkpoints() | pending_checkpoints(searcher.study))
    return not interrupted and searcher.finished and not searcher.has_live
