"""What a Ray worker needs to run a trial (`WorkerSpec`), and the trainable that runs it there.

The driver builds one frozen `WorkerSpec` per run (`WorkerSpec.of`) and Tune hands it to every
trial; nothing in the worker reads a setting by a string key or restates a default.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

from npas.service.execution.climber import climb
from npas.service.execution.outcome import combine_repeats
from npas.service.execution.trial import TrialContext, WorkerSpec
from npas.training.forks import run_proxy  # the recipe's schedule: cosine as ever, or WSD with forks

if TYPE_CHECKING:
    pass


def trainable(config: dict, spec: WorkerSpec) -> None:
    """The search's one Ray Tune trainable: the trial's context (`TrialContext.of`) trained as the
    study's mechanism says -- a climb up the ladder's rungs (`spec.ladder`, `climber.climb`) or whole
    runs reporting at their evaluations (`run_whole`)."""
    import ray

    node = ray.get_runtime_context().get_node_id()  # recorded so a study shows where each trial ran
    ctx = TrialContext.of(config, spec, node)
    if spec.ladder:
        return climb(ctx, config)
    return run_whole(ctx)


def run_whole(ctx: TrialContext) -> None:
    """One trial's allocation trained on each of its seeds, one after another, to the recipe's steps.

    Only the first seed reports its validation loss at each evaluation, so ASHA ranks and stops a
    trial on one seed's curve, exactly as without repeats, and decides before the other R-1 seeds
    cost anything; a trial it lets through trains the remaining seeds without reports, and the final
    report carries the mean over all seeds (`npas.service.execution.outcome.combine_repeats`). A seed whose run
    fails or diverges ends the trial as failed, naming the seed: a mean without it would not be
    comparable with the other trials'.
    """
    from ray import tune

    seeds = ctx.seeds

    def report(step: int, val_loss: float) -> bool:
        tune.report({"val_loss": val_loss if math.isfinite(val_loss) else math.inf, "step": step, "final": False})
        return False  # ASHA stops a trial by ending it at a report, not through this return value

    try:  # every seed starts from the trained model, converted
        init_state = ctx.init_state()
    except Exception as e:  # a conversion that raises would raise on every retry: the trial fails
        return tune.report(ctx.failed(ctx.failure.raised("converting the --init-from model", e)))
    runs = []
    for seed in seeds:
        try:
            result = run_proxy(ctx.cfg, ctx.seed_recipe(seed), ctx.corpus, report=report if seed == seeds[0] else None,
                               reference=ctx.reference, init_state=init_state)
        except Exception as e:
            return tune.report(ctx.failed(ctx.which(seed) + ctx.failure.raised("the proxy run", e)))
        if result.status != "ok" or result.val_loss is None:
            failed = result.to_dict()
            if failed.get("failure_reason"):
                failed["failure_reason"] = ctx.which(seed) + failed["failure_reason"]
            loss = result.val_loss if result.val_loss is not None else math.inf
            tune.report({"val_loss": loss, "step": result.steps_done, "final": True, "node": ctx.node,
                         "proxy": json.dumps(failed)})
            return None
        runs.append(result.to_dict())
    proxy = combine_repeats(runs, seeds)
    # Tune flattens nested result dicts; the metrics travel as one JSON string and are decoded by the searcher
    tune.report({"val_loss": proxy["val_loss"], "step": proxy["steps_done"], "final": True, "node": ctx.node,
                 "proxy": json.dumps(proxy)})
    return None
