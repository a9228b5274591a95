"""A study keeps the allocations it stored: a re-run trains what its trial was fitted with, whichever
fit made it, and every trial records the fit version that sampled its allocation (absent = 1).

The admission step runs on a real in-memory Optuna study; nothing is trained.
"""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

import npas.allocation.space as space_module
from npas.allocation.budget import stored_params
from npas.allocation.fill import FILL_TARGET, FIT_VERSION
from npas.service.search.admission import Runnable, prepare
from npas.service.study import faults
from npas.service.study.record import TrialAttr
from tests.allocation.test_fill import UNDER_FILLED, _space

RECIPE = {"batch_size": 4, "seq_len": 32, "steps": 10}
# the searched knobs of shapeshifter.yaml (the rest are fixed by the file) for its under-filled candidate
PARAMS = {"bank_rule": "all", "n_banks": 1, "generator": "tie"}


def _admit(study: optuna.Study, space) -> tuple[optuna.Trial, Runnable]:
    trial = study.ask()
    out = prepare(trial, space, RECIPE, "fingerprint")
    assert isinstance(out, Runnable), out
    return trial, out


def test_a_new_trial_records_the_fit_that_sampled_it_and_its_exact_fill():
    space = _space("shapeshifter")
    study = optuna.create_study()
    study.enqueue_trial(PARAMS)
    trial, run = _admit(study, space)
    attrs = study.trials[trial.number].user_attrs
    assert attrs[TrialAttr.FIT_VERSION] == FIT_VERSION
    assert attrs[TrialAttr.FILL] == round(run.accounting["stored_params"] / space.budget_params, 6) >= FILL_TARGET
    assert TrialAttr.SHORT not in attrs


def test_a_rerun_keeps_the_allocation_an_older_fit_stored(monkeypatch):
    space = _space("shapeshifter")
    study = optuna.create_study()
    study.enqueue_trial(PARAMS)
    old_trial = study.ask()
    with monkeypatch.context() as m:  # the first fit: the free size alone, banks' spare budget left unused
        m.setattr(space_module, "grow_pooled", lambda fit, *_: fit)
        old = space.sample(old_trial).config
    # what a trial of a study written before fit versions were recorded carries: no fit_version
    old_trial.set_user_attr(TrialAttr.ALLOC, old.to_dict())
    old_trial.set_user_attr(TrialAttr.FILL, round(stored_params(old) / space.budget_params, 6))
    assert old_trial.user_attrs[TrialAttr.FILL] == pytest.approx(UNDER_FILLED["shapeshifter-tie-one-bank"][2], abs=1e-3)
    study.tell(old_trial, state=TrialState.FAIL)  # its driver died mid-run
    faults.requeue(study, study.trials[old_trial.number])

    rerun, run = _admit(study, space)  # the current fit would grow this candidate: the re-run must not
    attrs = study.trials[rerun.number].user_attrs
    assert attrs[TrialAttr.RETRY_OF] == old_trial.number
    assert run.config["allocation"] == attrs[TrialAttr.ALLOC] == old.to_dict()
    assert attrs[TrialAttr.FIT_VERSION] == 1
    assert attrs[TrialAttr.FILL] == study.trials[old_trial.number].user_attrs[TrialAttr.FILL] < FILL_TARGET

    study.enqueue_trial(PARAMS)  # a new trial of the same knobs gets the current fit: filled, another allocation
    fresh, run = _admit(study, space)
    attrs = study.trials[fresh.number].user_attrs
    assert attrs[TrialAttr.FIT_VERSION] == FIT_VERSION and attrs[TrialAttr.FILL] >= FILL_TARGET
    assert run.config["allocation"] != old.to_dict()


def test_a_rerun_enqueued_without_its_allocation_finds_it_through_the_trial_it_retries(monkeypatch):
    # a study interrupted under an npas whose requeue carried only the parameters (and a ladder checkpoint)
    space = _space("shapeshifter")
    study = optuna.create_study()
    study.enqueue_trial(PARAMS)
    first = study.ask()
    with monkeypatch.context() as m:
        m.setattr(space_module, "grow_pooled", lambda fit, *_: fit)
        old = space.sample(first).config
    first.set_user_attr(TrialAttr.ALLOC, old.to_dict())
    study.tell(first, state=TrialState.FAIL)
    study.enqueue_trial(PARAMS, user_attrs={TrialAttr.RETRY_OF: first.number})
    rerun, run = _admit(study, space)
    assert run.config["allocation"] == old.to_dict()
    assert study.trials[rerun.number].user_attrs[TrialAttr.FIT_VERSION] == 1
