"""Where the front's trials put their parameters, per layer: the allocation grid (storage, tying, banks,
LoRA, atoms, KV sharing, experts) and the MLP taper by depth.

Pure like `info.py` (the dashboard's other figures): each function reads the front's trials and
returns plain data, which `render.py` draws. A module of its own because these two figures read the
allocation each trial stored, not its objectives.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial

from npas.allocation.config import ArchConfig
from npas.allocation.recursion_allocation import layer_shares
from npas.allocation.space_parser import parse_space
from npas.errors import NpasError
from npas.presentation.dashboard.info import front, label
from npas.service.study.record import StudyAttr, TrialAttr

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LayerCell:
    stored: float  # this layer's share of stored parameters (accounting.layer_stored)
    block: int  # tying group: layers with the same block share its weights
    shared: bool  # the block serves more than one layer
    banks: tuple[tuple[int, tuple[str, ...]], ...]  # (bank index, slots of this block in that bank)
    lora_attn: int
    lora_mlp: int
    width: int  # MLP width of this layer
    # attention projections this layer makes from shared atom dictionaries (MASA): (q|k|v|o, K atoms),
    # only those it reads (a KV consumer computes no keys/values, so its K/V atoms are not listed)
    atoms: tuple[tuple[str, int], ...] = ()
    kv_source: int | None = None  # the earlier layer whose keys/values this one reuses; None: its own
    kv_consumers: tuple[int, ...] = ()  # later layers attending with this layer's keys/values
    kv_mode: str = "kv"  # what consumers reuse: keys and values ("kv"), or values only ("v")
    # the shared expert pool this layer's router reads (UniPool / MoEUT): (pool index, experts in it,
    # top_k, d_expert); None for a dense MLP
    experts: tuple[int, int, int, int] | None = None
    # per-token recursion: the share of tokens that runs this layer (its expected depth), realised by the
    # causal rule on the validation windows when the trial stored it, else the capacities; None without
    depth_share: float | None = None


@dataclass(frozen=True)
class AllocationRow:
    number: int
    label: str
    summary: str
    cells: list[LayerCell]


@dataclass(frozen=True)
class AllocationInfo:
    n_layers: int
    rows: list[AllocationRow]  # one per front trial, by increasing objective 0
    note: str | None = None


def allocation_row(t: FrozenTrial) -> AllocationRow | None:
    alloc, acc = t.user_attrs.get(TrialAttr.ALLOC), t.user_attrs.get(TrialAttr.ACCOUNTING) or {}
    if not alloc:
        return None
    try:
        cfg = ArchConfig.from_dict(alloc)
    except NpasError as e:  # written by another npas version: leave the row out, keep the page
        log.warning("trial %d: allocation not readable (%s); left out of the allocation map", t.number, e)
        return None
    stored = list(acc.get("layer_stored") or [math.nan] * cfg.chassis.n_layers)
    banks_of_block: dict[int, dict[int, list[str]]] = {}
    for k, bank in enumerate(cfg.banks):
        for blk, slot in bank.members:
            banks_of_block.setdefault(blk, {}).setdefault(k, []).append(slot)
    shares = _depth_shares(cfg, t)
    cells = []
    for i, b in enumerate(cfg.block_of_layer):
        banks = tuple((k, tuple(slots)) for k, slots in sorted(banks_of_block.get(b, {}).items()))
        atoms = tuple((a.slot.removeprefix("attn_"), a.n_atoms) for a in cfg.atoms if cfg.layer_reads(i, a.slot))
        consumers = tuple(j for j, src in enumerate(cfg.kv_source) if src == i and j != i)
        cells.append(LayerCell(stored=float(stored[i]), block=b, shared=cfg.block_is_shared(b), banks=banks,
                               lora_attn=cfg.lora_attn[i], lora_mlp=cfg.lora_mlp[i], width=cfg.mlp_widths[i],
                               atoms=atoms, kv_source=cfg.kv_source[i] if cfg.kv_consumer(i) else None,
                               kv_consumers=consumers, kv_mode=cfg.kv_mode, experts=_experts_of(cfg, i),
                               depth_share=None if shares is None else shares[i]))
    return AllocationRow(t.number, label(t), cfg.summary(), cells)


def _depth_shares(cfg: ArchConfig, t: FrozenTrial) -> tuple[float, ...] | None:
    """Each layer's share of tokens under per-token recursion: the trial's realised one, else the capacities."""
    if getattr(cfg, "recursion", None) is None:
        return None
    realised = ((t.user_attrs.get(TrialAttr.PROXY) or {}).get("recursion") or {}).get("step_share")
    return layer_shares(cfg, tuple(realised) if realised else None)


def _experts_of(cfg: ArchConfig, layer: int) -> tuple[int, int, int, int] | None:
    e = getattr(cfg, "experts", None)
    if e is None:
        return None
    q = e.pool_of_layer[layer]
    return q, e.pool_sizes[q], e.top_k, e.d_expert


def allocation_info(study: optuna.Study) -> AllocationInfo:
    rows = [r for t in front(study) if (r := allocation_row(t)) is not None]
    if not rows:
        return AllocationInfo(0, [], "no front yet: no complete full-fidelity trial within budget")
    return AllocationInfo(max(len(r.cells) for r in rows), rows)


# ---- MLP taper by depth ------------------------------------------------------------------------
@dataclass(frozen=True)
class TaperInfo:
    reference_width: int | None  # d_ff of the space's chassis: the uniform reference
    lines: list[tuple[int, str, list[int]]]  # (trial number, label, MLP width per layer)
    note: str | None = None


def taper_info(study: optuna.Study) -> TaperInfo:
    lines = [(t.number, label(t), list(t.user_attrs[TrialAttr.ALLOC]["mlp_widths"]))
             for t in front(study) if t.user_attrs.get(TrialAttr.ALLOC)]
    ref = None
    try:
        ref = parse_space(study.user_attrs[StudyAttr.SPACE_TEXT]).reference_chassis.d_ff
    except (KeyError, NpasError):  # not an npas space: fall back on any sampled trial's chassis
        knobs = next((t.user_attrs[TrialAttr.KNOBS] for t in study.get_trials(deepcopy=False)
                      if isinstance(t.user_attrs.get(TrialAttr.KNOBS), dict) and not t.user_attrs.get(TrialAttr.BASELINE)), {})
        ref = knobs.get("d_ff") if isinstance(knobs.get("d_ff"), int) else None
    return TaperInfo(ref, lines, None if lines else "no front yet")
