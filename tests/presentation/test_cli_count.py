"""`npas count` on an allocation with attention atoms and cross-layer KV sharing: the atom parameters
and the KV cache per token it prints are the built model's and the cache of the layers that compute
their own keys and values, not the untied model's."""

from __future__ import annotations

import re
from dataclasses import replace

import npas
from npas.allocation.config import ArchConfig, AtomSpec, Chassis
from npas.presentation.cli import main

CH = Chassis(vocab_size=68, context=32, d_model=32, n_layers=6, n_heads=4, d_ff=64)
K = 2  # atoms per projection type: a third of the 6 layers
KV_SOURCE = (0, 0, 2, 2, 4, 4)  # groups of 2 adjacent layers read the first one's keys and values


def _config(kv_source: tuple[int, ...] = KV_SOURCE) -> ArchConfig:
    L = CH.n_layers
    return ArchConfig(chassis=CH, mlp_widths=(CH.d_ff,) * L, block_of_layer=tuple(range(L)), kv_source=kv_source,
                      atoms=tuple(AtomSpec(f"attn_{c}", K) for c in "qkvo"))


def _count(tmp_path, cfg: ArchConfig, *args: str) -> None:
    f = tmp_path / "alloc.yaml"
    f.write_text(cfg.to_yaml())
    assert main(["count", str(f), *args]) == 0


def _row(out: str, name: str) -> str:
    m = re.search(rf"^\s+{re.escape(name)}\s+(.*)$", out, re.M)
    assert m, f"no {name!r} row in:\n{out}"
    return m.group(1)


def test_count_prints_the_atom_parameters_of_the_built_model(tmp_path, capsys):
    cfg = _config()
    _count(tmp_path, cfg)
    out = capsys.readouterr().out
    model = npas.build_model(cfg)
    built = sum(p.numel() for n, p in model.named_parameters() if n.startswith("atoms."))
    d = CH.d_model
    # K atoms of d x d per projection type, plus one coefficient row of K per layer reading it:
    # Q and O are read by all 6 layers, K and V only by the 3 KV sources
    assert built == 4 * K * d * d + K * (6 + 3 + 3 + 6)
    row = _row(out, "atoms + coefficients")
    assert row.startswith(f"{built:,} (q,k,v,o: K={K} atoms of {d}x{d}"), row
    assert "18 coefficient rows" in row
    assert int(_row(out, "stored params").replace(",", "")) == sum(p.numel() for p in model.parameters())


def test_count_prints_the_kv_cache_of_the_sharing_groups_sources_only(tmp_path, capsys):
    d, L = CH.d_model, CH.n_layers
    _count(tmp_path, _config())
    shared = capsys.readouterr().out
    _count(tmp_path, replace(_config(), kv_source=()))  # every layer its own keys and values
    unshared = capsys.readouterr().out
    assert _row(unshared, "KV cache bytes / token") == f"{2 * L * d * 4:,}"  # K and V of 6 layers, float32
    row = _row(shared, "KV cache bytes / token")
    assert row.startswith(f"{2 * 3 * d * 4:,} (K cached by 3 of 6 layers, V by 3 of 6"), row  # divided by g = 2
    _count(tmp_path, replace(_config(), kv_mode="v"))  # values only: every layer still caches its keys
    assert _row(capsys.readouterr().out, "KV cache bytes / token").startswith(f"{(6 + 3) * d * 4:,} (K cached by 6")



def test_count_prints_the_expert_pool_stored_and_activated(tmp_path, capsys):
    """A pool stores every expert but a token activates k of them: count prints both, each equal to
    the built model's tensors."""
    import optuna

    from npas.allocation.space_parser import load_space

    space = load_space("search_spaces/expert_pool.yaml")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=5))
    cfg = next(c.config for c in (space.sample(study.ask()) for _ in range(100)) if c.feasible and c.config.experts)
    _count(tmp_path, cfg)
    out = capsys.readouterr().out
    model = npas.build_model(cfg)
    built = sum(p.numel() for n, p in model.named_parameters() if n.startswith("experts."))
    row = _row(out, "experts + routers")
    e = cfg.experts
    assert row.startswith(f"{built:,} ({len(e.pool_sizes)} pool(s)") and f"top-{e.top_k}" in row, row
    act = int(_row(out, "activated params / token").split()[0].replace(",", ""))
    d, stored = cfg.chassis.d_model, sum(p.numel() for p in model.parameters())
    per_expert = 2 * d * e.d_expert  # up and down of one GELU expert
    assert cfg.n_blocks == cfg.chassis.n_layers and cfg.chassis.activation == "gelu"  # untied attention
    # stored minus the pools and routers, plus what each layer runs: its router over its pool and k experts
    runs = sum(d * e.pool_sizes[q] + e.top_k * per_expert for q in e.pool_of_layer)
    assert act == stored - built + runs < stored


def test_seq_len_sets_the_memory_estimate_and_leaves_the_parameters_alone(tmp_path, capsys):
    """`--seq-len` is the T of the training-memory and FLOP estimates: the JSON is npas.count's at that
    T (not the chassis context's), and the parameter counts do not move."""
    import json

    cfg = _config()
    _count(tmp_path, cfg, "--format", "json", "--seq-len", "8", "--batch-size", "4")
    short = json.loads(capsys.readouterr().out)["accounting"]
    _count(tmp_path, cfg, "--format", "json", "--batch-size", "4")
    full = json.loads(capsys.readouterr().out)["accounting"]
    assert short == npas.count(cfg, batch_size=4, seq_len=8).to_dict()
    assert full == npas.count(cfg, batch_size=4, seq_len=CH.context).to_dict()
    assert short["train_memory_bytes"] < full["train_memory_bytes"]
    assert short["stored_params"] == full["stored_params"] == cfg_numel(cfg)


def cfg_numel(cfg: ArchConfig) -> int:
    return sum(p.numel() for p in npas.build_model(cfg).parameters())
