"""A narrower d_model (`fit.width: all`): keep the residual dimensions that carry the most weight.

The residual stream is one coordinate system shared by the embeddings and every layer, so the kept
dimensions are chosen once, by their summed squared weight over all of them (each tensor normalised
to unit Frobenius norm, so no single matrix decides), and sliced consistently everywhere. Attention's
inner dimensions shrink with d_model (n_heads stays, head size d/H shrinks): each head keeps its
query/key dimensions by the queries' and keys' weight and its value/output dimensions by the values'
and output's, the same ones in every layer, so layers that share keys and values stay aligned. The
query is rescaled by sqrt(hs_new / hs_old) so the attention logits keep the 1/sqrt(head size) scale
they were trained with. The bias-free LayerNorms then normalise over fewer dimensions: conversion
loses some accuracy here, which the proxy's training recovers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from npas.conversion.source import SourceModel


@dataclass(frozen=True)
class ResidualPlan:
    """Which residual and attention-inner dimensions survive; identity when d_model is unchanged."""

    keep: Tensor | None  # (d_new,) residual dims kept, ascending; None = all
    qk: Tensor | None  # (d_new,) attention-inner dims kept for queries and keys, head-major
    vo: Tensor | None  # (d_new,) ... for values and the output projection's input
    q_scale: float = 1.0

    @property
    def identity(self) -> bool:
        return self.keep is None


def _unit(w: Tensor) -> Tensor:
    return w.pow(2) / w.pow(2).sum().clamp_min(1e-30)


def _per_head(score: Tensor, n_heads: int, hs_new: int) -> Tensor:
    """Top `hs_new` dimensions of each head by score, ascending inside each head."""
    hs = score.numel() // n_heads
    picks = [h * hs + score[h * hs:(h + 1) * hs].topk(hs_new).indices.sort().values for h in range(n_heads)]
    return torch.cat(picks)


def plan_residual(src: SourceModel, d_new: int) -> ResidualPlan:
    d, H = src.cfg.chassis.d_model, src.cfg.chassis.n_heads
    if d_new == d:
        return ResidualPlan(None, None, None)
    resid = sum(_unit(src.embed[t].value).sum(0) for t in ("wte", "wpe", "lm_head") if t in src.embed)
    qk = torch.zeros(d)
    vo = torch.zeros(d)
    for ws in src.layers:
        for slot, w in ws.items():
            w = w.value
            # columns read from the residual stream; rows written to it (attn_o, mlp_down)
            resid += _unit(w).sum(1) if slot in ("attn_o", "mlp_down") else _unit(w).sum(0)
        qk += _unit(ws["attn_q"].value).sum(1) + _unit(ws["attn_k"].value).sum(1)
        vo += _unit(ws["attn_v"].value).sum(1) + _unit(ws["attn_o"].value).sum(0)
    keep = resid.topk(d_new).indices.sort().values
    hs_new = d_new // H
    return ResidualPlan(keep, _per_head(qk, H, hs_new), _per_head(vo, H, hs_new),
                        q_scale=math.sqrt(hs_new / (d // H)))


def narrow_slot(plan: ResidualPlan, slot: str, w: Tensor) -> Tensor:
    """A layer's (out, in) weight with its d_model-sized dimensions reduced to the plan's."""
    if plan.identity:
        return w
    if slot in ("attn_q", "attn_k"):
        w = w[plan.qk][:, plan.keep]
        return w * plan.q_scale if slot == "attn_q" else w
    if slot == "attn_v":
        return w[plan.vo][:, plan.keep]
    if slot == "attn_o":
        return w[plan.keep][:, plan.vo]
    if slot == "mlp_down":
        return w[plan.keep]
    return w[:, plan.keep]  # mlp_up, mlp_gate read the residual stream


def narrow_vector(plan: ResidualPlan, v: Tensor) -> Tensor:
    """A norm gain (d,) or embedding table (rows, d) on the kept residual dimensions."""
    if plan.identity:
        return v
    return v[..., plan.keep]
