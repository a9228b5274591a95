"""Per-token recursion depth (Mixture-of-Recursions): the equivalences that pin the mechanism to plain
tying, causality of the evaluation rule, skipped compute, the router losses and the file format."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from npas.allocation.budget import stored_params
from npas.allocation.config import ArchConfig, Chassis
from npas.allocation.recursion import RecursionSpec
from npas.allocation.recursion_allocation import recursion_config
from npas.allocation.transformer import build_model
from npas.errors import ConfigError

CLASSIC = Chassis(vocab_size=32, context=32, d_model=32, n_layers=6, n_heads=4, d_ff=64)
LLAMA = Chassis(vocab_size=32, context=32, d_model=32, n_layers=6, n_heads=4, d_ff=48, activation="swiglu",
                family="llama", n_kv_heads=2)


def spec(**kw) -> RecursionSpec:
    base = {"steps": 3, "stack": 2}
    return RecursionSpec(**{**base, **kw})


def plain_of(cfg: ArchConfig) -> ArchConfig:
    """The same allocation without recursion: cycle tying (and its KV sources) of the same stack."""
    return dataclasses.replace(cfg, recursion=None)


def built(cfg: ArchConfig, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(cfg).eval()


def tokens(seed: int = 1, B: int = 3, T: int = 16) -> torch.Tensor:
    return torch.randint(0, 32, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("chassis", [CLASSIC, LLAMA], ids=["classic", "llama"])
@pytest.mark.parametrize("first,last", [(0, 0), (1, 1)])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_capacity_one_with_no_gate_is_plain_cycle_tying(chassis, first, last, mode):
    cfg = recursion_config(chassis, spec(first=first, last=last, gate="none", capacities=(1.0, 1.0, 1.0)))
    mor, plain = built(cfg), built(plain_of(cfg))
    mor.train(mode == "train")
    plain.train(mode == "train")
    x = tokens()
    # the same seed draws the same weights: recursion's router is drawn after all of them
    assert all(torch.equal(p, mor.state_dict()[k]) for k, p in plain.state_dict().items())
    assert torch.equal(mor(x)[0], plain(x)[0])


def test_shared_first_at_capacity_one_is_cycle_tying_with_kv_sharing():
    cfg = recursion_config(CLASSIC, spec(kv="shared_first", gate="none"))
    assert cfg.kv_source == (0, 1, 0, 1, 0, 1)
    mor, plain = built(cfg), built(plain_of(cfg))
    x = tokens()
    assert torch.equal(mor(x)[0], plain(x)[0])


@pytest.mark.parametrize("chassis", [CLASSIC, LLAMA], ids=["classic", "llama"])
def test_one_step_is_the_untied_stack(chassis):
    cfg = recursion_config(chassis, RecursionSpec(steps=1, stack=3, gate="none"))
    untied = ArchConfig(chassis=cfg.chassis, mlp_widths=cfg.mlp_widths, block_of_layer=(0, 1, 2))
    mor, plain = built(cfg), built(untied)
    x = tokens()
    assert torch.equal(mor(x)[0], plain(x)[0])


@pytest.mark.parametrize("chassis", [CLASSIC, LLAMA], ids=["classic", "llama"])
@pytest.mark.parametrize("router,kv", [("expert_choice", "per_step"), ("expert_choice", "shared_first"),
                                       ("token_choice", "per_step")])
def test_a_later_token_never_changes_earlier_logits_in_evaluation(chassis, router, kv):
    caps = (1.0, 0.5, 0.25) if router == "expert_choice" else ()
    cfg = recursion_config(chassis, spec(router=router, kv=kv, capacities=caps, first=1))
    model = built(cfg)
    with torch.no_grad():
        model.recursion.threshold.zero_()  # scores straddle 0 at init: some tokens stop, some go on
        x = tokens(T=24)
        y = x.clone()
        y[:, 12:] = (y[:, 12:] + 7) % 32
        a, b = model(x)[0], model(y)[0]
        share = model.recursion.active_share
    # equal up to float rounding: the padded slices of the two batches may differ in length, so the
    # matmuls run at other shapes; a rule that reads later tokens moves logits by far more (next test)
    assert (a[:, :12] - b[:, :12]).abs().max() < 1e-5
    assert (a[:, 12:] - b[:, 12:]).abs().max() > 1e-2
    assert 0 < float(share[-1]) < 1  # the causal rule really routed tokens out


def test_the_training_rule_is_not_causal_and_the_causal_rule_is_what_eval_uses():
    cfg = recursion_config(CLASSIC, spec(capacities=(1.0, 0.5, 0.25)))
    model = built(cfg)
    x = tokens(T=24)
    y = x.clone()
    y[:, 12:] = (y[:, 12:] + 7) % 32
    model.recursion.rule = "train"  # sequence-level top-k: a later token can change who is kept earlier
    with torch.no_grad():
        a, b = model(x)[0], model(y)[0]
    assert (a[:, :12] - b[:, :12]).abs().max() > 1e-2
    model.recursion.rule = None
    assert model.recursion.active_rule() == "causal"
    model.train()
    assert model.recursion.active_rule() == "train"


def test_routed_out_tokens_skip_the_stack():
    """At capacity 0.5 the stack's layers of steps 1 and 2 see half the sequence, not a masked whole."""
    cfg = recursion_config(CLASSIC, spec(capacities=(1.0, 0.5, 0.5)))
    model = built(cfg).train()
    seen: dict[int, int] = {}
    for i, layer in enumerate(model.h):
        layer.register_forward_pre_hook(lambda mod, args, i=i: seen.__setitem__(i, args[0].shape[1]))
    model(tokens(T=16))
    assert seen == {0: 16, 1: 16, 2: 8, 3: 8, 4: 8, 5: 8}


def test_token_choice_runs_each_token_only_through_the_passes_it_chose():
    cfg = recursion_config(CLASSIC, spec(router="token_choice", gate="none"))
    model = built(cfg).train()
    with torch.no_grad():  # row 0 of the router picks depth 1 for every token, unless its score is beaten
        model.recursion.router.zero_()
        model.recursion.router[1, 0] = 1.0  # steers on the first residual coordinate: tokens differ
    seen: dict[int, int] = {}
    for i, layer in enumerate(model.h):
        layer.register_forward_pre_hook(lambda mod, args, i=i: seen.__setitem__(i, args[0].shape[1]))
    x = tokens(B=1, T=16)
    model(x)
    share = model.recursion.active_share.tolist()
    assert share[0] == 1.0 and 0 < share[1] < 1 and share[2] == 0.0  # depth 3 is never chosen: zero logit ties lose
    assert seen[2] == round(share[1] * 16) < 16 and 4 not in seen  # only the chosen tokens ran pass 2; none pass 3


def test_a_kept_token_computes_what_the_stack_computes_on_the_kept_subsequence():
    """The gathered slice attends causally over the kept tokens only (per-step KV): on a classic
    chassis it equals running the step's layers on those tokens' hidden states alone."""
    cfg = recursion_config(CLASSIC, spec(steps=2, stack=1, gate="none", capacities=(1.0, 0.5)))
    model = built(cfg).train()
    x = tokens(B=1, T=8)
    captured = {}
    model.h[1].register_forward_pre_hook(lambda mod, args: captured.__setitem__("in", args[0]))
    model.h[1].register_forward_hook(lambda mod, args, out: captured.__setitem__("out", out[0]))
    model(x)
    plain = built(plain_of(cfg)).train()
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("recursion")})
    w = plain.materialise()[0]
    ref = plain.h[1](captured["in"], w, plain.h[1].ln_1, plain.h[1].ln_2)[0]
    assert torch.allclose(ref, captured["out"], atol=1e-6)


@pytest.mark.parametrize("router", ["expert_choice", "token_choice"])
def test_router_losses_reach_the_training_loss_and_the_router(router):
    caps = (1.0, 0.5, 0.25) if router == "expert_choice" else ()
    cfg = recursion_config(CLASSIC, spec(router=router, capacities=caps))
    model = built(cfg).train()
    _, loss = model(tokens(), tokens(2))
    aux = model.aux_loss
    assert aux.requires_grad and float(aux.detach()) > 0
    (loss + aux).backward()
    assert model.recursion.router.grad is not None and float(model.recursion.router.grad.abs().sum()) > 0


def test_training_tracks_the_causal_threshold():
    cfg = recursion_config(CLASSIC, spec(capacities=(1.0, 0.5, 0.25)))
    model = built(cfg).train()
    model(tokens(T=24))
    assert model.recursion.updates.tolist() == [0.0, 1.0, 1.0]
    assert float(model.recursion.threshold[1]) != 0.0
    model.eval()
    with torch.no_grad():
        model(tokens(T=24))
    assert model.recursion.updates.tolist() == [0.0, 1.0, 1.0]  # evaluation never moves it


def test_decoding_with_a_cache_is_refused_in_one_line():
    model = built(recursion_config(CLASSIC, spec()))
    from transformers import DynamicCache

    with pytest.raises(ValueError, match="without a KV cache"):
        model(tokens(), cache=DynamicCache())


def test_file_round_trip_and_hash():
    cfg = recursion_config(LLAMA, spec(first=1, last=1, capacities=(1.0, 0.6, 0.3), kv="shared_first"))
    again = ArchConfig.from_yaml(cfg.to_yaml())
    assert again == cfg and again.hash == cfg.hash
    assert "recursion" not in plain_of(cfg).to_dict()


@pytest.mark.parametrize("change,fragment", [
    ({"capacities": (1.0, 0.5)}, "one capacity per step"),
    ({"capacities": (1.0, 0.25, 0.5)}, "never rise"),
    ({"router": "sometimes"}, "recursion.router"),
    ({"kv": "shared_first", "capacities": (0.5, 0.5, 0.5)}, "step 0 needs capacity 1"),
    ({"router": "token_choice", "capacities": (1.0, 0.5, 0.5)}, "token_choice routes"),
    ({"steps": 0}, "recursion.steps"),
])
def test_bad_specs_are_refused_in_one_line(change, fragment):
    base = recursion_config(CLASSIC, spec())
    with pytest.raises(ConfigError, match=fragment):
        dataclasses.replace(base, recursion=dataclasses.replace(base.recursion, **change))


def test_a_layout_that_is_not_the_specs_is_refused():
    base = recursion_config(CLASSIC, spec())
    with pytest.raises(ConfigError, match="recursion layout"):
        dataclasses.replace(base, block_of_layer=(0, 1, 2, 0, 1, 2))
    with pytest.raises(ConfigError, match="set chassis.n_layers to 8"):
        dataclasses.replace(base, recursion=spec(first=1, last=1))


def test_bad_file_fields_are_named():
    d = recursion_config(CLASSIC, spec()).to_dict()
    d["recursion"]["capacities"] = "half"
    d["recursion"]["steps"] = 3.0
    with pytest.raises(ConfigError, match=r"recursion.steps: must be an integer.*recursion.capacities"):
        ArchConfig.from_dict(d)


@pytest.mark.parametrize("chassis", [CLASSIC, LLAMA], ids=["classic", "llama"])
@pytest.mark.parametrize("kw", [{}, {"first": 1, "last": 1, "kv": "shared_first"}, {"router": "token_choice"}])
def test_stored_params_count_the_stack_the_unique_layers_and_the_router(chassis, kw):
    from npas.allocation.budget import count, stored_params

    cfg = recursion_config(chassis, spec(**kw))
    built_sum = sum(p.numel() for p in build_model(cfg).parameters())
    acc = count(cfg)
    assert acc.stored_params == stored_params(cfg) == built_sum
    assert acc.recursion_params == 3 * chassis.d_model
    assert stored_params(cfg) == stored_params(plain_of(cfg)) + 3 * chassis.d_model


def test_flops_follow_the_capacities_and_the_realised_depth():
    from npas.allocation.budget import count

    full = recursion_config(CLASSIC, spec(capacities=(1.0, 1.0, 1.0)))
    half = recursion_config(CLASSIC, spec(capacities=(1.0, 0.5, 0.5)))
    plain = count(plain_of(full), seq_len=32)
    f_full, f_half = count(full, seq_len=32), count(half, seq_len=32)
    router = 2 * 32 * 3
    assert f_full.flops_per_token == plain.flops_per_token + router
    assert f_half.flops_per_token < f_full.flops_per_token
    # the realised depth of an evaluation replaces the capacities
    assert count(half, seq_len=32, depth_shares=(1.0, 1.0, 1.0)).flops_per_token == f_full.flops_per_token
    assert f_half.kv_cache_bytes_per_token == round(plain.kv_cache_bytes_per_token * (2 + 4 * 0.5) / 6)
    assert f_half.layer_share == (1.0, 1.0, 0.5, 0.5, 0.5, 0.5)
    # the gathers' copies are in the activation estimate: more than the half-depth layers alone save
    assert f_half.activation_bytes < f_full.activation_bytes
    assert "layer_share" not in plain.to_dict()
    # fixed-depth recursion (every token every pass, no gate) reads no score: cycle tying's FLOPs exactly
    fixed = recursion_config(CLASSIC, spec(gate="none"))
    assert count(fixed, seq_len=32).flops_per_token == plain.flops_per_token


@pytest.mark.parametrize("name", ["recursion", "recursion_llama"])
def test_the_space_reaches_every_router_kv_and_layout_and_enqueues_its_baselines(name):
    from npas.allocation.space_parser import load_space
    from tests.allocation.test_accounting import sweep
    from tests.conftest import ROOT

    space = load_space(ROOT / "search_spaces" / f"{name}.yaml")

    def features(cfg: ArchConfig) -> set[str]:
        r = cfg.recursion
        return set() if r is None else {r.router, r.kv, "middle" if r.first else "cycle", f"steps{r.steps}"}

    feasible, seen = sweep(space, 40, features)
    assert feasible == 40
    assert seen >= {"expert_choice", "token_choice", "per_step", "shared_first", "middle", "cycle", "steps2", "steps4"}
    base = space.baselines()
    chassis = {n: k.default for n, k in space.chassis.items()}
    vanilla = space.candidate({**chassis, **base["narrow_untied"]}).config
    fixed = space.candidate({**chassis, **base["fixed_depth_recursion"]}).config
    assert vanilla.recursion is None and len(set(vanilla.block_of_layer)) == vanilla.chassis.n_layers
    assert fixed.recursion.capacities == () and fixed.recursion.gate == "none" and fixed.recursion.steps == 3
    for cfg in (vanilla, fixed):  # equal stored parameters, as close as the fit's shapes allow
        assert abs(stored_params(cfg) - space.budget_params) / space.budget_params < 0.01


def test_a_dense_model_converts_into_a_recursion_allocation_where_every_token_runs_every_step():
    from npas.conversion.convert import convert_model

    cfg = recursion_config(CLASSIC, spec(first=1, last=1, gate="none", capacities=(1.0, 0.5, 0.25)))
    dense = built(ArchConfig(chassis=cfg.chassis, mlp_widths=cfg.mlp_widths, block_of_layer=tuple(range(8))))
    mor = convert_model(dense, cfg, seed=0).model.eval()
    tied = convert_model(dense, plain_of(cfg), seed=0).model.eval()
    x = tokens()
    with torch.no_grad():
        assert torch.equal(mor(x)[0], tied(x)[0])  # the stack as tying makes it; every token runs every step
        assert mor.recursion.active_share.tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(ConfigError, match="routes each token through its shared stack"):
        convert_model(mor, plain_of(cfg))
