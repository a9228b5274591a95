"""Chassis implementations. The decoder-only transformer LM is the first (and so far only) one."""

from npas.models.transformer import TransformerLM, build_model

__all__ = ["TransformerLM", "build_model"]
