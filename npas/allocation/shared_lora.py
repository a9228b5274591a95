"""The modules of low-rank relaxations shared across layers (see `npas.allocation.lora_sharing`).

The model holds the shared tensors once, as `lora_shared.{slot}.A` / `.B` (shared_a: one A per slot
type; shards: the A and B pools of each slot type) or `lora_shared.frozen.A` / `.B` (vera: the one
frozen pair), and each relaxed layer keeps what is its own under `h.{l}.lora.{slot}`: B (shared_a), d
and b (vera), its private shards A and B (shards). Every per-layer module has `delta()`, the (d_out,
d_in) matrix the layer adds to its weight once per forward, exactly as private LoRA's does, so the
layer, conversion and export read all of them one way.

A per-layer module reads the shared tensors through a plain reference, not a registered submodule:
registered under every layer they would appear once per layer in the state dict (aliases), and the
model's parameters already hold them once.

VeRA's frozen pair is `nn.Parameter(requires_grad=False)`, not a buffer: it is stored (counted by
`sum(p.numel() for p in model.parameters())`, which is what the budget caps and the exactness tests
check), cast with the model's dtype, saved in the safetensors state dict beside the weights it scales,
and reported as frozen by `Accounting.frozen_params`; `requires_grad=False` keeps it out of every
gradient, so AdamW never steps or decays it. It is drawn from `lora_seed` on a private generator
(PEFT's `projection_prng_key`), never from torch's global RNG, so the same allocation rebuilds the same
projections on any machine and the rest of the model's init does not depend on whether VeRA is on.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from npas.allocation.config import ArchConfig
from npas.allocation.lora_sharing import VERA_D_INIT, shard_index, shared_shapes, split_rank
from npas.allocation.sharing import LoRA


def _kaiming(shape: tuple[int, int], generator: torch.Generator | None = None) -> Tensor:
    """PEFT's LoRA A init (kaiming_uniform with a = sqrt(5): U(-1/sqrt(fan_in), 1/sqrt(fan_in))), drawn
    on the CPU so a seeded generator gives the same values on every device."""
    bound = 1.0 / math.sqrt(shape[1]) if shape[1] else 0.0
    return torch.empty(shape, device="cpu").uniform_(-bound, bound, generator=generator)


class _Pair(nn.Module):
    """One shared A (and B): a slot type's shared A, its shard pools, or VeRA's frozen pair."""

    def __init__(self, a: tuple[int, int], b: tuple[int, int] | None, frozen_seed: int | None) -> None:
        super().__init__()
        trainable = frozen_seed is None
        g = None if trainable else torch.Generator().manual_seed(frozen_seed)
        self.A = nn.Parameter(torch.empty(a), requires_grad=trainable)
        with torch.no_grad():
            self.A.copy_(_kaiming(a, g))
        if b is not None:  # shards' B pool starts at zero (a relaxed model starts tied); VeRA's B is random
            self.B = nn.Parameter(torch.zeros(b), requires_grad=trainable)
            if not trainable:
                with torch.no_grad():
                    self.B.copy_(_kaiming(b, g))


class SharedFactors(nn.Module):
    """Every tensor the relaxed layers share, registered once on the model as `lora_shared`."""

    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        self.pairs = nn.ModuleDict({
            name: _Pair(a, b, cfg.lora_seed if name == "frozen" else None)
            for name, (a, b) in shared_shapes(cfg).items()
        })


class SharedALoRA(nn.Module):
    """shared_a: scale * B @ A[:r, :d_in], A shared by every relaxed layer of the slot type."""

    def __init__(self, shared: _Pair, rank: int, d_in: int, d_out: int, scale: float) -> None:
        super().__init__()
        self.scale, self.rank, self.d_in = scale, rank, d_in
        self.B = nn.Parameter(torch.zeros(d_out, rank))
        object.__setattr__(self, "_shared", shared)  # a reference, not a submodule (see the module doc)

    @property
    def A(self) -> Tensor:  # noqa: N802 - LoRA's name for the factor
        """This layer's rows and columns of the shared A, (r, d_in)."""
        return self._shared.A[: self.rank, : self.d_in]

    def delta(self) -> Tensor:
        return (self.B * self.scale) @ self.A


class VeraLoRA(nn.Module):
    """vera: diag(b) B[:d_out, :r] diag(d) A[:r, :d_in] with A, B the frozen pair. No alpha / r factor
    (VeRA and PEFT's VeraConfig have none): d and b are the scale, d starting at VERA_D_INIT, b at 0."""

    def __init__(self, frozen: _Pair, rank: int, d_in: int, d_out: int) -> None:
        super().__init__()
        self.rank, self.d_in, self.d_out = rank, d_in, d_out
        self.d = nn.Parameter(torch.full((rank,), VERA_D_INIT))
        self.b = nn.Parameter(torch.zeros(d_out))
        object.__setattr__(self, "_shared", frozen)

    def delta(self) -> Tensor:
        B = self._shared.B[: self.d_out, : self.rank] * (self.b[:, None] * self.d[None, :])  # (d_out, r)
        return B @ self._shared.A[: self.rank, : self.d_in]


class ShardsLoRA(nn.Module):
    """shards: A = the pool rows `index_a` (+ own private rows), B = the pool columns `index_b` (+ own
    private columns), then scale * B @ A. The indices are fixed by the allocation (non-persistent
    buffers: they follow the model's device and are never saved, since the allocation rebuilds them)."""

    def __init__(self, pool: _Pair, rank: int, d_in: int, d_out: int, scale: float, index_a: tuple[int, ...],
                 index_b: tuple[int, ...], private: int) -> None:
        super().__init__()
        self.scale, self.d_in, self.d_out = scale, d_in, d_out
        self.index_a, self.index_b = tuple(index_a), tuple(index_b)
        self._on: dict[torch.device, tuple[Tensor, Tensor]] = {}  # the indices as tensors, per device
        self.private = private
        if private:
            self.A = nn.Parameter(torch.empty(private, d_in))
            self.B = nn.Parameter(torch.zeros(d_out, private))
            nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))
        object.__setattr__(self, "_shared", pool)

    def factors(self) -> tuple[Tensor, Tensor]:
        """(B (d_out, r), A (r, d_in)) this layer assembles from its shards."""
        parts_a, parts_b = [], []
        if self.index_a:
            pool = self._shared
            dev = pool.A.device
            if dev not in self._on:
                self._on[dev] = (torch.tensor(self.index_a, device=dev), torch.tensor(self.index_b, device=dev))
            ia, ib = self._on[dev]
            parts_a.append(pool.A[ia, : self.d_in])
            parts_b.append(pool.B[: self.d_out, ib])
        if self.private:
            parts_a.append(self.A)
            parts_b.append(self.B)
        return torch.cat(parts_b, dim=1), torch.cat(parts_a)

    def delta(self) -> Tensor:
        B, A = self.factors()
        return (B * self.scale) @ A


def shared_factors(cfg: ArchConfig) -> SharedFactors | None:
    """The model's `lora_shared` module, or None for private LoRA (nothing registered: its state dicts
    and init draws stay what they were)."""
    return None if cfg.lora_sharing == "private" else SharedFactors(cfg)


def relaxation(cfg: ArchConfig, shared: SharedFactors | None, layer: int, slot: str, rank: int, d_in: int,
               d_out: int) -> nn.Module:
    """The per-layer module relaxing `slot` of `layer` at `rank` under the allocation's sharing mode."""
    scale = cfg.lora_scale(rank)
    mode = cfg.lora_sharing
    if mode == "private":
        return LoRA(rank, d_in, d_out, scale)
    if shared is None:
        raise ValueError(f"lora_sharing {mode!r} needs the model's shared factors (TransformerLM builds them)")
    if mode == "vera":
        return VeraLoRA(shared.pairs["frozen"], rank, d_in, d_out)
    if mode == "shared_a":
        return SharedALoRA(shared.pairs[slot], rank, d_in, d_out, scale)
    n_shared, private = split_rank(rank, cfg.lora_private_fraction)
    pool = shared.pairs[slot] if slot in shared.pairs else None
    ia = shard_index(cfg.lora_seed, slot, "A", layer, cfg.lora_shards, n_shared) if n_shared else ()
    ib = shard_index(cfg.lora_seed, slot, "B", layer, cfg.lora_shards, n_shared) if n_shared else ()
    return ShardsLoRA(pool, rank, d_in, d_out, scale, ia, ib, private)


__all__ = ["SharedALoRA", "SharedFactors", "ShardsLoRA", "VeraLoRA", "relaxation", "shared_factors"]
