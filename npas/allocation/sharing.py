"""Parameter banks, their generators, and LoRA relaxation: the modules that let layers share weights.

A bank owns one flat Parameter (or T templates plus per-member coefficients) and generates the
weights of all its members *once per forward pass*; the layers then use those tensors for every
token. Tied layers use the very same Parameter objects, never copies, so `model.parameters()`
de-duplicates them and the stored count equals the analytic one.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from npas.allocation.config import Bank

INIT_STD = 0.02  # GPT-2 / nanoGPT init; residual projections get INIT_STD / sqrt(2 * n_layers)
RESIDUAL_SLOTS = frozenset({"attn_o", "mlp_down"})


def slice_offsets(numels: list[int], size: int) -> list[int]:
    """Offsets of each member's window in a `slice` bank of `size` elements.

    Offsets follow the members' cumulative sizes scaled to the bank, so size == sum(numels) gives
    disjoint windows (exactly untied) and smaller banks overlap the windows evenly.
    """
    total = sum(numels)
    offsets, cum = [], 0
    for n in numels:
        offsets.append((cum * size) // total)
        cum += n
    return offsets


class BankModule(nn.Module):
    """One shared bank: `weight` is (size,) or, for template_mix, (templates, size) plus `coef`."""

    def __init__(self, bank: Bank, shapes: list[tuple[int, int]], std: float) -> None:
        super().__init__()
        self.generator = bank.generator
        self.shapes = shapes
        self.numels = [o * i for o, i in shapes]
        self.std = std
        if bank.generator == "template_mix":
            self.weight = nn.Parameter(torch.empty(bank.templates, bank.size))  # (T, S)
            self.coef = nn.Parameter(torch.empty(len(shapes), bank.templates))  # (m, T)
        else:
            self.weight = nn.Parameter(torch.empty(bank.size))
        self.offsets = slice_offsets(self.numels, bank.size) if bank.generator == "slice" else [0] * len(shapes)
        # slice/tile windows that run past the end wrap around; precompute how far to repeat the bank
        reach = max(o + n for o, n in zip(self.offsets, self.numels, strict=True))
        self.repeats = 1 if bank.generator == "tie" else math.ceil(reach / bank.size)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, mean=0.0, std=self.std)
        if self.generator == "template_mix":
            # sum_t coef_t * template_t keeps the std of one template when coef ~ N(0, 1/T)
            nn.init.normal_(self.coef, mean=0.0, std=1.0 / math.sqrt(self.weight.shape[0]))

    def generate(self) -> list[Tensor]:
        """Every member's weight, shaped (out, in). Views of the bank where the generator allows."""
        if self.generator == "template_mix":
            flat = self.coef @ self.weight  # (m, S): one matmul for all members
            if self.repeats > 1:  # templates shorter than a member: tile them (SSN up-sampling)
                flat = flat.repeat(1, self.repeats)
            return [flat[j, :n].view(shape) for j, (n, shape) in enumerate(zip(self.numels, self.shapes, strict=True))]
        src = self.weight if self.repeats == 1 else self.weight.repeat(self.repeats)
        return [
            src[o : o + n].view(shape)
            for o, n, shape in zip(self.offsets, self.numels, self.shapes, strict=True)
        ]


class LoRA(nn.Module):
    """Low-rank delta scale * B @ A added to a (possibly shared) base weight, PEFT-style.

    `scale` is alpha / r (or alpha / sqrt(r), rsLoRA) with alpha fixed across ranks: without it a
    higher rank would also mean a larger effective learning rate for the delta. B starts at zero, so a relaxed model starts equal to the tied one; A uses PEFT's Kaiming init.
    The delta is merged into the layer's weight once per forward pass (W + B @ A, 2*r*d_in*d_out
    FLOPs per step) rather than run as two thin matmuls per token (2*r*(d_in + d_out) FLOPs per
    token): at proxy batch sizes the merge is tens of times cheaper, thin rank-r matmuls run poorly
    on CPUs, and per-token FLOPs stay exactly those of the untied model. The shared base is never
    written to; gradients reach A and B through the merged weight.
    """

    def __init__(self, rank: int, d_in: int, d_out: int, scale: float = 1.0) -> None:
        super().__init__()
        self.scale = scale  # a constant of the allocation (ArchConfig.lora_scale), not a parameter
        self.A = nn.Parameter(torch.empty(rank, d_in))
        self.B = nn.Parameter(torch.zeros(d_out, rank))
        nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))

    def delta(self) -> Tensor:
        """scale * B @ A, shaped like the weight it relaxes (d_out, d_in)."""
        return (self.B * self.scale) @ self.A  # scale the thin factor: r * d_out multiplies, not d_out * d_in
