"""Hashed sharing: every weight of a bank's members a fixed, signed view into one flat array.

Randomized parameter sharing (HashedNets; ROAST, ICML 2023; STABLE-RPS, ICLR 2024) reads each weight
through a fixed hash from a shared array, so any size from a few tiles up to one element per weight is
a budget, with no change to the architecture or its FLOPs. What npas builds (`generator: hash`):

* **Tiles read contiguously (ROAST).** The members' weights, flattened in member order (row-major,
  F.linear's (out, in) layout) and concatenated, are cut into tiles of `tile` consecutive elements;
  tile t reads `tile` consecutive array elements from its offset (circularly), times a sign s_t = +-1.
  ROAST hashes 2-D BLOCK_K x BLOCK_N tiles because its Triton kernel multiplies inside the gather;
  npas materialises the members once per forward and then runs the dense matmuls, so a tile's shape
  does not change the speed and a 1-D run of `tile` elements is the same contiguous read with one knob.
  A bank naming every slot of every block is ROAST's global sharing (one array for the whole model).
* **RANDOMFOLD-style offsets (STABLE-RPS).** ROAST hashes every tile independently, so some array
  elements are read by many weights and some by none, even when the array is as large as the model:
  it cannot reach the dense model at 1x. Here a seeded permutation orders the full tiles, they are laid
  end to end (the partial last tile last), and position p of that sequence reads array element
  p mod size: the sequence is folded onto the array. Every element is then read by floor(N/size) or
  ceil(N/size) weights (the optimal load; N = the members' elements), and at size == N every element is
  read exactly once: a signed permutation of a dense layer, so nothing is lost at 1x and the loss can
  fall continuously with the budget. Collisions between two weights are random (the permutation), as in
  STABLE-RPS's folding of independently hashed partitions.
* **Gradient scaling (STABLE-RPS).** ROAST multiplies each layer's view by a scale factor (its init
  std over the array's), which multiplies the gradients too, so its effective learning rate depended on
  the initialisation; STABLE-RPS rescales the array's gradient to remove that. npas's view has no
  scale factor (a weight *is* s_t times an array element; each array element is drawn at the mean
  init variance of the weights read from it, so at the collision-free size every weight starts as in
  the untied model, residual projections smaller), so nothing depends on a scale factor's choice,
  and the scaling implemented is the part that still acts: each array element's gradient is divided by its load, the number of weights read from it (the
  mean of its readers' signed gradients instead of their sum; 1 everywhere at size == N). Under SGD
  that makes the array's step the least-squares projection of the dense model's step; under AdamW
  (npas's optimizer) the loads are one constant (or two adjacent) per array, which Adam's m / sqrt(v)
  divides out, so the step size is set once, by the fair parameterization's sharing rule
  (npas.training.parameterization: k**-1/2 with k = N / size reads per stored element), never twice.
  What the scaling still changes under AdamW is what global-norm gradient clipping sees: a summed
  gradient over k readers would dominate the clipped norm as the array shrinks.
* **A pure function of (seed, shapes).** Offsets and signs come from a hand-written integer hash
  (multiply-add modulo the prime 2**31 - 1, with xor-shifts) in int64 torch ops that never overflow
  (every product < 2**62), computed on the CPU: the same mapping in every process and on every machine,
  independent of torch's RNG, so an exported allocation (which stores `seed`) rebuilds it exactly.

Cost per forward: one gather (`index_select` of the array with a precomputed int32 index of every
weight: the tiles' contiguous runs, vectorised; its backward is one `index_add` into the array) and one
sign multiply per tile row; the materialised members and their gradients are what
`npas.allocation.budget` counts as generated per step, the index and the transient gather what it adds
for hash banks. (Gathering whole tiles from the array's unfolded windows reads one index per tile, but
its backward materialises a gradient of size x tile elements: 10-25x slower at these sizes, measured.)
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from npas.allocation.config import Bank

PRIME = 2**31 - 1  # Mersenne prime; every residue < 2**31, so products of two fit in int64 exactly
# (multiplier, increment) of the three multiply-add rounds; odd, < PRIME, chosen once and never changed
# (changing them changes every hashed model's function: the golden checksum test pins them)
_ROUNDS = ((1_103_515_245, 12_345), (1_664_525, 1_013_904_223), (2_147_483_629, 1_500_450_271))
_SALT_ORDER, _SALT_ORDER_LOW, _SALT_SIGN = 1, 2, 3


def mix(x: Tensor, seed: int, salt: int) -> Tensor:
    """A hash of int64 values into [0, PRIME), a pure function of (x, seed, salt)."""
    x = (x % PRIME + (seed % PRIME) * 40_503 % PRIME + salt * 2_654_435) % PRIME
    for a, c in _ROUNDS:
        x = (x * a + c) % PRIME
        x = x ^ (x >> 15)  # stays below 2**31: mixes high bits into the low ones the next round reads
    return x % PRIME


def n_tiles(total: int, tile: int) -> int:
    return -(-total // tile)


def tile_layout(total: int, tile: int, size: int, seed: int) -> tuple[Tensor, Tensor]:
    """(offsets (n_tiles,) int64, signs (n_tiles,) float32) of a hash bank whose members hold `total`
    elements: tile t reads array[(offsets[t] + u) % size], u < tile, times signs[t].

    Full tiles are ordered by a seeded hash (a permutation: ties, which 62-bit keys make rare, break
    by tile index), laid end to end, and the partial last tile, if any, goes last; the sequence is
    folded onto the array (position p -> p % size)."""
    count = n_tiles(total, tile)
    full = total // tile
    t = torch.arange(count, dtype=torch.int64, device="cpu")  # explicit: a meta-device build still computes it
    position = t.clone()
    if full > 1:
        key = mix(t[:full], seed, _SALT_ORDER) * PRIME + mix(t[:full], seed, _SALT_ORDER_LOW)  # < 2**62
        order = torch.sort(key, stable=True).indices  # order[j] = the tile laid j-th
        position[order] = torch.arange(full, dtype=torch.int64, device="cpu")
    offsets = position * tile % size
    signs = 1.0 - 2.0 * (mix(t, seed, _SALT_SIGN) & 1).to(torch.float32)
    return offsets, signs


def loads(total: int, size: int) -> Tensor:
    """Weights read from each array element (closed form: positions 0..total-1 fold onto p % size)."""
    q, r = divmod(total, size)
    return torch.full((size,), q, dtype=torch.int64, device="cpu") + (torch.arange(size, device="cpu") < r).long()


def element_index(total: int, tile: int, size: int, seed: int) -> tuple[Tensor, Tensor]:
    """(array index (total,) int64, sign (total,) float32) of every weight, in the members' flat order:
    what conversion and the tests read (the forward gathers whole tiles instead)."""
    offsets, signs = tile_layout(total, tile, size, seed)
    u = torch.arange(tile, dtype=torch.int64, device="cpu")
    index = ((offsets[:, None] + u[None, :]) % size).reshape(-1)[:total]
    return index, signs.repeat_interleave(tile)[:total]


def mapping_checksum(total: int, tile: int, size: int, seed: int) -> int:
    """An integer digest of the whole mapping (indices and signs), for pinning it across processes."""
    index, sign = element_index(total, tile, size, seed)
    signed = (index + 1) * sign.to(torch.int64)
    weights = torch.arange(total, dtype=torch.int64, device="cpu") % 1_000_003 + 1
    return int((signed * weights % PRIME).sum()) % PRIME


class _LoadScaledGrad(torch.autograd.Function):
    """Identity forward; the backward divides each array element's gradient by its load."""

    @staticmethod
    def forward(ctx, weight: Tensor, inv_load: Tensor) -> Tensor:  # noqa: D102
        ctx.save_for_backward(inv_load)
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # noqa: D102
        (inv_load,) = ctx.saved_tensors
        return grad * inv_load, None


class HashedBank(nn.Module):
    """One hash bank: `weight` (size,) is the array; its members are generated from it per forward.

    The mapping (element index, signs, inverse loads) is rebuilt from (seed, shapes) at construction, on the
    CPU, and kept outside the state dict (the array is its only entry; the allocation holds the seed).
    It is not a buffer: transformers' `from_pretrained` builds models on the meta device and leaves
    non-persistent buffers uninitialised, so the mapping is plain tensors, copied to the array's device
    on first use there."""

    def __init__(self, bank: Bank, shapes: list[tuple[int, int]], stds: list[float]) -> None:
        super().__init__()
        self.generator = bank.generator
        self.shapes = shapes
        self.numels = [o * i for o, i in shapes]
        self.stds = stds  # each member's init std (the model's: residual projections smaller)
        self.tile, self.seed = bank.tile, bank.seed
        total = sum(self.numels)
        self.weight = nn.Parameter(torch.empty(bank.size))
        offsets, signs = tile_layout(total, bank.tile, bank.size, bank.seed)
        u = torch.arange(bank.tile, dtype=torch.int64, device="cpu")
        # every weight's array element, the partial last tile padded to a whole one (cut after the gather);
        # int32 halves the index's memory wherever it can address the array
        index = ((offsets[:, None] + u[None, :]) % bank.size).reshape(-1)
        index = index.to(torch.int32) if bank.size < 2**31 else index
        # 1 / load per element; None when every element is read once (size == total): nothing to scale
        inv = None if bank.size == total else 1.0 / loads(total, bank.size).to(torch.float32)
        self._mapping: dict[torch.device, tuple[Tensor, Tensor, Tensor | None]] = {
            index.device: (index, signs[:, None], inv)}  # device -> (index, signs (n_tiles, 1), 1/load)
        self.reset_parameters()

    @property
    def inv_load(self) -> Tensor | None:
        return next(iter(self._mapping.values()))[2]

    @inv_load.setter
    def inv_load(self, value: Tensor | None) -> None:  # tests compare the step without the scaling
        self._mapping = {dev: (o, s, value) for dev, (o, s, _) in self._mapping.items()}

    def _on(self, device: torch.device) -> tuple[Tensor, Tensor, Tensor | None]:
        if device not in self._mapping:
            i, s, inv = next(iter(self._mapping.values()))
            self._mapping[device] = (i.to(device), s.to(device), None if inv is None else inv.to(device))
        return self._mapping[device]

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Each array element ~ N(0, the mean variance of the weights read from it): at the collision-free
        size every weight starts at its own slot's std, as in the untied model (a global array mixes
        residual projections, drawn smaller, with the rest); shared elements take their readers' mean."""
        index, _ = self.element_index()
        var = torch.cat([torch.full((n,), s * s, device="cpu") for n, s in zip(self.numels, self.stds, strict=True)])
        size = self.weight.shape[0]
        mean_var = torch.zeros(size, device="cpu").index_add_(0, index, var) / loads(sum(self.numels), size).float()
        nn.init.normal_(self.weight, mean=0.0, std=1.0)
        self.weight.mul_(mean_var.sqrt().to(self.weight.device, self.weight.dtype))

    def flat(self) -> Tensor:
        """Every member's weights, flat and concatenated in member order: one gather of the tiles."""
        w = self.weight
        index, signs, inv_load = self._on(w.device)
        if inv_load is not None:
            w = _LoadScaledGrad.apply(w, inv_load.to(w.dtype))
        tiles = w.index_select(0, index).view(-1, self.tile)  # (n_tiles, tile): one gather for all members
        return (tiles * signs.to(w.dtype)).reshape(-1)[: sum(self.numels)]

    def generate(self) -> list[Tensor]:
        """Every member's weight, shaped (out, in)."""
        return [part.view(shape) for part, shape in zip(self.flat().split(self.numels), self.shapes, strict=True)]

    def element_index(self) -> tuple[Tensor, Tensor]:
        """(array index, sign) of each member weight in flat member order (see `element_index`)."""
        return element_index(sum(self.numels), self.tile, self.weight.shape[0], self.seed)
