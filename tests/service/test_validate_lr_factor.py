"""`npas validate` retrains each searched allocation at the learning-rate factor its trial located
(issue #35 item 1): the long recipe's whole schedule times that factor, recorded on the linked trial and
in the certificate; a trial without one (every study from before) is retrained exactly as before, under
the same job key, so a validation resumed across the upgrade reruns nothing."""

from __future__ import annotations

import copy
import hashlib
import json

import optuna

from npas.service.certify.retrain import certify, linked_name
from npas.service.certify.targets import Options, make_plan
from npas.service.study.record import RetrainAttr, TrialAttr
from npas.training.recipe import Recipe, load_recipe
from tests.study_fixture import FAST, load, rebuild

LOCATED = 4  # the smoke study's lowest-loss front trial gets a located factor


def _study(tmp_path) -> tuple[optuna.Study, str]:
    data = copy.deepcopy(load())
    data["trials"][LOCATED]["user_attrs"][TrialAttr.LR_FACTOR] = 2.0
    url = f"sqlite:///{tmp_path}/npas.db"
    return rebuild(data, url), url


def test_each_target_is_retrained_at_its_trials_factor(tmp_path):
    study, url = _study(tmp_path)
    long = load_recipe(FAST)
    seen: dict[str, set[tuple[float, float]]] = {}

    def retrain(cfg, recipe: Recipe) -> float:  # records the recipe each allocation is retrained under
        seen.setdefault(cfg.hash, set()).add((recipe.lr, recipe.min_lr))
        return 3.0 + recipe.seed * 1e-6 + len(seen) * 1e-3

    opts = Options(recipe=FAST, seeds=2, top=4, sample=1, workers=0, threads=None)
    cert = certify("smoke", opts, storage=url, retrain=retrain)
    located = study.trials[LOCATED].user_attrs[TrialAttr.HASH]
    assert seen[located] == {(2 * long.lr, 2 * long.min_lr)}
    assert all(v == {(long.lr, long.min_lr)} for h, v in seen.items() if h != located)
    rows = {r["hash"]: r for r in cert["allocations"]}
    assert rows[located]["lr_factor"] == 2.0 and {r["lr_factor"] for h, r in rows.items() if h != located} == {1.0}
    linked = optuna.load_study(study_name=linked_name("smoke"), storage=url)
    factors = {t.user_attrs[RetrainAttr.HASH]: t.user_attrs.get(RetrainAttr.LR_FACTOR) for t in linked.trials}
    assert factors[located] == 2.0 and {f for h, f in factors.items() if h != located} == {None}


def test_a_factor_of_one_keeps_the_job_key_of_before(tmp_path):
    study, _ = _study(tmp_path)
    plan = make_plan(study, Options(recipe=FAST, seeds=2, top=4, sample=1), load_recipe(FAST))
    for target in plan.targets:
        old = hashlib.sha256(json.dumps({"a": target.cfg.hash, "r": plan.recipe.to_dict(), "s": plan.seeds[0],
                                         "d": plan.fingerprint, "split": plan.split},
                                        sort_keys=True).encode()).hexdigest()[:16]
        assert (plan.key(target, plan.seeds[0]) == old) == (target.lr_factor == 1.0), target.source
    assert {t.source for t in plan.targets if t.lr_factor == 2.0} == {LOCATED}
