"""A model directory as `npas train` writes one, without training: the input corpora need a real
directory (weights, tokenizer, metrics.json) to damage, and its numbers are never read."""

from __future__ import annotations

from npas.training.proxy import ProxyResult


def placeholder_result() -> ProxyResult:
    """The metrics a one-step run would record; every number a placeholder."""
    return ProxyResult(status="ok", val_loss=4.0, val_bpc=5.8, train_loss=4.0, steps_done=1, stored_params=1,
                       param_bytes=4, peak_memory_bytes=1, memory_source="analytic", rss_delta_bytes=0,
                       flops_per_token=1, tokens_per_s=1.0, wall_s=1.0)
