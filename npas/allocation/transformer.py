"""The transformer LM chassis, built from an allocation.

Read top to bottom: weight holders (Block) -> one depth position (Layer) -> the model.
Three kinds of module carry parameters, with stable state-dict names:
  blocks.{b}.{slot}      a unique block's direct weight, e.g. blocks.0.attn_q (d, d)
  banks.{k}.weight/coef  a shared bank generating some blocks' slots (Shapeshifter pools)
  atoms.{slot}.atoms/coef  a dictionary of matrix atoms generating one attention slot (MASA)
  experts.pools.{p}.up/gate/down, experts.routers.{j}  expert pools replacing the MLP (see experts.py)
  h.{l}.ln_1 / lora_*    what belongs to one depth position: untied norms and LoRA deltas
  lora_shared.pairs.{slot|frozen}.A/B  LoRA factors shared across layers (see shared_lora.py)
Every forward first *materialises* each block's weights once (views for direct and tied weights,
one generation per bank and per atom dictionary), then runs the L layers over them. A layer that
shares another's keys/values (cross-layer KV sharing) is handed that layer's K/V instead of
computing its own.

Families (`Chassis.family`): classic uses bias-free LayerNorms and a learned position table `wpe`;
llama follows Hugging Face LlamaForCausalLM (RMSNorm in fp32, rotary q/k, grouped-query attention
with repeat_kv, bias-free projections, optional untied `lm_head`); the norms, rotary positions and
attention masks are in `npas.allocation.layer_ops`. An untied uniform llama allocation
maps onto HF's state dict name for name (layer i = block i):
  wte.weight            model.embed_tokens.weight
  blocks.{i}.attn_q/k/v/o   model.layers.{i}.self_attn.q_proj/k_proj/v_proj/o_proj.weight
  blocks.{i}.mlp_gate/up/down  model.layers.{i}.mlp.gate_proj/up_proj/down_proj.weight
  h.{i}.ln_1.weight / h.{i}.ln_2.weight   model.layers.{i}.input_layernorm / post_attention_layernorm.weight
  ln_f.weight           model.norm.weight
  lm_head.weight        lm_head.weight (absent when tie_embeddings: the head is wte)
(`LLAMA_HF_NAMES` below is that table.) Tied layers, banks and atoms generate the same per-layer
weights, so an HF checkpoint loads into the untied allocation and converts to any other.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import yaml
from safetensors.torch import load_file
from torch import Tensor, nn

from npas.allocation.atoms import AtomDictionary
from npas.allocation.config import ATTN_SLOTS, MLP_SLOTS, ArchConfig, block_slots
from npas.allocation.experts import ExpertPools, PerForward
from npas.allocation.hashing import HashedBank
from npas.allocation.layer_ops import apply_rotary, causal_mask, norm_for, padded_mask, repeat_kv, rotary
from npas.allocation.recursing import Recursion
from npas.allocation.shared_lora import SharedFactors, relaxation, shared_factors
from npas.allocation.sharing import INIT_STD, RESIDUAL_SLOTS, BankModule
from npas.errors import ConfigError

# npas name (per-block / per-layer part after the index) -> Hugging Face Llama name, see the docstring
LLAMA_HF_NAMES: dict[str, str] = {
    "wte": "model.embed_tokens", "ln_f": "model.norm", "lm_head": "lm_head",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_o": "self_attn.o_proj", "mlp_gate": "mlp.gate_proj", "mlp_up": "mlp.up_proj", "mlp_down": "mlp.down_proj",
    "ln_1": "input_layernorm", "ln_2": "post_attention_layernorm",
}


class Block(nn.Module):
    """A unique block: direct Parameters for its slots that no bank generates, and shared norms."""

    def __init__(self, cfg: ArchConfig, b: int, direct: list[str], own_norms: bool) -> None:
        super().__init__()
        for slot in direct:
            self.register_parameter(slot, nn.Parameter(torch.empty(cfg.slot_shape(b, slot))))
        if own_norms:
            self.ln_1 = norm_for(cfg.chassis)
            self.ln_2 = norm_for(cfg.chassis)


class Layer(nn.Module):
    """One depth position: attention + MLP over weights handed in by the model (maybe shared)."""

    def __init__(self, cfg: ArchConfig, layer: int, shared: SharedFactors | None = None) -> None:
        super().__init__()
        c = cfg.chassis
        self.n_heads = c.n_heads
        self.head_size = c.head_size
        self.n_rep = c.n_heads // c.kv_heads  # query heads per K/V head (1: full multi-head attention)
        self.rotary = c.llama
        self.width = cfg.mlp_widths[layer]
        self.gated = c.activation == "swiglu"
        if cfg.norms_in_layer(layer):
            self.ln_1 = norm_for(c)
            self.ln_2 = norm_for(c)
        self.lora = nn.ModuleDict()
        # a KV consumer computes q (and k in "v" mode) only; K/V come from its source layer
        self.computes = tuple(s for s in ("attn_q", "attn_k", "attn_v") if cfg.layer_reads(layer, s))
        self.split = [c.slot_shape(s, 1)[0] for s in self.computes]  # q_dim, kv_dim, kv_dim (d each on classic)
        ra, rm = cfg.lora_attn[layer], cfg.lora_mlp[layer]
        if ra:
            for slot in (s for s in ATTN_SLOTS if cfg.layer_reads(layer, s)):
                d_out, d_in = c.slot_shape(slot, 1)
                self.lora[slot] = relaxation(cfg, shared, layer, slot, ra, d_in, d_out)
        if rm:
            for slot in MLP_SLOTS[c.activation]:
                d_in, d_out = (self.width, c.d_model) if slot == "mlp_down" else (c.d_model, self.width)
                self.lora[slot] = relaxation(cfg, shared, layer, slot, rm, d_in, d_out)

    def _weight(self, slot: str, w: Tensor) -> Tensor:
        if slot in self.lora:  # this depth's relaxation, merged once per forward (see sharing.LoRA)
            return w + self.lora[slot].delta()
        return w

    def _linear(self, x: Tensor, slot: str, w: Tensor) -> Tensor:
        return F.linear(x, self._weight(slot, w))

    def forward(self, x: Tensor, w: dict[str, Tensor], ln_1: nn.Module, ln_2: nn.Module,
                kv: tuple[Tensor, Tensor] | None = None, moe: ExpertPools | None = None,
                layer: int = 0, rope: tuple[Tensor, Tensor] | None = None, cache: Any = None,
                attn: dict[str, Any] | None = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """The layer's output and the (k, v) it attended with, for layers that share them.
        With `moe` the MLP is this layer's mixture of pooled experts (its depth is `layer`). On a
        llama chassis `rope` is the (cos, sin) of the positions: q and k are rotated before attention
        (a shared k is shared rotated), and grouped K/V heads are repeated to the query heads.
        `attn` is the attention's mask arguments (`causal_mask` / `padded_mask`); None is plain causal."""
        B, T, C = x.shape
        hs = self.head_size
        # q, k and v are separate slots (each may be tied, banked or relaxed on its own), but one
        # (3d, d) matmul runs faster than three (d, d) ones: concatenate the weights once per forward
        parts = [self._weight(s, w[s]) for s in self.computes]
        w_qkv = parts[0] if len(parts) == 1 else torch.cat(parts)  # (n*d, d): q, k, v it computes itself
        out = [t.view(B, T, -1, hs).transpose(1, 2)  # (B, heads, T, hs): n_heads for q, n_kv_heads for k, v
               for t in F.linear(ln_1(x), w_qkv).split(self.split, dim=2)]
        if self.rotary:
            out[:2] = [apply_rotary(t, *rope) for t in out[:2]]  # q, and k when this layer computes it
        if len(out) == 3:
            q, k, v = out
            if cache is not None:  # a KV source: its keys and values join the cache
                k, v = cache.update(k, v, layer)
        elif len(out) == 2:  # value-only sharing: own keys, the source's values
            q, k, v = out[0], out[1], kv[1]
            if cache is not None:  # only its own keys are cached (an empty value slot)
                k = cache.update(k, k[..., :0, :], layer)[0]
        else:
            q, (k, v) = out[0], kv  # full KV sharing: nothing of this layer's is cached
        y = F.scaled_dot_product_attention(q, repeat_kv(k, self.n_rep), repeat_kv(v, self.n_rep),
                                           **({"is_causal": True} if attn is None else attn))
        y = y.transpose(1, 2).contiguous().view(B, T, self.n_heads * hs)
        x = x + self._linear(y, "attn_o", w["attn_o"])
        h = ln_2(x)
        if moe is not None:
            return x + moe(h, layer), (k, v)
        n = self.width  # tied blocks store the widest member; narrower layers take a nested slice
        a = self._linear(h, "mlp_up", w["mlp_up"][:n])
        a = F.silu(self._linear(h, "mlp_gate", w["mlp_gate"][:n])) * a if self.gated else F.gelu(a)
        return x + self._linear(a, "mlp_down", w["mlp_down"][:, :n]), (k, v)


class TransformerLM(nn.Module):
    """Pre-norm causal transformer LM whose layers draw weights from blocks and banks."""

    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        self.cfg = cfg
        c = cfg.chassis
        self.block_of_layer = list(cfg.block_of_layer)
        self.wte = nn.Embedding(c.vocab_size, c.d_model)  # tied with the output head (unless llama untied)
        if c.llama:  # rotary positions: no position table; the head is wte, or its own lm_head
            self.lm_head = None if c.tie_embeddings else nn.Linear(c.d_model, c.vocab_size, bias=False)
        else:
            self.wpe = nn.Embedding(c.context, c.d_model)
        bank_of = cfg.bank_of()
        self.blocks = nn.ModuleList(
            Block(
                cfg,
                b,
                direct=[s for s in block_slots(c.activation) if (b, s) not in bank_of and cfg.block_stores(b, s)],
                own_norms=cfg.block_is_shared(b) and not cfg.untied_norms,
            )
            for b in range(cfg.n_blocks)
        )
        resid_std = INIT_STD / math.sqrt(2 * c.n_layers)
        self.banks = nn.ModuleList(
            HashedBank(bank, [cfg.slot_shape(*m) for m in bank.members],  # each member at its slot's init std
                       [resid_std if s in RESIDUAL_SLOTS else INIT_STD for _, s in bank.members])
            if bank.generator == "hash" else BankModule(
                bank,
                [cfg.slot_shape(*m) for m in bank.members],
                resid_std if all(s in RESIDUAL_SLOTS for _, s in bank.members) else INIT_STD,
            )
            for bank in cfg.banks
        )
        self.atoms = nn.ModuleDict({
            a.slot: AtomDictionary(a.n_atoms, len(cfg.atom_rows(a)), c.d_model,
                                   resid_std if a.slot in RESIDUAL_SLOTS else INIT_STD,
                                   c.slot_shape(a.slot, 1) if c.llama else None)
            for a in cfg.atoms
        })
        # which row of each dictionary's output a layer reads (its own row, or its block's)
        self._atom_row = {
            a.slot: {i: cfg.atom_rows(a).index(i if a.scope == "layer" else cfg.block_of_layer[i])
                     for i in range(c.n_layers) if cfg.layer_reads(i, a.slot)}
            for a in cfg.atoms
        }
        self.kv_source = list(cfg.kv_source)
        self.experts = None if cfg.experts is None else ExpertPools(
            cfg.experts, c.d_model, c.activation == "swiglu", INIT_STD, resid_std)
        self._last = PerForward([torch.zeros(())])  # the weighted expert balance loss of the last forward
        # LoRA factors the relaxed layers share (npas.allocation.shared_lora); None for private LoRA
        self.lora_shared = shared_factors(cfg)
        self.h = nn.ModuleList(Layer(cfg, i, self.lora_shared) for i in range(c.n_layers))
        self.ln_f = norm_for(c)
        self._init_direct(resid_std)
        # drawn last, so the other weights get the draws they get without recursion (same init as the
        # fixed-depth stack of the same seed)
        self.recursion = None if cfg.recursion is None else Recursion(cfg.recursion, c.d_model, INIT_STD)

    def _init_direct(self, resid_std: float) -> None:
        nn.init.normal_(self.wte.weight, std=INIT_STD)
        if self.cfg.chassis.llama:
            if self.lm_head is not None:
                nn.init.normal_(self.lm_head.weight, std=INIT_STD)
        else:
            nn.init.normal_(self.wpe.weight, std=INIT_STD)
        for block in self.blocks:
            for name, p in block.named_parameters(recurse=False):
                nn.init.normal_(p, std=resid_std if name in RESIDUAL_SLOTS else INIT_STD)

    def materialise(self) -> list[dict[str, Tensor]]:
        """Each block's weights for this forward: direct Parameters as-is, banks generated once."""
        weights = [dict(block.named_parameters(recurse=False)) for block in self.blocks]
        for bank_cfg, bank in zip(self.cfg.banks, self.banks, strict=True):
            for (b, slot), w in zip(bank_cfg.members, bank.generate(), strict=True):
                weights[b][slot] = w
        return weights

    def forward(self, idx: Tensor, targets: Tensor | None = None, cache: Any = None,
                attention_mask: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Logits (B, T, V) and the mean cross-entropy against `targets` (None without them).

        `cache` (incremental decoding, e.g. a transformers DynamicCache: `get_seq_length()` and
        `update(k, v, layer)`) holds the keys and values of the tokens before `idx`; only KV *source*
        layers store theirs (a "v"-mode consumer its keys only): cross-layer KV sharing shrinks the cache
        to the share of source layers.

        `attention_mask` (B, start + T; 1 = token, 0 = padding, transformers' convention) lets a batch
        of prompts of different lengths run left-padded: each row's positions count its real tokens
        only and no query reads a padding key, so a row's logits equal its unpadded run's. Padding
        positions get finite logits of no meaning."""
        B, T = idx.shape
        start = 0 if cache is None else int(cache.get_seq_length())
        c = self.cfg.chassis
        positions, attn = None, None
        if attention_mask is not None and attention_mask.shape != (B, start + T):
            raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)}, expected {(B, start + T)} "
                             "(the cached tokens and the new ones)")
        if attention_mask is not None and not bool(attention_mask.bool().all()):
            positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -T:]  # (B, T)
            attn = padded_mask(attention_mask, T)
            end = int(positions.max()) + 1
        else:
            attn = None if start == 0 else causal_mask(T, start + T, start, idx.device)
            end = start + T
        if end > c.context:
            raise ValueError(f"sequence length {end} exceeds the chassis context {c.context}")
        weights = self.materialise()
        atoms = {slot: dictionary.generate() for slot, dictionary in self.atoms.items()}  # (rows, d, d) each
        rope = None
        if c.llama:
            x = self.wte(idx)  # (B, T, d); positions enter as rotations of q and k
            rope = rotary(c, T, idx.device, start, positions)
        else:
            pos = torch.arange(start, start + T, device=idx.device) if positions is None else positions
            x = self.wte(idx) + self.wpe(pos)  # (B, T, d)
        kv: dict[int, tuple[Tensor, Tensor]] = {}
        if self.experts is not None:
            self.experts.reset()

        def run(i: int, x: Tensor, rope: Any, attn: Any) -> Tensor:
            layer, b = self.h[i], self.block_of_layer[i]
            norms = layer if hasattr(layer, "ln_1") else self.blocks[b]
            w = weights[b]
            if atoms:
                w = dict(w)
                for slot, rows in self._atom_row.items():
                    if i in rows:
                        w[slot] = atoms[slot][rows[i]]
            src = self.kv_source[i]
            x, kv_i = layer(x, w, norms.ln_1, norms.ln_2, kv.get(src), self.experts, i, rope, cache, attn)
            if src == i:
                kv[i] = kv_i
            return x

        if self.recursion is None:
            for i in range(c.n_layers):
                x = run(i, x, rope, attn)
        else:
            x = self._recurse(x, run, rope, attn, cache, idx.device)
        if self.experts is not None:
            # the training loop adds this to the LM loss (proxy._loop); evaluation reads the LM loss only
            self._last = PerForward([self.cfg.experts.balance_weight * self.experts.balance_loss()])
        elif self.recursion is not None:
            self._last = PerForward([self.recursion.aux_loss])  # the router losses, trained like the balance loss
        head = self.wte.weight if getattr(self, "lm_head", None) is None else self.lm_head.weight
        logits = F.linear(self.ln_f(x), head)  # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    def _recurse(self, x: Tensor, run: Any, rope: Any, attn: Any, cache: Any, device: torch.device) -> Tensor:
        """The unique first layers, the recursion's passes over the stack, the unique last layers."""
        if cache is not None or attn is not None:
            raise ValueError("a recursion allocation runs whole unpadded sequences without a KV cache (each "
                             "token's depth is its own); decode by running the full prefix")
        spec, c = self.cfg.recursion, self.cfg.chassis
        for i in range(spec.first):
            x = run(i, x, rope, None)

        def rope_at(positions: Tensor | None) -> Any:
            if not c.llama or positions is None:
                return rope
            return rotary(c, positions.shape[1], device, 0, positions)

        x = self.recursion(x, run, rope_at)
        for i in range(spec.n_layers - spec.last, spec.n_layers):
            x = run(i, x, rope, None)
        return x

    @property
    def aux_loss(self) -> Tensor:
        """The weighted expert balance loss of the last forward (0 without experts, and in a copy made
        since: ``experts.PerForward``); the training loop adds it to the LM loss."""
        return self._last[0] if self._last else torch.zeros(())

    def num_params(self) -> int:
        """Stored parameters. Shared tensors count once because `.parameters()` de-duplicates them."""
        return sum(p.numel() for p in self.parameters())

    def param_groups(self, weight_decay: float) -> list[dict]:
        """AdamW groups: decay weight matrices, banks, templates and LoRA; not norms or mixing coefs."""
        decay, no_decay = [], []
        for name, p in self.named_parameters():
            (no_decay if ".ln_" in f".{name}" or name.endswith(".coef") else decay).append(p)
        return [
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]


TORCH_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                                        "float16": torch.float16}


def build_model(cfg: ArchConfig) -> TransformerLM:
    """Build the exact module an allocation describes, its parameters in `cfg.dtype`.

    Init draws from torch's global RNG in fp32 and then rounds to the dtype, so one seed gives the
    same weights at every dtype up to rounding. Train it as `build_model(cfg).float()` (fp32 master
    weights); `export_state` rounds the trained weights back to `cfg.dtype` for saving.
    """
    model = TransformerLM(cfg)
    return model if cfg.dtype == "float32" else model.to(TORCH_DTYPES[cfg.dtype])


def export_state(model: TransformerLM) -> dict[str, Tensor]:
    """The weights to save, in the allocation's dtype, each tensor once (tied layers share Parameters
    by reference, never by a second name, so the state dict holds no aliases)."""
    dtype = TORCH_DTYPES[model.cfg.dtype]
    return {k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()}


def load_weights(model: TransformerLM, path: str | Path, config_text: str) -> None:
    """Load safetensors weights saved from `model`'s allocation, also when saved under schema 1.

    Schema 1 stored attention as one fused `blocks.{b}.attn_qkv` (3d, d) and `blocks.{b}.attn_out`;
    those are split into attn_q, attn_k, attn_v (rows 0:d, d:2d, 2d:3d, the order the fused forward
    used) and renamed attn_o, so the loaded model computes exactly what was trained. A schema-1 bank
    that generated attn_qkv cannot be carried over (its q, k and v are now generated separately, so
    the same bank would compute something else): that is refused with a ConfigError.
    `config_text` is the allocation file the weights were saved beside (config.yaml).
    """
    raw = yaml.safe_load(config_text)
    raw = raw.get("allocation", raw) if isinstance(raw, dict) else raw
    if isinstance(raw, dict) and raw.get("version") == 1 and any(
            m[1] == "attn_qkv" for bank in raw.get("banks") or () for m in bank.get("members") or ()):
        raise ConfigError(f"{path}: trained under allocation schema 1 with a bank generating the fused attn_qkv; "
                          "schema 2 generates q, k and v separately, so these weights cannot be reused: train again")
    state = load_file(str(path))
    d = model.cfg.chassis.d_model
    for key in [k for k in state if k.endswith(".attn_qkv") or k.endswith(".attn_out")]:
        prefix, _, slot = key.rpartition(".")
        w = state.pop(key)
        if slot == "attn_out":
            state[f"{prefix}.attn_o"] = w
        else:
            for name, part in zip(("attn_q", "attn_k", "attn_v"), w.split(d), strict=True):
                state[f"{prefix}.{name}"] = part.contiguous()
    model.load_state_dict(state, strict=True)
