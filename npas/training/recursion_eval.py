"""What a run of a per-token recursion allocation reports besides its loss: the training rule's loss
next to the causal rule's, and the depth the causal rule realised on the validation windows.

Every loss npas reports is the causal rule's (the model in evaluation mode; see
`npas.allocation.recursing`), because the training rule's sequence-level top-k reads later tokens and
cannot decode. The gap between the two rules on the same windows is what evaluating causally costs,
so it is reported rather than hidden. The realised share of tokens per step prices the front's FLOPs
per token and KV cache (`npas.allocation.budget.count(depth_shares=...)`): the capacities are what
training pays, the realised depth what inference pays.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from npas.allocation.budget import count
from npas.training.recipe import Recipe
from npas.training.trainer import autocast_for


@torch.no_grad()
def rule_losses(model: nn.Module, batches: tuple[torch.Tensor, torch.Tensor], device: torch.device,
                recipe: Recipe) -> dict[str, Any]:
    """Mean loss under the causal and the training rule over the same batches, and the causal rule's
    mean share of tokens running each step."""
    rec = model.recursion
    was_training, before = model.training, rec.rule
    model.eval()
    xs, ys = batches
    out: dict[str, Any] = {}
    try:
        for rule in ("causal", "train"):
            rec.rule = rule
            total = torch.zeros((), device=device)
            shares = torch.zeros(rec.spec.steps, device=device)
            with autocast_for(device, recipe):
                for x, y in zip(xs.to(device), ys.to(device), strict=True):
                    total += model(x, y)[1].float()
                    shares += rec.active_share
            out[f"{rule}_rule_loss"] = total.item() / len(xs)
            if rule == "causal":
                out["step_share"] = [round(v, 6) for v in (shares / len(xs)).tolist()]
    finally:
        rec.rule = before
        model.train(was_training)
    return out


def recursion_report(model: nn.Module, batches: tuple[torch.Tensor, torch.Tensor], device: torch.device,
                     recipe: Recipe) -> dict[str, Any]:
    """The rules' losses, the realised depth (mean passes through the stack per token) and what it
    costs per token, next to what the capacities cost in training."""
    cfg = model.cfg
    out = rule_losses(model, batches, device, recipe)
    shares = tuple(out["step_share"])
    realised = count(cfg, batch_size=recipe.batch_size, seq_len=recipe.seq_len, depth_shares=shares)
    trained = count(cfg, batch_size=recipe.batch_size, seq_len=recipe.seq_len)
    out.update(realised_depth=round(sum(shares), 6), train_flops_per_token=trained.flops_per_token,
               flops_per_token=realised.flops_per_token, kv_cache_bytes_per_token=realised.kv_cache_bytes_per_token)
    return out
