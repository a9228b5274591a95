"""The job side every cached training bench shares, so a bench script only declares its jobs (and
how a job names its cache file, builds its worker's arguments and labels its record) and its report:

- ``run_spec``: the one training-job function (an allocation trained on the proxy loop, scored on
  the validation and, if asked, test splits), which the CPU benches (``train_and_score``), the
  evidence pool and the lent GPU's runner (``experiments/device.py``) all call;
- ``Runs``: what an experiment declares (its jobs, their run files, what each trains, its record's
  identity), with a plan's arithmetic (``cost``: runs x tokens -> CPU-seconds, what is cached), the
  report's read of the cache (``cached``) and the GPU specs (``device_specs``);
- ``run_missing``: train every job whose run is not cached, on the CPU pool, each record saved the
  moment it arrives, within an optional time box.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.harness import store
from experiments.harness.pool import run_pool
from experiments.harness.version import stamp

ROOT = Path(__file__).resolve().parents[2]
_CORPUS: dict[tuple, Any] = {}


def corpus(recipe: Any) -> Any:
    """The recipe's corpus, loaded once per process (a worker trains many runs)."""
    from npas import load_corpus

    key = (recipe.data, recipe.val_fraction, recipe.test_fraction)
    if key not in _CORPUS:
        _CORPUS[key] = load_corpus(recipe.data, recipe.val_fraction, recipe.test_fraction)
    return _CORPUS[key]


def run_spec(spec: dict) -> dict:
    """Train one spec'd run; the record is the spec's ``meta`` plus what the run measured."""
    import torch

    from npas import ArchConfig, Chassis, Recipe
    from npas.training.forks import train_model
    from npas.training.proxy import eval_batches, evaluate, pick_device

    cfg = ArchConfig.from_json(spec["config"])
    recipe = Recipe.from_dict(spec["recipe"])
    ref = Chassis(**spec["reference"]) if spec.get("reference") else None
    data = corpus(recipe)
    if recipe.threads > 0:
        torch.set_num_threads(recipe.threads)
    t = time.perf_counter()
    init = None
    if spec.get("init_weights"):  # a converted model's weights (experiments/evidence/conversion.py): safetensors only
        from safetensors.torch import load_file
        init = load_file(str(ROOT / spec["init_weights"]))
    try:
        model, res = train_model(cfg, recipe, data, reference=ref, init_state=init)
    except Exception as err:  # a run that breaks is a failed record, not a dead pool
        return {**spec["meta"], "status": "failed", "val_loss": None, "test_loss": None,
                "failure_reason": f"{type(err).__name__}: {err}"[:500], "steps": 0, "tokens": 0,
                "wall_s": time.perf_counter() - t, "device": "?", **stamp(recipe, cfg, spec.get("commit"))}
    if spec.get("save_weights") and res.status == "ok":  # the trained model, for a later conversion
        from safetensors.torch import save_file

        from npas.allocation.transformer import export_state
        dest = ROOT / spec["save_weights"]
        dest.parent.mkdir(parents=True, exist_ok=True)
        save_file(export_state(model), str(dest.with_suffix(".tmp")))
        dest.with_suffix(".tmp").replace(dest)
    test = None
    if spec.get("test") and res.status == "ok":
        test = evaluate(model, eval_batches(data, recipe, split="test"), pick_device(res.device), recipe)
        test = test if math.isfinite(test) else None
    return {**spec["meta"], "status": res.status, "val_loss": res.val_loss, "test_loss": test,
            "failure_reason": res.failure_reason, "steps": res.steps_done,
            "tokens": res.steps_done * recipe.tokens_per_step, "tokens_per_s": res.tokens_per_s,
            "wall_s": res.wall_s, "stored_params": res.stored_params, "flops_per_token": res.flops_per_token,
            "peak_memory_bytes": res.peak_memory_bytes, "device": res.device,
            "device_name": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "curve": list(res.curve), **stamp(recipe, cfg, spec.get("commit")), **_forked(res, recipe),
            **({"recursion": res.recursion} if getattr(res, "recursion", None) else {})}  # both rules' losses, depth


def _forked(res, recipe) -> dict:
    """A WSD run's rung losses and what it trained with its forks (whose tokens it cost); {} for cosine."""
    if not hasattr(res, "rung_losses"):
        return {}
    return {"rung_losses": {str(t): v for t, v in res.to_dict()["rung_losses"].items()},
            "steps_trained": res.steps_trained, "tokens": res.steps_trained * recipe.tokens_per_step}


def train_and_score(cfg_json: str, recipe_json: str, ref_json: str) -> dict:
    """``run_spec`` for the CPU benches: one allocation trained against the reference chassis
    ``ref_json`` (the fair parameterization scales against it, as a search's runner passes it) and
    scored on the validation and test splits; a run without a test loss counts as failed."""
    rec = run_spec({"config": cfg_json, "recipe": json.loads(recipe_json), "reference": json.loads(ref_json),
                    "test": True, "meta": {}})
    if rec["status"] == "ok" and rec["test_loss"] is None:
        rec["status"] = "failed"
    return rec


@dataclass(frozen=True)
class Runs:
    """An experiment's runs as the harness needs them, all the script declares: its ``jobs`` (in
    training order), each job's run file in the cache (``path``), what it trains (``train``: allocation,
    recipe, reference chassis) and its record's identity fields (``label``, the code version among
    them: a GPU spec's ``meta`` is the same)."""

    jobs: Sequence[Any]
    path: Callable[[Any], Path | None]  # None: a run that is never cached (a quick smoke run trains afresh)
    train: Callable[[Any], tuple[Any, Any, Any]]
    label: Callable[[Any], dict]
    # The worker a job trains with and its arguments (default ``train_and_score`` on ``args``); the
    # evidence pool's passes its own (its records carry its jobs' names, and a conversion's weights).
    work: Callable[..., dict] | None = None
    work_args: Callable[[Any], tuple] | None = None
    label_last: bool = False  # the cached record: label's fields after the worker's (the evidence pool's order)

    def args(self, job: Any) -> tuple:
        """The worker's arguments for ``job`` (``train_and_score``'s: JSON, they cross to a spawned worker)."""
        if self.work_args is not None:
            return self.work_args(job)
        cfg, recipe, ref = self.train(job)
        return cfg.to_json(), json.dumps(recipe.to_dict()), json.dumps(ref.__dict__)

    def has(self, job: Any) -> bool:
        """Whether ``job``'s run is cached."""
        return (p := self.path(job)) is not None and store.exists(p)

    def record(self, job: Any, rec: dict) -> dict:
        """What the cache keeps of ``job``'s finished run: its record with ``label``'s fields."""
        return {**rec, **self.label(job)} if self.label_last else {**self.label(job), **rec}

    def cached(self, jobs: Sequence[Any] | None = None) -> list[tuple[Any, Any]]:
        """(job, record) of every job (of ``jobs``, default all) whose run is cached, in job order:
        what a report reads."""
        return [(j, store.load(self.path(j))) for j in (self.jobs if jobs is None else jobs) if self.has(j)]

    def cost(self, jobs: Sequence[Any], tokens: Callable[[Any], int], flops: Callable[[Any], int],
             rate: float) -> Cost:
        """A plan's arithmetic over ``jobs``: runs x tokens -> CPU-seconds at ``rate`` training FLOP/s
        (3x the forward FLOPs per token, evaluation excluded), and what the cache holds."""
        have = [self.has(j) for j in jobs]
        secs = [tokens(j) * 3 * flops(j) / rate for j in jobs]
        return Cost(len(jobs), sum(have), sum(tokens(j) for j in jobs), sum(secs),
                    sum(s for s, h in zip(secs, have, strict=True) if not h))

    def device_specs(self, test: bool, est_s: Callable[[Any], float] | None = None) -> list[dict]:
        """Every run as a spec for the lent GPU's runner (``experiments/device.py``), in training order;
        ``est_s(job)``: its GPU-seconds for the deadline (default: ``make_spec``'s per-step estimate)."""
        from experiments.device import make_spec

        return [make_spec(self.path(j), *self.train(j), test=test, priority=i, meta=self.label(j),
                          est_s=None if est_s is None else est_s(j)) for i, j in enumerate(self.jobs)]


def run_missing(runs: Runs, workers: int, where: str | None,
                progress: Callable[[int, int, Any, dict, float], None] | None = None,
                fits: Callable[[Any, float], bool] | None = None) -> tuple[int, int, int]:
    """Train every job whose run is not cached, in order, with the runs' worker (``train_and_score``
    unless they name theirs) on ``workers`` processes; each record is saved (``Runs.record``) the
    moment it arrives, so a killed bench keeps every finished run, and ``progress(done, to_train, job,
    record, elapsed_s)`` reports it (the worker's record, as it came). ``fits(job, elapsed_s)``: a time
    box (a job starts only while it fits). ``where``: the "runs: n to train" line's tail (None: no
    line). Returns (ran, cached, to train)."""
    todo = [j for j in runs.jobs if not runs.has(j)]
    cached = len(runs.jobs) - len(todo)
    if where is not None:
        print(f"runs: {len(todo)} to train, {cached} cached{where}", flush=True)
    t0 = time.perf_counter()
    done = [0]

    def save(j: Any, rec: dict) -> None:
        if (path := runs.path(j)) is not None:
            store.save(path, runs.record(j, rec))
        done[0] += 1
        if progress is not None:
            progress(done[0], len(todo), j, rec, time.perf_counter() - t0)

    gate = None if fits is None else (lambda j: fits(j, time.perf_counter() - t0))
    return run_pool(todo, runs.work or train_and_score, runs.args, save, workers, gate), cached, len(todo)


@dataclass(frozen=True)
class Cost:
    """A plan's arithmetic over some jobs: how many, how many cached, their training tokens, and the
    estimated CPU-seconds of all of them and of the missing ones."""

    runs: int
    cached: int
    tokens: int
    secs: float
    left: float
