"""The search experiments' plumbing (early stopping, search vs hand-crafted): a real ``npas.search``
into a fresh SQLite study on ``search_spaces/full.yaml``'s knobs, and its trials read back as rows."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from common import ROOT, Setup

from npas import ArchConfig, Recipe


def search_space(setup: Setup, file_chassis: bool = False):
    """search_spaces/full.yaml's knobs and 0.25x budget; its own chassis, or (default) the evidence
    chassis so a 12-trial study fits the time box. unique_blocks is clipped to the chassis depth."""
    from npas.allocation.space_parser import parse_space

    path = ROOT / "search_spaces" / "full.yaml"
    data = yaml.safe_load(path.read_text())
    if not file_chassis:
        data["chassis"] = setup.chassis.to_dict()
    L = int(data["chassis"]["n_layers"])
    ub = data["knobs"]["tying"].get("unique_blocks")
    if isinstance(ub, dict) and ub.get("high", 0) > L:
        data["knobs"]["tying"]["unique_blocks"] = {"low": min(int(ub["low"]), L), "high": L}
    label = f"{path.relative_to(ROOT)}" + ("" if file_chassis else " (knobs and budget; evidence chassis)")
    return parse_space(yaml.safe_dump(data, sort_keys=False), label)


def search_recipe(setup: Setup) -> Recipe:
    """The proxy of the searches: the experiments' recipe with 4 evaluations (the ASHA rungs)."""
    r = setup.recipe
    return Recipe.from_dict({**r.to_dict(), "name": f"{r.name}-search", "eval_every": max(1, r.steps // 4),
                             "eval_batches": max(2, r.eval_batches * 2 // 3)})


def run_search(setup: Setup, space, *, trials: int, early_stop: bool, tag: str, workdir: Path | None = None,
               seed: int = 0) -> dict[str, Any]:
    """One npas.search into a fresh SQLite study under a temp dir; returns where it is and its wall time."""
    import optuna

    from npas import search

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    work = workdir or Path(tempfile.mkdtemp(prefix=f"npas-evidence-{tag}-"))
    work.mkdir(parents=True, exist_ok=True)
    recipe = search_recipe(setup)
    rpath = work / "recipe.yaml"
    rpath.write_text(recipe.to_yaml())
    url = f"sqlite:///{work / 'study.db'}"
    name = f"evidence-{tag}-{int(time.time())}"
    t0 = time.perf_counter()
    search(space, trials=trials, study=name, storage=url, recipe=str(rpath), seed=seed,
                launch=launch(setup.workers, early_stop))
    wall = time.perf_counter() - t0
    return {"storage": url, "study": name, "wall_s": round(wall, 1), "trials": trials, "early_stop": early_stop,
            "recipe": recipe.to_dict(), "space": space.source, "seed": seed, "workdir": str(work)}


def launch(workers: int, early_stop: bool):
    from npas import Launch

    return Launch(workers=workers, early_stop=early_stop)


def shutdown_ray() -> None:
    try:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    except Exception:  # noqa: BLE001 - best effort: a report must not fail on cleanup
        pass


def load_study(info: dict[str, Any]):
    import optuna

    return optuna.load_study(study_name=info["study"], storage=info["storage"])


def trial_rows(study) -> list[dict[str, Any]]:
    """Every trial that ran a proxy: status, fidelity, losses, memory, compute."""
    from optuna.trial import TrialState

    from npas import StudyAttr, TrialAttr, front_trials
    from npas.service.study.studies import is_full_fidelity, status

    tokens_per_step = int(study.user_attrs[StudyAttr.RECIPE]["seq_len"]) * int(study.user_attrs[StudyAttr.RECIPE]["batch_size"])
    front = {t.number for t in front_trials(study)}
    rows = []
    for t in study.get_trials(deepcopy=False):
        proxy = t.user_attrs.get(TrialAttr.PROXY) or {}
        state = status(t)
        if t.state != TrialState.COMPLETE and state != "failed":
            continue
        steps = int(proxy.get("steps_done", t.user_attrs.get(TrialAttr.FIDELITY, 0)) or 0)
        alloc = t.user_attrs.get(TrialAttr.ALLOC)
        rows.append({
            "number": t.number, "status": state, "baseline": t.user_attrs.get(TrialAttr.BASELINE, ""),
            "values": list(t.values) if t.values else None, "steps_done": steps,
            "tokens": steps * tokens_per_step, "wall_s": proxy.get("wall_s"),
            "full_fidelity": is_full_fidelity(t), "on_front": t.number in front,
            "summary": ArchConfig.from_dict(alloc).summary() if alloc else "", "allocation": alloc,
            "stored_params": (t.user_attrs.get(TrialAttr.ACCOUNTING) or {}).get("stored_params"),
            "knobs": t.user_attrs.get(TrialAttr.KNOBS),
        })
    return rows

