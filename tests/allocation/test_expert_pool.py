"""Expert pools shared across layers: sparse routing, gradients, exact counts, balance loss, export."""

from __future__ import annotations

import math

import optuna
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

import npas
from npas.allocation import experts as experts_mod
from npas.allocation.budget import count, stored_params
from npas.allocation.config import ArchConfig, Chassis, ExpertPool
from npas.allocation.space_parser import load_space, parse_space
from npas.errors import ConfigError
from tests.allocation.test_accounting import SETTINGS, check_exact, sample, sample_checked, sweep
from tests.conftest import ROOT, check_export_round_trip, small_space, space_refusal

CH = Chassis(vocab_size=20, context=16, d_model=16, n_layers=4, n_heads=2, d_ff=32)

# expert pools composed with what they may meet: tying, KV sharing, atoms, attention LoRA, SwiGLU
EXPERTS = small_space("""
    tying: {mode: [none, cycle], unique_blocks: {low: 2, high: 3}}
    relaxation: {rank: [0, 2], targets: [attn, both]}
    kv_sharing: {group: [1, 2]}
    atoms: {slots: [none, qk]}
    experts: {per_layer: [2, 3], pool_fraction: [0.25, 0.5, 1.0], topk: [1, 2], router: [per_layer, shared],
              scope: [global, window], window: {low: 1, high: 4}, balance_weight: [0.0, 0.01]}
""", budget="0.75x", composed=True)


def moe(pools=(8,), of_layer=(0, 0, 0, 0), d_expert=8, k=2, router="per_layer", bw=0.01, **kw) -> ArchConfig:
    return ArchConfig(chassis=kw.pop("chassis", CH), mlp_widths=(1,) * CH.n_layers,
                      block_of_layer=kw.pop("block_of_layer", tuple(range(CH.n_layers))),
                      experts=ExpertPool(tuple(pools), tuple(of_layer), d_expert, k, router, bw), **kw)


def _tokens(n: int = 2, t: int = 12) -> torch.Tensor:
    return torch.randint(0, CH.vocab_size, (n, t), generator=torch.Generator().manual_seed(1))


# ---- routing computes only the selected experts ---------------------------------------------
def _grouped_flops(a_shape, b_shape, *args, **kwargs) -> int:
    """FLOPs of aten._grouped_mm (torch's counter has no formula): 2 per MAC over the rows given,
    (n, d_in) x (P, d_in, d_out) for the forward, (d_in, n) x (n, d_out) for a weight gradient."""
    if len(b_shape) == 3:
        return 2 * a_shape[0] * a_shape[1] * b_shape[2]
    return 2 * a_shape[0] * a_shape[1] * b_shape[1]


@pytest.fixture(params=["grouped_mm", "loop"])
def dispatch(request, monkeypatch):
    """Both dispatch paths: F.grouped_mm, and the per-expert loop used where it is unavailable."""
    monkeypatch.setattr(experts_mod, "GROUPED_MM", {} if request.param == "grouped_mm" else {"cpu": False})
    return request.param


def test_expert_flops_grow_with_k_not_with_pool_size(dispatch):
    """Counted matmul FLOPs of the mixture, forward and backward: the same for a pool 4x larger at the
    same k (only the router's d x P scores grow), doubled by k=2. Dense compute would scale with P."""
    flops = {}
    for pool, k in ((4, 1), (16, 1), (4, 2)):
        torch.manual_seed(0)
        model = npas.build_model(moe(pools=(pool,), k=k))
        x = torch.randn(64, CH.d_model)
        with FlopCounterMode(display=False, custom_mapping={torch.ops.aten._grouped_mm: _grouped_flops}) as fc:
            model.experts(x, 0).sum().backward()
        router = 2 * 64 * CH.d_model * pool  # forward scores; x needs no gradient, so backward is 1x
        flops[pool, k] = fc.get_total_flops() - 2 * router
    per_token_expert = 2 * 2 * CH.d_model * 8  # up + down of one expert of width 8, 2 FLOPs per MAC
    # forward 1x + backward 2x (input and weight gradients), except that the up-projection's input
    # (the tokens) needs no gradient, so its backward is 1x
    assert flops[4, 1] == flops[16, 1] > 0
    assert flops[4, 1] == 64 * per_token_expert * 3 - 64 * 2 * CH.d_model * 8
    assert flops[4, 2] == 2 * flops[4, 1]
    assert experts_mod.GROUPED_MM.get("cpu", True) == (dispatch == "grouped_mm")


def test_only_selected_experts_receive_gradient(dispatch):
    torch.manual_seed(0)
    model = npas.build_model(moe(pools=(16,), k=1))
    pools = model.experts
    x = torch.randn(3, CH.d_model)  # 3 tokens, top-1: at most 3 of 16 experts
    with torch.no_grad():
        chosen = set((x @ pools.routers[0].T).argmax(-1).tolist())
    pools(x, 0).sum().backward()
    for name in ("up", "down"):
        grads = getattr(pools.pools[0], name).grad.flatten(1).abs().sum(1)
        assert {e for e in range(16) if grads[e] > 0} == chosen, name  # the rest had no part in the step
    assert len(chosen) <= 3


def test_mixture_equals_the_gated_sum_of_the_chosen_experts(dispatch):
    torch.manual_seed(0)
    model = npas.build_model(moe(pools=(6,), k=2, chassis=Chassis(**{**CH.__dict__, "activation": "swiglu"})))
    pools, bank = model.experts, model.experts.pools[0]
    x = torch.randn(5, CH.d_model)
    with torch.no_grad():
        probs = (x @ pools.routers[2].T).softmax(-1)
        gate, idx = probs.topk(2, -1)
        want = torch.stack([sum(g * bank.expert(int(e), x[t:t + 1])[0] for g, e in zip(gate[t], idx[t], strict=True))
                            for t in range(5)])
        assert torch.allclose(pools(x, 2), want, atol=1e-6)


# ---- gradients and structure ----------------------------------------------------------------
@pytest.mark.parametrize("router", ["per_layer", "shared"])
def test_gradients_reach_every_pool_tensor_and_router(router):
    torch.manual_seed(0)
    cfg = moe(pools=(3, 3), of_layer=(0, 0, 1, 1), k=2, router=router, block_of_layer=(0, 1, 0, 1))
    model = npas.build_model(cfg)
    x = _tokens(4, 16)
    _, loss = model(x, x)
    (loss + model.aux_loss).backward()
    names = [n for n, _ in model.named_parameters() if n.startswith("experts.")]
    assert len([n for n in names if ".routers." in n]) == (4 if router == "per_layer" else 2)
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    # no block stores a dense MLP: the experts replace it
    assert not [n for n in model.state_dict() if "mlp_" in n]


def test_stored_counts_every_expert_activated_counts_k():
    d, L = CH.d_model, CH.n_layers
    small, big = count(moe(pools=(4,), k=1)), count(moe(pools=(16,), k=1))
    per_expert = 2 * d * 8
    assert big.stored_params - small.stored_params == 12 * per_expert + L * d * 12  # experts + router rows
    assert big.expert_params - small.expert_params == 12 * per_expert + L * d * 12
    # a token activates one expert per layer either way: only the routers' scores differ
    assert big.activated_params - small.activated_params == L * d * 12
    assert big.flops_per_token - small.flops_per_token == 2 * L * d * 12
    two = count(moe(pools=(4,), k=2))
    assert two.activated_params - small.activated_params == L * per_expert
    assert two.stored_params == small.stored_params
    # per-layer MoE (one pool per layer) stores 4x the experts of a global pool of the same size per layer
    per_layer = count(moe(pools=(4, 4, 4, 4), of_layer=(0, 1, 2, 3), k=1))
    assert per_layer.activated_params == small.activated_params
    assert per_layer.expert_params == 16 * per_expert + L * d * 4
    for cfg in (moe(pools=(4,), k=1), moe(pools=(3, 2), of_layer=(0, 0, 0, 1), router="shared")):
        assert count(cfg).stored_params == stored_params(cfg) == npas.build_model(cfg).num_params()
    assert count(moe(pools=(3, 2), of_layer=(0, 0, 0, 1), k=2, router="shared")).expert_params == \
        5 * per_expert + d * 5


# ---- balance loss ---------------------------------------------------------------------------
def test_balance_loss_is_switch_over_the_whole_pool():
    torch.manual_seed(0)
    cfg = moe(pools=(4,), k=1, bw=0.5)
    model = npas.build_model(cfg)
    pools = model.experts
    xs = [torch.randn(10, CH.d_model) for _ in range(2)]
    pools.reset()
    for layer, x in enumerate(xs):
        pools(x, layer)
    with torch.no_grad():
        probs = torch.cat([(x @ pools.routers[i].T).softmax(-1) for i, x in enumerate(xs)])  # both layers' tokens
        f = torch.bincount(probs.argmax(-1), minlength=4).float() / 20
        want = 4 * (f * probs.mean(0)).sum()
    assert torch.allclose(pools.balance_loss(), want)
    x = _tokens()
    model(x)
    assert torch.allclose(model.aux_loss, 0.5 * pools.balance_loss())
    assert 0.5 <= model.aux_loss.item() <= 0.5 * 4  # between balanced (1) and all on one expert (P)


def test_balance_loss_is_part_of_the_training_loss():
    """Two trainings that differ only in the balance weight: the weight changes nothing in the forward
    pass, so the routers end up different only if the proxy loop adds the balance loss to the loss."""
    from npas.training.data import load_corpus
    from npas.training.forks import train_model
    from npas.training.recipe import Recipe

    ch = Chassis(vocab_size=68, context=32, d_model=16, n_layers=2, n_heads=2, d_ff=32)
    recipe = Recipe(name="t", seq_len=16, batch_size=4, steps=3, lr=1e-2, min_lr=1e-3, warmup_steps=1,
                    eval_every=3, eval_batches=1, threads=1)
    corpus = load_corpus()
    routers = []
    for bw in (0.0, 10.0):
        cfg = ArchConfig(chassis=ch, mlp_widths=(1, 1), block_of_layer=(0, 1),
                         experts=ExpertPool((4,), (0, 0), 8, 1, "per_layer", bw))
        model, res = train_model(cfg, recipe, corpus)
        assert res.status == "ok"
        routers.append(model.experts.routers[0].detach().clone())
    assert not torch.allclose(routers[0], routers[1])


# ---- the space, the fit, the baseline -------------------------------------------------------
@SETTINGS
@given(seed=st.integers(0, 2**31 - 1))
def test_count_equals_built_model_with_expert_pools(seed):
    cand = sample_checked(parse_space(EXPERTS, "experts"), seed)
    assert cand is None or (cand.config.experts is not None and cand.fit.free == "d_expert")


def test_the_space_reaches_every_expert_combination():
    def features(cfg: ArchConfig) -> set[str]:
        e = cfg.experts
        return ({f"pools={'1' if len(e.pool_sizes) == 1 else 'many'}", e.router, f"k={e.top_k}"}
                | ({"tied+experts"} if cfg.n_blocks < 6 else set()) | ({"atoms+experts"} if cfg.atoms else set()))

    feasible, seen = sweep(parse_space(EXPERTS, "experts"), 80, features)
    assert feasible >= 60
    assert seen >= {"pools=1", "pools=many", "per_layer", "shared", "k=1", "k=2", "tied+experts",
                    "atoms+experts"}, seen


def test_shipped_space_fits_and_enqueues_per_layer_moe():
    space = load_space(ROOT / "search_spaces" / "expert_pool.yaml")
    baselines = space.baselines()
    assert "per_layer_moe" in baselines and baselines["narrow_untied"]["experts_per_layer"] == 0
    study = optuna.create_study()
    cand = space.sample(study.ask(), fixed=baselines["per_layer_moe"])
    e, L = cand.config.experts, space.reference_chassis.n_layers
    assert e.pool_of_layer == tuple(range(L)) and e.pool_sizes == (4,) * L  # each layer its own E experts
    check_exact(space, cand)
    # a global pool at half the per-layer experts, same k: wider experts at the same stored budget
    pool = space.sample(study.ask(), fixed={"expert_scope": "global", "expert_pool_fraction": 0.5,
                                            "experts_topk": e.top_k, "expert_router": "per_layer"})
    assert pool.config.experts.pool_sizes == (L * 4 // 2,)
    check_exact(space, pool)
    assert pool.config.experts.d_expert > e.d_expert
    assert space.budget_params - pool.fit.stored < pool.fit.step  # exactly filled by the expert width


def test_expert_pools_do_not_apply_with_banks_so_such_samples_stay_dense():
    """Shapeshifter pools and an expert pool would both own the MLP weights: experts.per_layer only
    applies when pools are off (the knob table's condition), so a sample with pools is a dense one;
    a space whose pools are always on could never sample experts, and is refused at load."""
    text = EXPERTS.replace("atoms: {slots: [none, qk]}", "pools: {enabled: [false, true]}")
    space = parse_space(text)
    cands = [sample(space, s) for s in range(12)]
    pooled = [c for c in cands if c.values.get("pools")]
    assert pooled and all(c.config.experts is None and c.config.banks for c in pooled if c.feasible)
    assert all("experts_per_layer" not in c.values for c in pooled)
    assert any(c.config is not None and c.config.experts for c in cands if not c.values.get("pools"))
    always = EXPERTS.replace("atoms: {slots: [none, qk]}", "pools: {enabled: [true]}")
    assert "pools.enabled always true" in str(space_refusal(always))


@pytest.mark.parametrize("change, fragment", [
    ({"pools": (2,), "k": 3}, "top_k"),
    ({"pools": (4, 4), "of_layer": (0, 0, 0, 0)}, "pool_of_layer"),
    ({"of_layer": (0, 0, 0)}, "pool_of_layer"),
    ({"router": "global"}, "experts.router"),
    ({"bw": -1.0}, "balance_weight"),
    ({"lora_mlp": (0, 2, 0, 2), "block_of_layer": (0, 1, 0, 1)}, "lora_mlp"),
])
def test_invalid_expert_pools_name_the_problem(change, fragment):
    with pytest.raises(ConfigError) as e:
        moe(**change)
    assert fragment in str(e.value)


@pytest.mark.parametrize("knobs, fragment", [
    ("experts: {per_layer: [4], router: [per_layer, global]}", "knobs.experts.router"),
    ("experts: {per_layer: [4], scope: [local]}", "knobs.experts.scope"),
    ("experts: {per_layer: [4], window: [9]}", "knobs.experts.window"),
    ("experts: {per_layer: [-1]}", "knobs.experts.per_layer"),
])
def test_bad_expert_knobs_are_refused(knobs, fragment):
    assert fragment in str(space_refusal(small_space(knobs, budget="1x")))


# ---- export ---------------------------------------------------------------------------------
def test_export_round_trip_rebuilds_exactly(tmp_path):
    cfg = moe(pools=(3, 2), of_layer=(0, 0, 1, 1), k=2, router="shared", bw=0.02, block_of_layer=(0, 1, 0, 1),
              lora_attn=(2, 2, 2, 2))
    assert cfg.mlp_widths == (16,) * 4
    assert "experts" not in moe().to_dict() or moe().to_dict()["experts"]["top_k"] == 2
    assert "experts" not in ArchConfig(chassis=CH, mlp_widths=(8,) * 4, block_of_layer=(0, 1, 2, 3)).to_dict()
    check_export_round_trip(cfg, tmp_path)


def test_wrongly_typed_expert_fields_are_refused():
    d = moe().to_dict()
    d["experts"]["d_expert"] = 8.0
    with pytest.raises(ConfigError, match="experts.d_expert"):
        ArchConfig.from_dict(d)
    d["experts"] = {"pool_sizes": [4]}
    with pytest.raises(ConfigError, match="experts"):
        ArchConfig.from_dict(d)
    assert math.isclose(ArchConfig.from_dict(moe(bw=0.25).to_dict()).experts.balance_weight, 0.25)


def test_front_table_with_flops_as_an_objective():
    # expert_pool.yaml's objectives include flops_per_token, which the front also lists as accounting:
    # one column, printable (the search's closing table crashed on the duplicate)
    from npas.presentation.cli.units import humanize
    from npas.service.study.record import TrialAttr
    from npas.service.study.studies import front_frame

    study = optuna.create_study(directions=["minimize", "minimize"])
    study.set_metric_names(["val_loss", "flops_per_token"])
    for loss, flops in ((2.5, 3_000_000), (2.4, 4_000_000)):
        study.add_trial(optuna.trial.create_trial(
            values=[loss, flops], user_attrs={TrialAttr.ACCOUNTING: {"stored_params": 10, "flops_per_token": flops}}))
    df = front_frame(study)
    assert list(df.columns).count("flops_per_token") == 1 and list(df["flops_per_token"]) == [4_000_000, 3_000_000]
    assert "FLOPs/token" in humanize(df).columns
