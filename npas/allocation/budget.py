"""Analytic accounting of an allocation, without building it.

`count(cfg)` must equal `sum(p.numel() for p in build_model(cfg).parameters())` exactly; the tests
check this on random samples of every shipped space. Everything else (bytes, FLOPs, KV cache,
training memory) derives from the same walk over blocks, banks and layers, so the search can rank
and reject thousands of candidates per second before any of them is built.

What a budget's text means and which parameters its scope caps are `npas.allocation.budget_scope`'s;
what routed recursion depth costs per token is `npas.allocation.recursion_allocation`'s.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from npas.allocation.budget_scope import embedding_params
from npas.allocation.config import (
    ATTN_SLOTS,
    DTYPE_BYTES,
    MLP_SLOTS,
    ArchConfig,
    Chassis,
    block_slots,
    reference_config,
)
from npas.allocation.lora_sharing import relaxation_params
from npas.allocation.recursion_allocation import layer_shares, recursion_flops, recursion_gather_bytes


@dataclass(frozen=True)
class Accounting:
    """What an allocation costs. Parameters are exact; memory for training is an estimate."""

    stored_params: int  # parameters held in memory (shared tensors once)
    param_bytes: int  # stored_params x dtype size
    materialised_params: int  # weights the forward pass actually multiplies with (untied-equivalent)
    flops_per_token: int  # forward FLOPs per token: 2 x matmul MACs + causal attention + LM head
    generation_flops_per_step: int  # template mixing and LoRA merges, once per forward pass (not per token)
    kv_cache_bytes_per_token: int  # K of every layer computing its own, V of every KV source, at the dtype
    inference_bytes: int  # params + KV cache for one full context at batch 1
    train_memory_bytes: int  # fp32 weights + grads + AdamW states + generated weights + activations
    activation_bytes: int  # the activation part of train_memory_bytes (batch x seq_len)
    embedding_params: int  # token + position embeddings (classic; tied head) or token embedding + untied head (llama)
    non_embedding_params: int  # stored_params - embedding_params: what `budget_scope: non_embedding` caps
    block_params: int  # direct (unbanked) block weights
    bank_params: int  # banks, templates and mixing coefficients
    lora_params: int
    norm_params: int
    atom_params: int  # atom dictionaries and their coefficients (MASA)
    layer_stored: tuple[float, ...]  # each layer's share of stored params (shared ones split evenly)
    layer_materialised: tuple[int, ...]  # weights each layer uses in its forward
    # With an expert pool the budget caps stored parameters (every expert of every pool, plus the
    # routers), while a token pays only for the k experts its router picks per layer: that is
    # `activated_params` (embeddings, norms, attention read, routers, k experts per layer), the
    # basis of flops_per_token. Without experts activated_params == materialised_params.
    activated_params: int = 0
    expert_params: int = 0  # stored experts of all pools plus the routers (0 without experts)
    # Stored but never trained (VeRA's frozen projections): the budget caps stored parameters, so they
    # count there; trainable_params = stored_params - frozen_params is what the optimizer steps.
    frozen_params: int = 0
    trainable_params: int = 0
    # Per-token recursion depth: the router (steps x d_model), and the share of tokens running each
    # depth position that flops_per_token, the KV cache and the activations assume -- the capacities
    # (training FLOPs) unless `count(depth_shares=...)` gave the realised depth of an evaluation
    recursion_params: int = 0
    layer_share: tuple[float, ...] = ()

    def to_dict(self) -> dict:
        d = asdict(self)
        d["layer_stored"] = list(self.layer_stored)
        d["layer_materialised"] = list(self.layer_materialised)
        d["layer_share"] = list(self.layer_share)
        if not self.layer_share:  # accountings of allocations without recursion keep their keys
            del d["layer_share"], d["recursion_params"]
        return d


def _attn_numels(c: Chassis) -> dict[str, int]:
    """Elements of each attention slot: d x d on classic; GQA's K/V project to n_kv_heads x head_dim."""
    return {s: math.prod(c.slot_shape(s, 1)) for s in ATTN_SLOTS}


def _attn_sides(c: Chassis) -> dict[str, int]:
    """in + out features of each attention slot: what one LoRA rank of that slot stores."""
    return {s: sum(c.slot_shape(s, 1)) for s in ATTN_SLOTS}


def _lora_params(cfg: ArchConfig, layer: int) -> int:
    d, w = cfg.chassis.d_model, cfg.mlp_widths[layer]
    total = 0
    ra, rm = cfg.lora_attn[layer], cfg.lora_mlp[layer]
    if ra:  # r * (in + out) per attention slot read (each d + d on classic)
        sides = _attn_sides(cfg.chassis)
        total += ra * sum(sides[s] for s in ATTN_SLOTS if cfg.layer_reads(layer, s))
    if rm:
        total += rm * (d + w) * len(MLP_SLOTS[cfg.chassis.activation])
    return total


def _lora_merge(cfg: ArchConfig, layer: int) -> tuple[int, int]:
    """(FLOPs, elements) of merging this layer's LoRA deltas into its weights, once per forward."""
    w = cfg.mlp_widths[layer]
    flops = elems = 0
    for slot in block_slots(cfg.chassis.activation):
        r = cfg.lora_attn[layer] if slot.startswith("attn") else cfg.lora_mlp[layer]
        if r and cfg.layer_reads(layer, slot):
            n = math.prod(cfg.chassis.slot_shape(slot, w))
            flops += 2 * r * n
            elems += n
    return flops, elems


def _bank_params(cfg: ArchConfig) -> list[int]:
    out = []
    for bank in cfg.banks:
        if bank.generator == "template_mix":
            out.append(bank.templates * bank.size + len(bank.members) * bank.templates)
        else:
            out.append(bank.size)
    return out


def expert_params(cfg: ArchConfig) -> int:
    """Stored parameters of the expert pools (all experts, however few a token uses) and routers."""
    e = cfg.experts
    if e is None:
        return 0
    d = cfg.chassis.d_model
    n_mlp = len(MLP_SLOTS[cfg.chassis.activation])
    return n_mlp * d * e.d_expert * e.n_experts + d * sum(e.router_rows())


def _expert_layer(cfg: ArchConfig, layer: int) -> tuple[float, int]:
    """(this layer's even share of stored expert params, params one token activates in it)."""
    e = cfg.experts
    if e is None:
        return 0.0, 0
    d = cfg.chassis.d_model
    per_expert = len(MLP_SLOTS[cfg.chassis.activation]) * d * e.d_expert
    pool = e.pool_of_layer[layer]
    readers = e.pool_of_layer.count(pool)
    router = d * e.pool_sizes[pool]
    share = per_expert * e.pool_sizes[pool] / readers + (router / readers if e.router == "shared" else router)
    return share, router + e.top_k * per_expert


def stored_params(cfg: ArchConfig) -> int:
    """Stored parameters alone, in closed form: the number the budget fit solves for.

    Equal to `count(cfg).stored_params` (a test checks both against the built model) but without
    the per-layer breakdown, FLOPs and memory, so the fit's dozens of probes per sample stay cheap.
    Written as one flat pass (no derived-structure lookups) because it is the fit's inner loop.
    """
    c = cfg.chassis
    d, L = c.d_model, c.n_layers
    n_mlp = 3 if c.activation == "swiglu" else 2
    mlp_widths, block_of = cfg.mlp_widths, cfg.block_of_layer
    n_blocks = max(block_of) + 1
    if n_blocks == L:  # untied: blocks are numbered in order of first use, so block i is layer i
        widths = mlp_widths
    else:  # a block stores the widest of its layers
        widths = [0] * n_blocks
        for w, b in zip(mlp_widths, block_of, strict=True):
            if w > widths[b]:
                widths[b] = w
    total = embedding_params(c) + d  # embeddings (and an untied head) + the final norm
    if cfg.experts is None:
        total += n_mlp * d * sum(widths)  # every MLP slot, banked or not
    else:  # experts replace the MLP slots: every pool's experts plus the routers
        total += expert_params(cfg)
    numel = _attn_numels(c) if c.llama else dict.fromkeys(ATTN_SLOTS, d * d)
    if not cfg.atoms and cfg.kv_source == tuple(range(L)):  # the fit's common case: every attention slot stored
        total += sum(numel.values()) * n_blocks
    else:  # the same numbers as block_stores / atom_rows, counted without walking the blocks
        src = [i for i, s in enumerate(cfg.kv_source) if s == i]
        src_blocks = len({block_of[i] for i in src}) if len(src) < L else n_blocks
        k_all = cfg.kv_mode == "v"  # value-only sharing: every layer still computes its keys
        layers = {"attn_q": L, "attn_o": L, "attn_k": L if k_all else len(src), "attn_v": len(src)}
        blocks = {"attn_q": n_blocks, "attn_o": n_blocks, "attn_k": n_blocks if k_all else src_blocks,
                  "attn_v": src_blocks}
        atoms = {a.slot: a for a in cfg.atoms}
        for slot in ATTN_SLOTS:
            a = atoms.get(slot)
            if a is None:
                total += numel[slot] * blocks[slot]
            else:
                total += a.n_atoms * (numel[slot] + (layers if a.scope == "layer" else blocks)[slot])
    total += 2 * d * (L if cfg.untied_norms else n_blocks)  # norm pairs: per layer, or one per block
    for bank in cfg.banks:
        for b, slot in bank.members:  # a banked slot stores no direct weight, the bank stores instead
            total -= numel[slot] if slot.startswith("attn") else d * widths[b]
        t = bank.templates
        total += t * bank.size + len(bank.members) * t if bank.generator == "template_mix" else bank.size
    if cfg.lora_sharing != "private":  # factors shared across layers: their own closed form
        return total + relaxation_params(cfg)[0]
    if any(cfg.lora_attn):  # r * (in + out) per attention slot the layer reads: 4, or 2-3 for a KV consumer
        sides = _attn_sides(c)
        source = sum(sides.values())
        consumer = source - sides["attn_v"] - (0 if cfg.kv_mode == "v" else sides["attn_k"])
        total += sum(r * (source if s == i else consumer) for i, (r, s) in enumerate(
            zip(cfg.lora_attn, cfg.kv_source, strict=True)))
    if any(cfg.lora_mlp):
        total += n_mlp * sum(r * (d + w) for r, w in zip(cfg.lora_mlp, mlp_widths, strict=True))
    if cfg.recursion is not None:
        total += cfg.recursion.router_params(d)
    return total


def count(cfg: ArchConfig, batch_size: int = 1, seq_len: int | None = None, *, device: str = "cpu",
          autocast: str = "float32", depth_shares: tuple[float, ...] | None = None) -> Accounting:
    """Exact parameter accounting plus FLOP and memory estimates at (batch_size, seq_len).

    The activation estimate depends on where training runs: on ``device="cuda"`` attention is fused
    (scaled_dot_product_attention keeps a log-sum-exp per query, not the T x T probabilities), and
    under ``autocast="bfloat16"`` matrix-product outputs are saved in 2 bytes while norm outputs,
    the residual stream and the logits stay fp32. Calibrated on an H200 (docs/results, GPU efficiency):
    d_model 512 and 1024 x 8 layers at 65,536 tokens a step.

    With per-token recursion a depth position costs FLOPs, KV cache and activations only for the share
    of tokens that runs it: the capacities (what training pays), or `depth_shares`, the realised share
    per recursion step of an evaluation (`npas.training.recursion_eval`)."""
    c = cfg.chassis
    d, L, V = c.d_model, c.n_layers, c.vocab_size
    T = seq_len or c.context
    nbytes = DTYPE_BYTES[cfg.dtype]
    slots = block_slots(c.activation)
    bank_of = cfg.bank_of()
    members = [cfg.members_of(b) for b in range(cfg.n_blocks)]

    embedding = embedding_params(c)
    norms = d  # ln_f
    layer_stored = [0.0] * L
    block_direct = 0
    for b in range(cfg.n_blocks):
        share = 1.0 / len(members[b])
        if cfg.block_is_shared(b) and not cfg.untied_norms:
            norms += 2 * d
            for i in members[b]:
                layer_stored[i] += 2 * d * share
        for s in slots:
            if (b, s) not in bank_of and cfg.block_stores(b, s):
                o, i_ = cfg.slot_shape(b, s)
                block_direct += o * i_
                for i in members[b]:
                    layer_stored[i] += o * i_ * share
    bank_sizes = _bank_params(cfg)
    for bank, size in zip(cfg.banks, bank_sizes, strict=True):
        numels = cfg.member_numels(bank)
        total = sum(numels)
        for (b, _), n in zip(bank.members, numels, strict=True):
            for i in members[b]:
                layer_stored[i] += size * n / total / len(members[b])
    atom_params = 0
    for a in cfg.atoms:  # the dictionary and its coefficients, split evenly over the layers reading it
        n = a.n_atoms * (math.prod(c.slot_shape(a.slot, 1)) + len(cfg.atom_rows(a)))
        atom_params += n
        readers = [i for i in range(L) if cfg.layer_reads(i, a.slot)]
        for i in readers:
            layer_stored[i] += n / len(readers)
    lora = 0
    layer_mat = []
    matmul_params = 0
    for i in range(L):
        if cfg.norms_in_layer(i):
            norms += 2 * d
            layer_stored[i] += 2 * d
        lp = _lora_params(cfg, i)
        lora += lp
        layer_stored[i] += lp
        used = sum(math.prod(c.slot_shape(s, cfg.mlp_widths[i])) for s in slots if cfg.layer_reads(i, s))
        e_share, e_used = _expert_layer(cfg, i)
        layer_stored[i] += e_share
        used += e_used  # the router and the k experts a token runs
        matmul_params += used  # LoRA is merged into these weights per step, not run per token
        layer_mat.append(used + lp + 2 * d)
    experts = expert_params(cfg)
    frozen = 0
    if cfg.lora_sharing != "private":  # a layer reads r (d_in + d_out) factors but stores only its share
        lora, frozen, shares = relaxation_params(cfg)
        for i in range(L):
            layer_stored[i] += shares[i] - _lora_params(cfg, i)
    router = 0 if cfg.recursion is None else cfg.recursion.router_params(d)
    if cfg.recursion is not None:  # each step's router row, split over the step's layers
        for i in range(L):
            if cfg.recursion.step_of(i) is not None:
                layer_stored[i] += d / cfg.recursion.stack
    stored = embedding + norms + block_direct + sum(bank_sizes) + lora + atom_params + experts + router

    # QK^T and AV at the causal average of T/2 positions, 2 FLOPs per MAC, over n_heads x head_dim
    # (d_model on classic; grouped K/V heads are repeated to every query head, so GQA saves no FLOPs here)
    attention = 2 * L * T * c.q_dim
    flops = 2 * matmul_params + attention + 2 * V * d
    share = layer_shares(cfg, depth_shares)
    if cfg.recursion is not None:  # each position's matmuls and attention for the tokens that run it
        flops = recursion_flops(cfg, share, [m - 2 * d - _lora_params(cfg, i) for i, m in enumerate(layer_mat)], T) \
            + 2 * V * d
    gen_flops = sum(
        2 * len(b.members) * b.templates * b.size for b in cfg.banks if b.generator == "template_mix"
    )
    merges = [_lora_merge(cfg, i) for i in range(L)]
    gen_flops += sum(f for f, _ in merges)
    atom_numel = {a.slot: math.prod(c.slot_shape(a.slot, 1)) for a in cfg.atoms}
    atom_elems = sum(len(cfg.atom_rows(a)) * atom_numel[a.slot] for a in cfg.atoms)  # one (rows, K) @ (K, o*i)
    gen_flops += sum(2 * len(cfg.atom_rows(a)) * a.n_atoms * atom_numel[a.slot] for a in cfg.atoms)
    # tensors materialised per step besides the stored ones: bank and atom outputs, merged LoRA weights
    generated = sum(sum(cfg.member_numels(b)) for b in cfg.banks) + sum(e for _, e in merges) + atom_elems
    # the cache holds K for each layer that computes its own and V for each KV source, each of
    # n_kv_heads x head_dim (d_model on classic; grouped-query attention caches n_kv_heads heads only)
    kv = round(sum(share[i] * (cfg.layer_reads(i, "attn_k") + cfg.layer_reads(i, "attn_v")) for i in range(L))
               * c.kv_dim * nbytes)
    # activations saved for backward, per token: per layer ~ ln/qkv/attn-out/residuals (8d: two norm
    # outputs and two residual sums in full precision, q/k/v/attention output from matmuls) + MLP
    # pre/post activation (2-3 widths, matmul outputs) + final norm and logits (2d + 2V, fp32);
    # attention probs B*nh*T*T unless attention is fused (CUDA)
    gate = 3 if c.activation == "swiglu" else 2
    low = 2 if autocast == "bfloat16" and device == "cuda" else 4  # bytes of a matmul output
    qkvo = 2 * c.q_dim + 2 * c.kv_dim  # q, k, v and the attention output (4d on classic)
    per_token_bytes = sum(s * (4 * 4 * d + low * (qkvo + gate * w)) for s, w in zip(share, cfg.mlp_widths, strict=True)) \
        + 4 * (2 * d + 2 * V) + recursion_gather_bytes(cfg, depth_shares)
    per_token_bytes = round(per_token_bytes)
    probs = round(4 * c.n_heads * T * sum(share) if device == "cuda" else 4 * c.n_heads * T * T * sum(s * s for s in share))
    act = batch_size * T * per_token_bytes + batch_size * probs
    trainable = stored - frozen  # frozen projections (VeRA) have no gradient and no AdamW state
    train = stored * 4 + trainable * 4 + trainable * 8 + generated * 4 * 2 + act  # fp32 weights, grads, AdamW m, v
    train += hash_step_bytes(cfg)  # hash banks' transient gather, circular window and mapping buffers
    gen_flops += sum(sum(cfg.member_numels(b)) for b in cfg.banks if b.generator == "hash")  # the tiles' signs
    return Accounting(
        stored_params=stored,
        param_bytes=stored * nbytes,
        materialised_params=embedding + d + sum(layer_mat),
        flops_per_token=flops,
        generation_flops_per_step=gen_flops,
        kv_cache_bytes_per_token=kv,
        inference_bytes=stored * nbytes + kv * c.context,
        train_memory_bytes=train,
        activation_bytes=act,
        embedding_params=embedding,
        non_embedding_params=stored - embedding,
        block_params=block_direct,
        bank_params=sum(bank_sizes),
        lora_params=lora,
        norm_params=norms,
        atom_params=atom_params,
        layer_stored=tuple(round(x, 3) for x in layer_stored),
        layer_materialised=tuple(layer_mat),
        activated_params=embedding + d + sum(layer_mat),
        expert_params=experts,
        frozen_params=frozen,
        trainable_params=trainable,
        recursion_params=router,
        layer_share=() if cfg.recursion is None else tuple(round(x, 6) for x in share),
    )


def hash_step_bytes(cfg: ArchConfig) -> int:
    """Training memory of `hash` banks beyond their members' materialised weights and gradients (which
    `count` counts as generated for every bank): per step the gathered tiles before their signs are
    applied (n_tiles x tile elements, transient beside the signed copy) and its gradient, in fp32; and
    the mapping kept beside the array: an int32 index per gathered element, a sign per tile and a 1/load
    per array element. Mirrors `npas.allocation.hashing.HashedBank.flat`."""
    total = 0
    for bank in cfg.banks:
        if bank.generator != "hash":
            continue
        n = sum(cfg.member_numels(bank))
        tiles = -(-n // bank.tile)
        index = 4 if bank.size < 2**31 else 8  # int32 where it addresses the array
        total += 4 * 2 * tiles * bank.tile + index * tiles * bank.tile + 4 * tiles + 4 * bank.size
    return total


def scoped_params(cfg: ArchConfig, scope: str = "all") -> int:
    """Stored parameters as a budget of ``scope`` counts them (``all``, or ``non_embedding``)."""
    return stored_params(cfg) - (embedding_params(cfg.chassis) if scope == "non_embedding" else 0)


def reference_params(cfg_or_chassis) -> int:
    """N_ref: stored parameters of the untied uniform model of this chassis."""
    chassis = getattr(cfg_or_chassis, "chassis", cfg_or_chassis)
    return stored_params(reference_config(chassis))
