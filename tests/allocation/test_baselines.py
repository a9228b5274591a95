"""The per-layer MoE baseline is one a careful person would hand-build (issue #29, defect 6).

It used to take the space's largest experts-per-layer E whatever the budget, so full.yaml (0.25x)
enqueued experts of width 4 at d_model 104: a strawman. Now the baseline keeps every expert at least
d_model / 2 wide (the most experts per layer that allow it, at most the space's largest E), and a
space where no such MoE fits the budget enqueues none. Checked on what a study really enqueues and
then samples for the baseline trial, not only on the values `baselines()` returns.
"""

from __future__ import annotations

import optuna
import pytest

from npas.allocation.space_parser import load_space, parse_space
from npas.service.search.samplers import baseline_fixed, enqueue_baselines
from npas.service.study.record import TrialAttr
from tests.conftest import SPACES, small_space


def _enqueued(space) -> dict[str, object]:
    """name -> the candidate each enqueued baseline trial samples, as a study's first asks do."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    names = enqueue_baselines(study, space, TrialAttr.BASELINE)
    out = {}
    for _ in names:
        trial = study.ask()
        out[trial.user_attrs[TrialAttr.BASELINE]] = space.sample(trial, fixed=baseline_fixed(trial, space,
                                                                                            TrialAttr.BASELINE))
    assert list(out) == names
    return out


def _wide_enough(cfg) -> bool:
    return 2 * cfg.experts.d_expert >= cfg.chassis.d_model


@pytest.mark.parametrize("path", SPACES, ids=[p.stem for p in SPACES])
def test_every_enqueued_per_layer_moe_keeps_experts_at_least_half_d_model_wide(path):
    space = load_space(path)
    enqueued = _enqueued(space)
    if "per_layer_moe" in enqueued:
        cand = enqueued["per_layer_moe"]
        assert cand.feasible, cand.reason
        cfg = cand.config
        assert _wide_enough(cfg), (path.stem, cfg.summary())
        assert cand.fit.stored <= space.budget_params
        # each layer its own pool, nothing shared: what makes it the per-layer MoE
        assert cfg.experts.pool_of_layer == tuple(range(cfg.chassis.n_layers))
        assert len(set(cfg.experts.pool_sizes)) == 1 and cfg.experts.pool_sizes[0] > cfg.experts.top_k


def test_full_space_at_a_quarter_budget_enqueues_no_per_layer_moe():
    """At 0.25x of the reference, attention leaves the MLPs a few thousand parameters per layer: even two
    experts per layer would be ~10 units wide at d_model 104. No honest per-layer MoE fits, so none is
    enqueued (it used to enqueue 8 layers x 4 experts of width 4)."""
    space = load_space(next(p for p in SPACES if p.stem == "full"))
    assert space.knobs["experts_per_layer"].options() == [0, 4]  # the space does search expert pools
    assert "per_layer_moe" not in space.baselines()
    assert "per_layer_moe" not in _enqueued(space)


def test_expert_pool_space_keeps_its_per_layer_moe_at_full_width():
    space = load_space(next(p for p in SPACES if p.stem == "expert_pool"))
    cand = _enqueued(space)["per_layer_moe"]
    e = cand.config.experts
    assert (len(e.pool_sizes), e.pool_sizes[0], e.top_k) == (8, 4, 1)  # E = 4 per layer, top-1
    assert _wide_enough(cand.config)


def test_the_most_experts_that_keep_the_width_are_chosen():
    """E = 16 per layer would make experts narrower than d_model / 2 at this budget; the baseline takes
    the largest E below it that does not, and E + 1 would not have."""
    text = small_space("experts: {per_layer: [0, 16], topk: [1, 2]}", budget="1x")
    space = parse_space(text)
    vals = space.baselines()["per_layer_moe"]
    chassis = {k: kn.default for k, kn in space.chassis.items()}

    def fitted(e: int):
        return space.candidate({**chassis, **vals, "experts_per_layer": e}).config

    e = vals["experts_per_layer"]
    assert 1 < e < 16 and vals["experts_topk"] == 1
    assert _wide_enough(fitted(e)) and not _wide_enough(fitted(e + 1))
    assert not _wide_enough(fitted(16))  # the old baseline's width: the strawman this replaces
