"""Conversion into LoRA factors shared across layers: shared_a by one SVD of the stacked residuals and
least-squares Bs, vera's d and b by alternating least squares, shards' pools by the same SVD and one
least-squares solve, their private shards from what the pools left."""

from __future__ import annotations

import pytest
import torch

from npas.allocation.config import ArchConfig, Chassis
from npas.allocation.transformer import build_model
from npas.conversion import convert_model
from npas.conversion.shared_lora import fit_vera

CH = Chassis(vocab_size=30, context=16, d_model=32, n_layers=4, n_heads=4, d_ff=64)


@pytest.fixture(scope="module")
def dense():
    torch.manual_seed(0)
    return build_model(ArchConfig(chassis=CH, mlp_widths=(64,) * 4, block_of_layer=(0, 1, 2, 3)))


def relaxed(rank: int, mode: str, **kw) -> ArchConfig:
    return ArchConfig(chassis=CH, mlp_widths=(64,) * 4, block_of_layer=(0, 1, 0, 1), lora_attn=(rank,) * 4,
                      lora_mlp=(rank,) * 4, lora_sharing=mode, **kw)


def test_shared_a_error_falls_with_rank_and_is_exact_at_full_rank(dense):
    means = []
    for r in (4, 16, 32):
        conv = convert_model(dense, relaxed(r, "shared_a"))
        means.append(sum(conv.errors.values()) / len(conv.errors))
        if r == 32:  # A spans all of an attention slot's d_in = 32: every attention residual is fitted exactly
            assert max(e for k, e in conv.errors.items() if ".attn_" in k) < 1e-5
    assert means[0] > means[1] > means[2]
    # one shared A per slot type costs a little against private LoRA's own A per layer, never more than that
    private = convert_model(dense, relaxed(16, "private"))
    assert sum(private.errors.values()) / len(private.errors) <= means[1]


def test_vera_fit_recovers_a_vera_delta_and_improves_on_tying(dense):
    g = torch.Generator().manual_seed(0)
    A, B = torch.randn(8, 24, generator=g), torch.randn(20, 8, generator=g)
    d, b = torch.randn(8, generator=g), torch.randn(20, generator=g)
    R = (b[:, None] * B * d[None, :]) @ A
    fd, fb = fit_vera(R, A, B, 0.1)
    assert torch.allclose((fb[:, None] * B * fd[None, :]) @ A, R, atol=1e-4)
    tied = convert_model(dense, relaxed(0, "private"))  # no relaxation: the tying error itself
    conv = convert_model(dense, relaxed(16, "vera", lora_seed=1))
    assert all(conv.errors[k] < tied.errors[k] for k in conv.errors if k in tied.errors and tied.errors[k] > 0)


def test_shard_pools_fit_the_residuals_and_a_larger_pool_fits_better(dense):
    tied = convert_model(dense, relaxed(0, "private"))
    errs = []
    for pool in (8, 32):
        conv = convert_model(dense, relaxed(8, "shards", lora_shards=pool, lora_private_fraction=0.25))
        assert all(conv.errors[k] < tied.errors[k] for k in conv.errors if tied.errors.get(k, 0) > 0)
        errs.append(sum(conv.errors.values()) / len(conv.errors))
        assert conv.provenance.counts()["fresh"] == 0
    assert errs[1] < errs[0]
