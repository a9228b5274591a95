"""Weight slots: the named matrices one transformer block owns, and their shapes.

Why a module of its own: the slot names and shapes are the vocabulary every part of npas addresses
weights in (banks, atoms, KV sharing, LoRA, conversion, accounting, Hugging Face export), and they
depend on nothing but the chassis' widths, so they sit below both the chassis and the allocation.
`npas.allocation.config` re-exports them.
"""

from __future__ import annotations

from npas.errors import ConfigError

# Weight slots of one transformer block, in forward order. Q, K, V and O are separate (d x d) slots so
# banks, atoms, cross-layer KV sharing and conversion can address each; the forward still runs one
# matmul for q, k and v (see transformer.Layer).
ATTN_SLOTS: tuple[str, ...] = ("attn_q", "attn_k", "attn_v", "attn_o")
MLP_SLOTS: dict[str, tuple[str, ...]] = {
    "gelu": ("mlp_up", "mlp_down"),
    "swiglu": ("mlp_gate", "mlp_up", "mlp_down"),
}


def block_slots(activation: str) -> tuple[str, ...]:
    """Names of the weight matrices one block owns, attention first."""
    return ATTN_SLOTS + MLP_SLOTS[activation]


def slot_shape(slot: str, d_model: int, width: int, q_dim: int | None = None,
               kv_dim: int | None = None) -> tuple[int, int]:
    """(out_features, in_features) of a slot for an MLP of `width`; F.linear's weight layout.

    `q_dim` (n_heads x head_dim) and `kv_dim` (n_kv_heads x head_dim) are the attention widths of a
    llama chassis (grouped-query attention: K and V project to kv_dim); both default to d_model,
    the classic chassis' square projections. `Chassis.slot_shape` passes them."""
    if slot in ATTN_SLOTS:
        q = d_model if q_dim is None else q_dim
        if slot == "attn_q":
            return (q, d_model)
        if slot == "attn_o":
            return (d_model, q)
        return (d_model if kv_dim is None else kv_dim, d_model)
    if slot in ("mlp_up", "mlp_gate"):
        return (width, d_model)
    if slot == "mlp_down":
        return (d_model, width)
    raise ConfigError(f"unknown weight slot {slot!r}; known: {', '.join(ATTN_SLOTS + MLP_SLOTS['swiglu'])}")

