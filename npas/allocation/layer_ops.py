"""The operations inside a layer that follow Hugging Face's Llama: the norm, rotary positions (with
`rope_scaling`), grouped-query K/V, and the attention masks of cached and left-padded batches.

Why a module of its own: these carry no parameters of an allocation and are written to match
`transformers`' Llama bit for bit (each names the Hugging Face function it mirrors), so they change
with Hugging Face's conventions, not with how npas shares weights; `npas.allocation.transformer`
builds the model around them.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from npas.allocation.chassis import Chassis


class RMSNorm(nn.Module):
    """Hugging Face LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) in fp32, cast back, times the gain."""

    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


def norm_for(c: Chassis) -> nn.Module:
    """The chassis' norm: RMSNorm on llama, a bias-free LayerNorm on classic (d parameters either way)."""
    if c.llama:
        return RMSNorm(c.d_model, c.rms_norm_eps)  # d parameters, like the LayerNorm's gain
    return nn.LayerNorm(c.d_model, bias=False)  # bias-free LayerNorm: d parameters


def rotary(c: Chassis, T: int, device: torch.device, start: int = 0,
           positions: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(cos, sin), each (T, head_dim), of Hugging Face's default rotary embedding: inv_freq =
    1 / theta^(2i / head_dim) for i < head_dim / 2, angles pos x inv_freq, repeated for both halves.
    Positions are start..start+T-1, or per row `positions` (B, T) (left-padded batches, whose rows
    start at different offsets): then each is (B, 1, T, head_dim), broadcasting over the heads.
    Computed in fp32 per forward (a few thousand elements), so no buffer changes with the model's dtype."""
    hd = c.head_size
    inv_freq = scaled_inv_freq(1.0 / (c.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64, device=device)
                                                      .float() / hd)), c.rope)
    if positions is not None:
        freqs = (positions.float()[..., None] * inv_freq)[:, None]  # (B, 1, T, hd/2)
    else:
        freqs = torch.outer(torch.arange(start, start + T, device=device).float(), inv_freq)  # (T, hd/2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def scaled_inv_freq(inv_freq: Tensor, rope: dict) -> Tensor:
    """Hugging Face's rope_scaling applied to the default inverse frequencies (modeling_rope_utils):
    linear divides every frequency by `factor`; llama3 (Llama 3.1) divides the low frequencies by
    `factor`, keeps the high ones and interpolates between. Neither rescales cos/sin (attention_factor 1)."""
    kind = rope.get("rope_type", rope.get("type"))
    if not kind or kind == "default":
        return inv_freq
    factor = float(rope["factor"])
    if kind == "linear":
        return inv_freq / factor
    low, high = float(rope["low_freq_factor"]), float(rope["high_freq_factor"])
    old = rope["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * math.pi / inv_freq
    out = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, out)


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) over the two halves of the last dimension (Hugging Face's rotate_half)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (B, heads, T, head_dim) rotated per position: x cos + rotate_half(x) sin."""
    return x * cos.to(x.dtype) + rotate_half(x) * sin.to(x.dtype)


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """(B, n_kv, T, hd) -> (B, n_kv * n_rep, T, hd), each K/V head repeated for its n_rep query heads
    in order (Hugging Face's repeat_kv: query head j reads K/V head j // n_rep)."""
    if n_rep == 1:
        return x
    B, n_kv, T, hd = x.shape
    return x[:, :, None].expand(B, n_kv, n_rep, T, hd).reshape(B, n_kv * n_rep, T, hd)


def causal_mask(T: int, S: int, start: int, device: torch.device) -> dict[str, Any]:
    """Causal attention of T new queries (positions start..start+T-1) over S = start + T keys: the
    plain causal flag without a cache prefix, no mask for one new token, else an explicit mask."""
    if start == 0 and S == T:
        return {"is_causal": True}
    if T == 1:
        return {}
    pos = torch.arange(start, start + T, device=device)
    return {"attn_mask": torch.arange(S, device=device)[None, :] <= pos[:, None]}


def padded_mask(keep: Tensor, T: int) -> dict[str, Any]:
    """Causal attention of the last T of S positions, over the keys `keep` (B, S) marks real (a
    transformers attention_mask, 1 = token, 0 = padding): a (B, 1, T, S) boolean mask. Each query may
    also read its own position, so a padding query (all its earlier keys padding too) gets a finite
    output rather than NaN, which would leak into later layers through the values it writes."""
    B, S = keep.shape
    q = torch.arange(S - T, S, device=keep.device)
    k = torch.arange(S, device=keep.device)
    causal = k[None, :] <= q[:, None]  # (T, S)
    own = k[None, :] == q[:, None]
    return {"attn_mask": (causal & keep.bool()[:, None, :] | own)[:, None]}
