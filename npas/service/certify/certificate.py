"""The fidelity certificate: `npas validate`'s results read back from the database and summarised.

Built only from what the linked ``"{study}:validate"`` study holds (never from in-memory results),
so a certificate computed after a resume, or by anyone who can read the database, is the same.
An allocation counts once all its seeds are complete; until then it is listed but not in the
statistics (``complete`` < ``planned`` says so).
"""

from __future__ import annotations

import datetime
import math

import numpy as np
import optuna
from optuna.trial import TrialState

from npas.allocation.budget import count
from npas.service.study import fidelity as F
from npas.service.study import noise as N
from npas.service.study.record import RetrainAttr

CERTIFICATE_ATTR = "fidelity_certificate"  # source study user attr, JSON
FROM_STUDY = ("front", "sample", "baseline", "pick", "memory_matched")  # roles of trials the proxy ranked


def _losses_by_key(linked: optuna.Study) -> dict[str, float]:
    return {str(t.user_attrs[RetrainAttr.KEY]): float(t.values[0])
            for t in linked.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if RetrainAttr.KEY in t.user_attrs}


def _row(plan, target, losses: dict[str, float]) -> dict:
    acc = count(target.cfg, seq_len=plan.recipe.seq_len)
    seed_losses = [losses.get(plan.key(target, s)) for s in plan.seeds]
    complete = all(v is not None for v in seed_losses)
    return {
        "trial": target.source, "roles": list(target.roles), "label": target.label, "hash": target.cfg.hash,
        "summary": target.cfg.summary(), "proxy_loss": target.proxy_loss, "test_losses": seed_losses,
        "test_mean": float(np.mean(seed_losses)) if complete else None,
        "test_std": float(np.std(seed_losses, ddof=1)) if complete and len(seed_losses) > 1 else None,
        "stored_params": acc.stored_params, "flops_per_token": acc.flops_per_token,
        "materialised_non_embedding": acc.materialised_params - acc.embedding_params, "complete": complete,
        "lr_factor": target.lr_factor,  # the located rate it was retrained at (1: none located)
    }


def _ranking(rows: list[dict]) -> dict:
    proxy = [r["proxy_loss"] for r in rows]
    test = [r["test_mean"] for r in rows]
    return {"n": len(rows), "kendall_tau": F.rank_correlation(proxy, test, "kendall").to_dict(),
            "spearman_rho": F.rank_correlation(proxy, test, "spearman").to_dict()}


def _delta(rows_by_hash: dict[str, dict], a: str | None, b: str | None) -> dict | None:
    if a is None or b is None or not (rows_by_hash[a]["complete"] and rows_by_hash[b]["complete"]):
        return None
    return F.paired_delta(rows_by_hash[a]["test_losses"], rows_by_hash[b]["test_losses"]).to_dict()


def build_certificate(source: optuna.Study, linked: optuna.Study, plan) -> dict:
    losses = _losses_by_key(linked)
    rows = [_row(plan, t, losses) for t in plan.targets]
    by_hash = {r["hash"]: r for r in rows}
    ranked = [r for r in rows if r["complete"] and r["trial"] is not None and set(r["roles"]) & set(FROM_STUDY)]
    front = [r for r in ranked if "front" in r["roles"]]
    matrix = [r["test_losses"] for r in ranked]
    flips, pairs = F.rank_flips([r["proxy_loss"] for r in front], [r["test_mean"] for r in front])
    pick_hash = next((r["hash"] for r in rows if "pick" in r["roles"]), None)
    pick = by_hash.get(pick_hash) if pick_hash else None
    flops_ratio = plan.flops_ratio
    return {
        "study": plan.study, "linked_study": linked.study_name,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "recipe": plan.recipe.name, "recipe_steps": plan.recipe.steps, "seeds": list(plan.seeds),
        "split": plan.split, "planned": len(rows), "complete": sum(r["complete"] for r in rows),
        "retrainings": len(losses),
        "all": _ranking(ranked), "front": _ranking(front),
        "rank_flips": {"flips": flips, "pairs": pairs},
        "seed_std": N.pooled_seed_std(matrix) if matrix else None,
        "paired_std": N.paired_std(matrix) if matrix else None,
        "snr": _finite(N.signal_to_noise(matrix)) if matrix else None,
        "size_and_compute": F.size_and_compute([r["test_mean"] for r in ranked],
                                               [r["flops_per_token"] for r in ranked],
                                               [r["materialised_non_embedding"] for r in ranked]),
        "pick": {"trial": plan.pick, "hash": pick_hash, "summary": pick["summary"] if pick else None},
        "matched": {
            "memory": {"hash": plan.memory_matched, "delta": _delta(by_hash, pick_hash, plan.memory_matched),
                       "stored_ratio": _ratio(by_hash, plan.memory_matched, pick_hash, "stored_params")},
            "compute": {"hash": plan.flops_matched, "delta": _delta(by_hash, pick_hash, plan.flops_matched),
                        "flops_ratio": flops_ratio,
                        "label": by_hash[plan.flops_matched]["label"] if plan.flops_matched else None},
        },
        "allocations": rows,
    }


def _ratio(by_hash: dict, a: str | None, b: str | None, key: str) -> float | None:
    if a is None or b is None or not by_hash[b][key]:
        return None
    return by_hash[a][key] / by_hash[b][key]


def _finite(x: float | None) -> float | None:
    return x if x is None or math.isfinite(x) else None
