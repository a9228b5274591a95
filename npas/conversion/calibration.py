"""Calibration text: what the trained model's MLPs actually see, for data-aware width changes.

Weight norms alone rank a hidden unit by what it could contribute; on real text many units are
rarely active. With a few thousand tokens of training text, a narrower MLP keeps the units whose
activations carry the most output (mean squared activation times output-column norm, as
Minitron-style pruning does) and re-fits its down-projection by least squares so the kept units
reproduce the full layer's output on that text. The windows come from the training split only, so
conversion never looks at validation text.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

CALIBRATION_TOKENS = 4096  # enough for least squares over a few hundred units, seconds on a CPU


def calibration_ids(corpus, seq_len: int, tokens: int = CALIBRATION_TOKENS) -> Tensor:
    """(n, seq_len) windows evenly spread over the training split (no randomness)."""
    n = max(1, tokens // seq_len)
    return corpus.fixed_windows("train", n, seq_len)[0]


@torch.no_grad()
def mlp_inputs(model: nn.Module, ids: Tensor) -> list[Tensor]:
    """Per layer, the (tokens, d_model) inputs of its MLP (the output of its second LayerNorm)."""
    seen: list[Tensor] = []
    norms = {id(m): m for layer, b in zip(model.h, model.block_of_layer, strict=True)
             for m in [layer.ln_2 if hasattr(layer, "ln_2") else model.blocks[b].ln_2]}
    # layers run in order and call their ln_2 once each, so the captured outputs are in layer order
    hooks = [m.register_forward_hook(lambda _m, _i, out: seen.append(out.detach().reshape(-1, out.shape[-1])))
             for m in norms.values()]
    was = model.training
    model.eval()
    try:
        model(ids)
    finally:
        for h in hooks:
            h.remove()
        model.train(was)
    return seen
