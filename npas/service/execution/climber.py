"""The trainable of a search under the promotion ladder: a trial climbs its WSD run rung by rung.

A ``wsd`` recipe's search (``SearchPlan.fidelity == "ladder"``) trains its trials this way: the one
trainable (``npas.service.execution.worker.trainable``) hands ``climb`` the trial's context. A trial starts a ``Climb`` per seed (``--repeats R``: the
seeds climb together), or restores them from ``tune.get_checkpoint()`` when the ladder resumes it
after a pause. At each rung it steps every seed's climb up, and reports the seed mean with a
checkpoint of all the climbs (Tune's checkpoint mechanism: storage under the run's storage path).
``LadderScheduler`` then lets it go on, pauses it (Tune keeps that checkpoint and frees the worker)
or, once nothing can promote it any more, stops it.

Every rung's report carries a whole proxy record (``"proxy"``, the JSON the searcher decodes): a trial
stopped while paused is told with its last rung's record, as one that reached the top is with its
final one. Its ``rung_losses`` are the losses the ladder ranked it on, the seed means at each rung
passed as reported there (``ranked_record``), its ``steps_trained`` the optimizer steps of all
seeds' climbs (top rung + forks, each: no step twice), ``steps_done`` the rung (the trial's fidelity).
Under ``--locate-lr`` the located run replaces the trial's climb at the locating rung, and its own
losses at the rungs below (at the located factor) are not what the ladder ranked there: they are
kept apart, as ``located_rung_losses``.

A trial re-enqueued after its driver stopped (``npas resume``) carries its earlier attempt's trial
directory and last recorded checkpoint (``config["resume_dir"]``, ``config["resume_from"]``, copied by
``faults.requeue``): it restores the climbs from the newest whole checkpoint there
(``climb_store.restore``), reports the rung it had reached without training (the new driver's ladder
decides it again) and removes that checkpoint once Tune holds the new one.

Between rungs a climbing trial reports its optimizer steps so far (``trained_steps``, every
``PROGRESS_EVERY_S`` at most; no rung, so no decision) and the driver keeps them on the running
trial: a driver that dies mid-segment leaves the steps its trial trained past its checkpoint on
record, and the retry adds them to its own (``lost_steps``, inside ``trained_steps``).
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
import time
from typing import TYPE_CHECKING, Any

from npas.allocation.budget import count
from npas.service.execution.climb_store import count_lost, load_climbs, remove, restore, save_climbs
from npas.service.execution.outcome import combine_repeats
from npas.training import climb as climbing
from npas.training.located_rate import locate, locate_rung
from npas.training.proxy import _finite, eval_tokens_per_byte, to_bpb

if TYPE_CHECKING:
    from npas.service.execution.trial import TrialContext
    from npas.training.climb import Climb

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 5.0  # a climbing trial reports its steps so far at most this often (see the module docstring)


def seed_record(c: Climb, cfg: Any, corpus: Any, wall_s: float, train_s: float) -> dict[str, Any]:
    """One seed's proxy record at the rung its climb reached: what ``forks.train_model`` returns for a
    WSD run stopped there (``ForkResult.to_dict``), from the climb's state."""
    import torch

    recipe, tr = c.recipe, c.trainer
    acc = count(cfg, batch_size=recipe.batch_size, seq_len=recipe.seq_len)
    loss = c.rung_losses[c.top]
    cuda = tr.device.type == "cuda"
    return {
        "status": "ok", "val_loss": _finite(loss), "val_bpc": _finite(loss / math.log(2)), "train_loss": None,
        "steps_done": c.top, "stored_params": sum(p.numel() for p in tr.model.parameters()),
        "param_bytes": acc.param_bytes,
        "peak_memory_bytes": int(torch.cuda.max_memory_allocated(tr.device) if cuda else acc.train_memory_bytes),
        "memory_source": "cuda_max_allocated" if cuda else "analytic", "rss_delta_bytes": 0,
        "flops_per_token": acc.flops_per_token,
        "tokens_per_s": c.trained_steps * recipe.tokens_per_step / max(1e-9, train_s),
        "wall_s": wall_s, "curve": [[t, _finite(v)] for t, v in sorted(c.rung_losses.items())],
        "failure_reason": None, "device": str(tr.device), "config_hash": getattr(cfg, "hash", ""),
        "val_bpb": to_bpb(loss, eval_tokens_per_byte(corpus, recipe)), "train_bpb": None,
        "rung_losses": {int(t): _finite(v) for t, v in c.rung_losses.items()},
        "steps_trained": c.trained_steps,
    }


def ranked_record(proxy: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """The record of a trial at the rung it reached (``proxy``: its climbs' seed means), with
    ``rung_losses`` the losses the ladder ranked it on: each rung's loss as it was reported there,
    noted in ``meta["ladder_losses"]`` (a checkpoint carries it). The climbs' own losses differ from
    those only where ``--locate-lr`` replaced the climb (the located run's rungs below the locating
    one, at its factor): they are kept as ``located_rung_losses`` and the curve is the ranked one. A
    checkpoint written before ``ladder_losses`` existed has the climbs' losses for its earlier rungs."""
    ranked = meta.setdefault("ladder_losses", {})
    ranked[str(int(proxy["steps_done"]))] = proxy["val_loss"]
    own = {int(t): v for t, v in proxy["rung_losses"].items()}
    losses = dict(sorted({**own, **{int(t): v for t, v in ranked.items()}}.items()))
    out = {**proxy, "rung_losses": losses, "curve": [[t, v] for t, v in losses.items()]}
    if "located" in meta:
        out["located_rung_losses"] = own
    return out


def climb(ctx: TrialContext, config: dict) -> None:
    """One trial under the ladder: its seeds' climbs, one rung at a time; see the module docstring.
    ``config``: Tune's, for a re-enqueued trial's earlier attempt (``resume_dir``, ``resume_from``,
    ``steps_before``)."""
    from ray import tune

    cfg, recipe, corpus, seeds, node = ctx.cfg, ctx.recipe, ctx.corpus, ctx.seeds, ctx.node

    def fail(reason: str, rung: int = 0, steps: int = 0) -> None:
        tune.report(ctx.failed(reason, rung, steps))

    grid: dict[int, int] = {}  # a rate-grid run in progress (not one of `climbs`) -> its steps so far
    last = {"at": time.monotonic()}

    def steps_paid() -> int:
        """Every optimizer step this trial has paid for: its climbs, its rate grid's discarded runs (done
        or in progress), and what earlier attempts lost."""
        grid_steps = int((meta.get("located") or {}).get("lr_grid_steps", 0))
        return (sum(c.trained_steps for c in climbs) + grid_steps + sum(grid.values())
                + int(meta.get("lost_steps", 0)))

    def progress(c: Climb) -> None:
        """``Climb.on_progress``: the steps so far, to the driver, at most every PROGRESS_EVERY_S."""
        if not any(c is x for x in climbs):
            grid[id(c)] = c.trained_steps
        if time.monotonic() - last["at"] >= PROGRESS_EVERY_S:
            last["at"] = time.monotonic()
            tune.report({"val_loss": math.nan, "trained_steps": steps_paid(), "node": node})

    def locate_here() -> None:
        """--locate-lr, on the step to the locating rung: the first seed's climb is the grid's x1 run and
        the grid's best run replaces it; the other seeds restart at the located factor (their x1 steps
        so far are the grid's cost too) and are climbed to the rung with the rest."""
        first, located = locate(cfg, recipe, corpus, reference=ctx.reference, init_state=ctx.init_state(),
                                fair=climbs[0], on_progress=progress)
        grid.clear()
        dropped = 0
        if located.factor != 1.0:
            for i in range(1, len(climbs)):
                dropped += climbs[i].trained_steps
                climbs[i] = climbing.start(cfg, ctx.seed_recipe(seeds[i]), corpus, reference=ctx.reference,
                                           init_state=ctx.init_state(), lr_factor=located.factor)
                climbs[i].on_progress = progress
        climbs[0] = first
        first.on_progress = progress
        meta["located"] = {**located.to_dict(), "lr_grid_steps": located.lr_grid_steps + dropped}

    started = time.perf_counter()
    ckpt, old = tune.get_checkpoint(), None
    try:
        if ckpt is not None:
            with ckpt.as_directory() as d:
                climbs, meta = load_climbs(d, cfg, corpus, ctx, len(seeds))
        elif (got := restore(config, cfg, corpus, ctx, len(seeds))) is not None:
            climbs, meta, old = got
        else:
            climbs, meta = [], {"wall_s": 0.0, "train_s": 0.0}
            for seed in seeds:
                climbs.append(climbing.start(cfg, ctx.seed_recipe(seed), corpus, reference=ctx.reference,
                                             init_state=ctx.init_state()))
    except Exception as e:  # raised by the set-up itself: it would raise again on every retry
        return fail(ctx.failure.raised("starting the climb", e))
    for c in climbs:
        c.on_progress = progress
    if ckpt is None and config.get("steps_before"):  # re-enqueued: the steps its earlier attempt lost
        count_lost(meta, steps_paid(), config["steps_before"])
    meta["wall_s"] += time.perf_counter() - started
    if climbs[0].top:  # restored at a rung: kept in the record, the proof that it resumed there
        meta["resumed_at"] = [*meta.get("resumed_at", []), climbs[0].top]

    def report(with_checkpoint: bool) -> None:
        t = climbs[0].top
        runs = [seed_record(c, cfg, corpus, meta["wall_s"] / len(climbs), meta["train_s"] / len(climbs))
                for c in climbs]
        proxy = ranked_record(combine_repeats(runs, seeds), meta)
        proxy["resumed_at"] = meta.get("resumed_at", [])  # rungs it was paused at and resumed from
        if "located" in meta:  # --locate-lr: the factor, the grid's losses and the steps of its discarded runs
            proxy.update(meta["located"])
        if meta.get("lost_steps"):  # trained by earlier attempts past the checkpoint they left: paid for, too
            proxy["lost_steps"] = int(meta["lost_steps"])
            proxy["steps_trained"] += proxy["lost_steps"]
        row = {"val_loss": proxy["val_loss"], "rung": t, "step": t, "final": t == recipe.steps, "node": node,
               "trained_steps": steps_paid(), **ctx.objectives, "proxy": json.dumps(proxy)}
        if not with_checkpoint:
            tune.report(row)
            return
        with tempfile.TemporaryDirectory(prefix="npas-climb-") as d:
            save_climbs(climbs, d, meta)
            tune.report(row, checkpoint=tune.Checkpoint.from_directory(d))

    if old is not None and climbs[0].top:  # re-enqueued: decide the rung reached again, train nothing
        report(with_checkpoint=climbs[0].next_rung is not None)
        remove(old)  # Tune holds the trial's state now
    while climbs[0].next_rung is not None:
        t0 = time.perf_counter()
        try:
            rung = climbs[0].next_rung
            if ctx.locate_lr and "located" not in meta and rung == locate_rung(recipe):
                locate_here()
            for i, c in enumerate(climbs):
                c.climb(until=rung)  # one rung up; a seed restarted by the grid climbs through the lower ones
                if c.failed is not None:
                    which = ctx.which(seeds[i])
                    rate = f"at the located rate x{c.lr_factor:g}: " if c.lr_factor != 1.0 else ""
                    return fail(which + rate + c.failed, c.top, steps_paid())
        except Exception as e:
            return fail(ctx.failure.raised("the climb", e), climbs[0].top, steps_paid())
        took = time.perf_counter() - t0
        meta["wall_s"] += took
        meta["train_s"] += took
        report(with_checkpoint=climbs[0].next_rung is not None)  # the top rung ends the trial: nothing to keep
    return None
