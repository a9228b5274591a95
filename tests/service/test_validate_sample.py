"""`npas validate --sample M` adds M searched trials on top of the baselines (issue #29, defect 7).

The baselines used to count toward the sample: on a study with 3 baselines, ``--top 2 --sample 3``
retrained the front, the pick and the 3 baselines and not one sampled trial, so the certificate's
rank correlation rested on hand-made allocations. Checked on the plan itself (no training).
"""

from __future__ import annotations

import optuna
import pytest

from npas.service.certify.targets import Options, make_plan
from npas.service.study.record import TrialAttr
from npas.training.recipe import load_recipe
from tests.service.test_validate import FAST, synthetic_study


@pytest.fixture(scope="module")
def study():
    """A 10-trial study with 3 baselines; make_plan only reads it, so the tests share one."""
    storage = optuna.storages.InMemoryStorage()
    name, _ = synthetic_study(storage, n=10)
    return optuna.load_study(study_name=name, storage=storage)


def _plan(study, top: int, sample: int):
    return make_plan(study, Options(top=top, sample=sample, pick="min-loss"), load_recipe(FAST))


def test_baselines_come_on_top_of_the_sample(study):
    trials = {t.number: t for t in study.get_trials()}
    baselines = {n for n, t in trials.items() if t.user_attrs.get(TrialAttr.BASELINE)}
    assert len(baselines) == 3  # narrow_untied, full_tying, cycle_tying of the tiny space
    plan = _plan(study, top=2, sample=3)
    by_role = {role: [t for t in plan.targets if role in t.roles] for role in ("front", "baseline", "sample")}
    # every baseline is retrained ...
    assert {t.source for t in by_role["baseline"]} == baselines
    # ... and the sample is 3 searched trials besides, none of them a baseline or already in the plan
    sampled = [t.source for t in by_role["sample"]]
    assert len(sampled) == 3 and not set(sampled) & baselines
    assert all(t.roles == ("sample",) for t in by_role["sample"])
    # spread over the proxy-loss range of the trials nothing else retrains: the middle of 3 strata
    li = 0  # val_loss
    taken = {t.source for t in plan.targets if t.source is not None and "sample" not in t.roles}
    rest = sorted((t for t in trials.values() if t.number not in taken), key=lambda t: (t.values[li], t.number))
    assert sampled == [rest[int((k + 0.5) * len(rest) / 3)].number for k in range(3)]


@pytest.mark.parametrize("sample", [0, 1, 50])
def test_sample_size_is_what_was_asked_where_the_study_has_the_trials(study, sample):
    plan = _plan(study, top=2, sample=sample)
    baselines = [t for t in plan.targets if "baseline" in t.roles]
    sampled = [t for t in plan.targets if "sample" in t.roles]
    assert len(baselines) == 3  # with --sample 0 too: baselines do not depend on the sample
    others = len({t.source for t in plan.targets if t.source is not None and "sample" not in t.roles})
    assert len(sampled) == min(sample, len(study.trials) - others)
