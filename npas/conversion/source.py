"""The trained model being converted, read as what each depth position actually computes with.

Conversion works on *effective* per-layer weights: the (out, in) matrix layer i multiplies with for
each slot, after its bank or atom dictionary generated it, its nested MLP slice was taken and its
LoRA delta was merged. Reading the source this way accepts the untied reference and any allocation
of it alike, and records for each weight which stored tensors it came from (for provenance).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from npas.allocation.config import ArchConfig, block_slots
from npas.allocation.lora_sharing import param_names


@dataclass
class Weight:
    """A tensor and the source state-dict entries it was computed from."""

    value: Tensor
    sources: tuple[str, ...]


@dataclass
class SourceModel:
    """Per-layer effective weights, norms and embeddings of a trained model (fp32, detached)."""

    cfg: ArchConfig
    layers: list[dict[str, Weight]]  # layer -> slot -> (out, in) weight at the layer's MLP width
    norms: list[dict[str, Weight]]  # layer -> "ln_1" / "ln_2" -> (d,) gain
    embed: dict[str, Weight]  # "wte", "wpe" (classic) or "lm_head" (llama, untied) (rows, d) and "ln_f" (d,)


def _slot_sources(cfg: ArchConfig, layer: int, slot: str) -> tuple[str, ...]:
    b = cfg.block_of_layer[layer]
    if slot in cfg.atom_slots:
        out = [f"atoms.{slot}.atoms", f"atoms.{slot}.coef"]
    else:
        bank = cfg.bank_of().get((b, slot))
        if bank is None:
            out = [f"blocks.{b}.{slot}"]
        else:
            out = [f"banks.{bank}.weight"] + ([f"banks.{bank}.coef"]
                                              if cfg.banks[bank].generator == "template_mix" else [])
    rank = cfg.lora_attn[layer] if slot.startswith("attn") else cfg.lora_mlp[layer]
    if rank:
        out += param_names(cfg, layer, slot)
    return tuple(out)


@torch.no_grad()
def read_source(model: torch.nn.Module) -> SourceModel:
    """Every layer's effective weights. The model must compute its own keys and values everywhere
    (the caller refuses cross-layer KV sharing), so each layer has all of its slots."""
    cfg: ArchConfig = model.cfg
    model = model.float()
    blocks = model.materialise()
    atoms = {slot: d.generate() for slot, d in model.atoms.items()}
    layers, norms = [], []
    for i, layer in enumerate(model.h):
        b = cfg.block_of_layer[i]
        n = cfg.mlp_widths[i]
        ws: dict[str, Weight] = {}
        for slot in block_slots(cfg.chassis.activation):
            if slot in atoms:
                w = atoms[slot][model._atom_row[slot][i]]
            else:
                w = blocks[b][slot]
            if slot in ("mlp_up", "mlp_gate"):
                w = w[:n]
            elif slot == "mlp_down":
                w = w[:, :n]
            w = layer._weight(slot, w)  # merges this depth's LoRA delta, if any
            ws[slot] = Weight(w.detach().float().clone(), _slot_sources(cfg, i, slot))
        layers.append(ws)
        owner, prefix = (layer, f"h.{i}") if hasattr(layer, "ln_1") else (model.blocks[b], f"blocks.{b}")
        norms.append({ln: Weight(getattr(owner, ln).weight.detach().float().clone(), (f"{prefix}.{ln}.weight",))
                      for ln in ("ln_1", "ln_2")})
    if cfg.chassis.llama:  # rotary positions, no table; an untied head of its own
        tables = ("wte", "ln_f") + (("lm_head",) if model.lm_head is not None else ())
    else:
        tables = ("wte", "wpe", "ln_f")
    embed = {name: Weight(getattr(model, name).weight.detach().float().clone(), (f"{name}.weight",))
             for name in tables}
    return SourceModel(cfg, layers, norms, embed)
