"""LoRA factors shared across layers (lora_sharing: shared_a | vera | shards): exact counts, the frozen
VeRA pair, the fixed shard indices, the fair rule of a shared factor, and the private-LoRA baseline."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import npas
from npas.allocation.budget import count, stored_params
from npas.allocation.config import ArchConfig, Chassis
from npas.allocation.lora_sharing import relaxation_params, relaxed_uses, shard_index
from npas.allocation.space_parser import load_space
from npas.errors import ConfigError
from npas.training.parameterization import optimizer_groups, rules
from tests.conftest import SPACES

CLASSIC = Chassis(vocab_size=30, context=16, d_model=32, n_layers=4, n_heads=4, d_ff=64)
LLAMA = Chassis(vocab_size=30, context=16, d_model=32, n_layers=4, n_heads=4, d_ff=64, activation="swiglu",
                family="llama", n_kv_heads=2)
MODES = {"shared_a": {}, "vera": {"lora_seed": 3}, "shards": {"lora_shards": 5, "lora_private_fraction": 0.25},
         "shards_pure": {"lora_shards": 4}}


def relaxed(mode: str, chassis: Chassis = CLASSIC, **extra) -> ArchConfig:
    """Cycle-tied (U = 2), tapered widths, per-layer ranks, one KV consumer: every shape the factors slice."""
    kw = {**MODES.get(mode, {}), **extra}
    return ArchConfig(chassis=chassis, mlp_widths=(64, 48, 64, 32), block_of_layer=(0, 1, 0, 1),
                      lora_attn=(4, 2, 4, 4), lora_mlp=(2, 0, 2, 2), kv_source=(0, 0, 2, 3),
                      lora_sharing=mode.split("_pure")[0], **kw)


@pytest.mark.parametrize("chassis", [CLASSIC, LLAMA], ids=["classic", "llama"])
@pytest.mark.parametrize("mode", ["private", *MODES])
def test_count_equals_built_model_and_reports_the_frozen_pair(mode, chassis):
    cfg = relaxed(mode, chassis)
    torch.manual_seed(0)
    model = npas.build_model(cfg)
    acc = count(cfg)
    params = list(model.parameters())
    assert acc.stored_params == stored_params(cfg) == sum(p.numel() for p in params)
    frozen = sum(p.numel() for p in params if not p.requires_grad)
    assert acc.frozen_params == frozen and (frozen > 0) == (mode == "vera")
    assert acc.trainable_params == acc.stored_params - frozen
    assert sum(acc.layer_stored) == pytest.approx(acc.stored_params - acc.embedding_params - chassis.d_model)
    # FLOPs per token are the dense model's: the factors are merged once per forward, whatever shares them
    assert acc.flops_per_token == count(dataclasses.replace(cfg, lora_attn=(), lora_mlp=())).flops_per_token
    state = model.state_dict()
    assert len({t.data_ptr() for t in state.values() if t.numel()}) == sum(1 for t in state.values() if t.numel())
    logits, _ = model(torch.randint(0, 30, (2, 8)))
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("mode", list(MODES))
def test_shared_relaxation_stores_less_and_starts_tied(mode):
    cfg = relaxed(mode)
    private = relaxed("private")
    assert relaxation_params(cfg)[0] < count(private).lora_params
    model = npas.build_model(cfg)
    deltas = [lora.delta() for layer in model.h for lora in layer.lora.values()]
    assert deltas and all(float(d.detach().abs().max()) == 0.0 for d in deltas)  # B (or b) starts at zero


def test_shared_a_is_one_tensor_read_by_every_relaxed_layer():
    model = npas.build_model(relaxed("shared_a"))
    a = model.lora_shared.pairs["attn_q"].A
    assert a.shape == (4, 32)  # the largest rank, the slot's d_in
    for layer in model.h:  # every relaxed layer slices the very same Parameter
        assert layer.lora["attn_q"].A.data_ptr() == a.data_ptr()
    with torch.no_grad():
        for layer in model.h:
            for lora in layer.lora.values():
                lora.B.normal_()
    model(torch.randint(0, 30, (2, 8)), torch.randint(0, 30, (2, 8)))[1].backward()
    assert a.grad is not None and float(a.grad.abs().sum()) > 0


def test_vera_pair_comes_from_its_seed_and_never_trains():
    cfg = relaxed("vera")
    torch.manual_seed(0)
    m1 = npas.build_model(cfg)
    torch.manual_seed(1)
    m2 = npas.build_model(cfg)
    m3 = npas.build_model(dataclasses.replace(cfg, lora_seed=4))
    f1, f2, f3 = (m.lora_shared.pairs["frozen"] for m in (m1, m2, m3))
    assert torch.equal(f1.A, f2.A) and torch.equal(f1.B, f2.B)  # the global RNG plays no part
    assert not torch.equal(f1.A, f3.A)
    assert f1.A.shape == (4, 64) and f1.B.shape == (64, 4)  # the largest rank and sides, sliced for the rest
    before = {k: v.clone() for k, v in m1.state_dict().items()}
    opt = torch.optim.AdamW([{**g, "lr": 1e-2} for g in optimizer_groups(m1, 0.1)])
    for _ in range(2):
        opt.zero_grad()
        m1(torch.randint(0, 30, (2, 8)), torch.randint(0, 30, (2, 8)))[1].backward()
        opt.step()
    after = m1.state_dict()
    assert torch.equal(after["lora_shared.pairs.frozen.A"], before["lora_shared.pairs.frozen.A"])
    assert not torch.equal(after["h.0.lora.attn_q.b"], before["h.0.lora.attn_q.b"])
    assert not torch.equal(after["h.0.lora.attn_q.d"], before["h.0.lora.attn_q.d"])


def test_shard_indices_are_fixed_distinct_and_dissociated():
    cfg = relaxed("shards")
    model = npas.build_model(cfg)
    lora = model.h[0].lora["attn_q"]
    ia = list(lora.index_a)
    assert len(ia) == len(set(ia)) == 3 and lora.private == 1  # rank 4: 3 shared shards, 1 private
    assert ia == list(shard_index(cfg.lora_seed, "attn_q", "A", 0, cfg.lora_shards, 3))
    assert any(model.h[i].lora["attn_q"].index_a != model.h[i].lora["attn_q"].index_b
               for i in range(4))  # A rows and B columns drawn apart (pair dissociation)
    assert not any("index" in k for k in model.state_dict())  # rebuilt from the allocation, never saved
    B, A = lora.factors()
    assert B.shape == (32, 4) and A.shape == (4, 32)


def test_sharing_fields_round_trip_validate_and_keep_old_hashes():
    private = relaxed("private")
    assert "lora_sharing" not in private.to_dict()  # allocations written before sharing keep their hash
    for mode in MODES:
        cfg = relaxed(mode)
        assert ArchConfig.from_yaml(cfg.to_yaml()) == cfg and ArchConfig.from_json(cfg.to_json()).hash == cfg.hash
    # fields a mode does not read take their defaults: one spelling per model
    assert relaxed("shared_a", lora_seed=9, lora_shards=3) == relaxed("shared_a")
    assert relaxed("vera", lora_alpha=4.0) == relaxed("vera")  # VeRA's d and b are its scale: alpha is unread
    bad = {"lora_sharing": ("bogus", "lora_sharing: 'bogus' is not one of"),
           "lora_shards": (2, "lora_shards: 2 shared shards cannot give a layer its 3 distinct ones"),
           "lora_private_fraction": (1.5, "lora_private_fraction: must be a number in [0, 1]")}
    for field, (v, msg) in bad.items():
        with pytest.raises(ConfigError, match=msg.replace("[", r"\[").replace("]", r"\]")) as e:
            relaxed("bogus" if field == "lora_sharing" else "shards", **({} if field == "lora_sharing" else {field: v}))
        assert "\n" not in str(e.value)
    d = relaxed("shards").to_dict()
    with pytest.raises(ConfigError, match="lora_private_fraction: must be a number"):
        ArchConfig.from_dict({**d, "lora_private_fraction": "0.25"})


def test_a_shared_factor_follows_the_bank_rule():
    # 4 layers read attn_q's shared A (rank 4 of 4 rows at the full d_in): k = 4 reads per element, and
    # at the reference's own width and depth w = d = 1, so the multiplier is 4 ** -0.5 (bank rule)
    cfg = ArchConfig(chassis=CLASSIC, mlp_widths=(64,) * 4, block_of_layer=(0, 1, 0, 1), lora_attn=(4,) * 4,
                     lora_sharing="shared_a")
    table = rules(npas.build_model(cfg))
    assert table["lora_shared.pairs.attn_q.A"].group == "lora_shared"
    assert table["lora_shared.pairs.attn_q.A"].lr_mult == pytest.approx(0.5)
    assert table["h.0.lora.attn_q.B"].group == "lora" and table["h.0.lora.attn_q.B"].lr_mult == pytest.approx(1.0)
    vera = rules(npas.build_model(dataclasses.replace(cfg, lora_sharing="vera")))
    assert vera["lora_shared.pairs.frozen.A"].group == "frozen" and vera["h.1.lora.attn_v.d"].group == "lora_vec"


@pytest.mark.parametrize("name", ["recursive_lora", "full"])
def test_sharing_spaces_enqueue_private_lora_of_equal_relaxation_parameters(name):
    space = load_space(next(p for p in SPACES if p.stem == name))
    base = space.baselines()["private_lora"]
    assert base["lora_sharing"] == "private" and base["tying"] == "cycle"
    chassis = {k: kn.default for k, kn in space.chassis.items()}
    private = space.candidate({**chassis, **base}).config
    shared = space.candidate({**chassis, **base, "lora_sharing": "shared_a",
                              "lora_rank": max(space.knobs["lora_rank"].options())}).config
    assert private is not None and shared is not None
    # equal within one rank of private LoRA on the same relaxed matrices
    per_rank = sum(o + n for uses in relaxed_uses(private).values() for _, _, o, n in uses)
    assert abs(count(private).lora_params - count(shared).lora_params) <= per_rank


def test_count_cli_prints_the_frozen_pair_and_the_trainable_count(tmp_path, capsys):
    from npas.presentation.cli import main

    cfg = relaxed("vera")
    f = tmp_path / "vera.yaml"
    f.write_text(cfg.to_yaml())
    assert main(["count", str(f)]) == 0
    out = capsys.readouterr().out
    model = npas.build_model(cfg)
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert f"{frozen:,} frozen (lora_seed 3)" in out
    assert "trainable params" in out and f"{trainable:,} (stored less {frozen:,} frozen)" in out


@pytest.mark.parametrize("mode", list(MODES))
def test_each_mode_trains_under_the_proxy(mode):
    """A short proxy run of every mode: the loss is finite and the relaxation moved off its tied start."""
    from npas.training.data import load_corpus
    from npas.training.forks import train_model
    from npas.training.recipe import Recipe

    recipe = Recipe(name="t", seq_len=16, batch_size=4, steps=6, lr=1e-2, min_lr=1e-3, warmup_steps=1,
                    eval_every=6, eval_batches=1, threads=1)
    cfg = dataclasses.replace(relaxed(mode), chassis=dataclasses.replace(CLASSIC, vocab_size=68))
    model, result = train_model(cfg, recipe, load_corpus())
    assert result.val_loss == result.val_loss and result.val_loss < 10
    assert any(float(lora.delta().detach().abs().max()) > 0 for layer in model.h for lora in layer.lora.values())
