"""A study as a promotion ladder leaves it, written with Optuna's own API (no Ray, no training): 16 trials
scored at rung 10, 12 of them promoted to rung 40, 4 of those to the top rung T = 160, each with its
`rung_losses`, `fidelity`/`max_fidelity` and a located `lr_factor`. The losses are chosen so the
rung-to-rung statistics are known: rung 40 reverses exactly two adjacent pairs of rung 10's order
(2 flips of 66 pairs among the 12 promoted), rung 160 one pair of rung 40's among the top 4.

Used by the readers of a study's rungs: `npas front`, the study's rung summary, the dashboard's panel.
"""

from __future__ import annotations

import copy

import optuna

from npas.service.study.record import Constraint, StudyAttr, TrialAttr
from tests.study_fixture import load

RUNGS = (10, 40, 160)
T = RUNGS[-1]
RECIPE = {"name": "ladder", "seq_len": 32, "batch_size": 8, "steps": T, "lr": 1e-2, "min_lr": 1e-3,
          "warmup_steps": 4, "eval_every": 10, "eval_batches": 2, "seed": 0, "threads": 1, "schedule": "wsd",
          "horizon": T, "rungs": list(RUNGS), "version": 2, "parameterization": "fair"}
N = 16
AT_10 = [3.00 + 0.01 * i for i in range(N)]  # trial i's rung-10 loss: trial 0 is best
ORDER_40 = [0, 1, 3, 2, 4, 5, 7, 6, 8, 9, 10, 11]  # the 12 promoted, best first at rung 40: (2,3), (6,7) flip
ORDER_T = [1, 0, 3, 2]  # the 4 promoted again, best first at T: (0,1) flips
FACTORS = {0: 2.0, 1: 0.5, 2: 1.0, 3: 4.0}  # located factors of the trials that reach T
MEMORY = [3_000_000.0 - 10_000.0 * i for i in range(N)]  # a cheaper trial for every worse loss: a real front


def losses(i: int) -> dict[int, float]:
    out = {10: AT_10[i]}
    if i in ORDER_40:
        out[40] = 2.80 + 0.01 * ORDER_40.index(i)
    if i in ORDER_T:
        out[T] = 2.60 + 0.01 * ORDER_T.index(i)
    return out


def make(url: str, name: str = "ladder") -> optuna.Study:
    smoke = load()
    base = smoke["trials"][0]["user_attrs"]  # a real trial's allocation and accounting
    study = optuna.create_study(study_name=name, storage=url, directions=["minimize", "minimize"])
    for k, v in smoke["user_attrs"].items():
        study.set_user_attr(k, v)
    study.set_user_attr(StudyAttr.RECIPE, RECIPE)
    for i in range(N):
        rl = losses(i)
        top = max(rl)
        attrs = {k: copy.deepcopy(base[k]) for k in (TrialAttr.ALLOC, TrialAttr.HASH, TrialAttr.ACCOUNTING)}
        attrs.update({TrialAttr.STATUS: "ok" if top == T else "stopped", TrialAttr.FIDELITY: top,
                      TrialAttr.MAX_FIDELITY: T, TrialAttr.RUNG_LOSSES: {str(t): v for t, v in rl.items()},
                      TrialAttr.LR_FACTOR: FACTORS.get(i, 1.0), TrialAttr.LR_GRID_STEPS: 3 * 10})
        study.add_trial(optuna.trial.create_trial(
            values=[rl[top], MEMORY[i]], user_attrs=attrs,
            constraints={Constraint.BUDGET: -1.0, Constraint.FIDELITY: (T - top) / T}))
    return study
