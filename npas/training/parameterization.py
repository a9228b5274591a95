"""Per-group learning rates (and init) that make one base learning rate fair to every allocation.

A search compares allocations trained with one recipe, so the recipe must not favour some of them.
With one learning rate for everything it does: a tied tensor's single update moves every layer that
reads it, a narrow MLP's down-projection and a wide one get the same step although their fan-in
differs by up to 8x, and a deep model adds more residual updates than a shallow one. In the spirit
of muP / depth-muP / CompleteP (hyperparameter transfer across width and depth), each parameter's
Adam learning rate is the recipe's base rate -- the rate of the *reference* model, the chassis'
untied uniform one -- times a multiplier from the rules below, so the reference itself trains
exactly as under one learning rate, and other shapes get the step that keeps their per-layer
updates comparable to the reference's.

Terms. A *use* is one (layer, slot) that reads a tensor. ``k``, the sharing count, is the number of
layer-reads per stored element, ``sum(numel read by each use) / numel stored`` (1 when untied; L for
a block tied across L layers; for banks, the members' reads over the bank size). ``w`` is the width
factor of a use, ``fan_in_ref / fan_in`` (muP for Adam: hidden matrices step as 1/fan-in), where
``fan_in_ref`` is the same slot's fan-in in the reference (d_model for attention, MLP up and gate;
d_ff for the MLP down-projection). ``r = L_ref / L`` is the depth ratio. A residual-output slot
(attention output, MLP down) writes into the residual stream; an input slot reads from it.

====================  =================================================================  ==========
group                 learning-rate multiplier                                           init
====================  =================================================================  ==========
matrix (block slot)   ``k**-SHARING_EXPONENT * mean over uses of w**a * d``, where          std x
                      ``d = r**b`` for residual-output slots and ``r**(b/2)`` for inputs    sqrt(w)
                      (depth-muP for Adam with the 1/sqrt(L) branch multiplier folded
                      into the weights, as the model's 0.02/sqrt(2L) residual init does)
bank                  as a matrix, with its members' uses (a pool's template, a tie or     std x
                      slice bank); ``k`` counts reads per stored element                   sqrt(w)
hash array            as a bank: ``k = N / size``, the members' N weights over the array    std x
                      (1 at the collision-free size N); its gradient's division by each    sqrt(w)
                      element's load (STABLE-RPS, npas.allocation.hashing) is a constant
                      per element that AdamW divides out, so the step is set once, here
template coefficient  ``k**-SHARING_EXPONENT`` with ``k`` the mean uses of a member's      model's
                      block: a coefficient is a gain (vector-like, width-free in muP);
                      its reach through the templates already carries their init scale
expert (pool)         as a matrix of an MLP slot of width d_expert (``w = d_ff_ref /       std x
                      d_expert`` for down), ``k`` = readers x top_k / pool size: the       sqrt(w)
                      expected reads of one expert per token
expert gate (SwiGLU)  as its sibling ``up`` of the same pool: same shape, same reads, and    std x
                      the two multiply each other elementwise, so one rule keeps their      sqrt(w)
                      steps in proportion (a gate at another rate would skew the product)
router                as an input-slot matrix read by its layers (one, or a pool's)       std x sqrt(w)
recursion router      as an expert router read once per token (k = 1): each of its rows    std x sqrt(w)
                      scores a token once per step, an input slot of fan-in d_model
stack (recursion)     a recursion stack's block is a matrix whose ``k`` counts expected    as matrix
                      reads: its layers' reads weighted by the share of tokens that run
                      each step (the capacities), since a token routed out never reads it
atom dictionary       as a template_mix bank whose templates are the K atoms (MASA): each  std x
                      reading layer's weight mixes every atom, so every atom element is    sqrt(w)
                      read by every layer that reads the slot, ``k`` = those layers; ``w``
                      and ``d`` of the attention slot it generates
atom coefficient      ``k**-SHARING_EXPONENT`` with ``k`` the mean layers reading one row   model's
                      (1 for scope layer, a block's readers for scope block): a gain, like
                      a template coefficient
LoRA factor (A, B)    ``w**a * d`` of the slot and layer it relaxes (k = 1: one layer reads  model's
                      it); the rank's effect on step size is the model's alpha/r scaling;
                      also shared_a's per-layer B and a layer's private shards
shared LoRA factor    as a bank (shared_a's A, shards' A and B pools): ``k`` = elements     model's
                      the relaxed layers read (rank rows at their d_in, or their shards)
                      over the elements stored, ``w`` and ``d`` of the slot it relaxes
VeRA d and b          1: per-layer gains (vector-like: width- and depth-free, like a norm's) model's
VeRA frozen pair      0, group ``frozen``: stored, never trained (requires_grad is False)    seeded
norm gain             ``k**-SHARING_EXPONENT`` (vector-like: width- and depth-free); k > 1  model's
                      only for a shared block's norms when norms are tied; a llama
                      chassis' RMSNorm gains follow the same rule as LayerNorm gains
embedding (wte, wpe)  1 (muP input weights; wte is also the tied output head, kept at 1   model's
                      because the model has no output multiplier to carry 1/width)
output head (lm_head) 1: a llama chassis' untied head, like the tied head it replaces      model's
====================  =================================================================  ==========

On a llama chassis the attention slots are not square: q is (n_heads x head_dim, d_model), k and v
(grouped-query) are (n_kv_heads x head_dim, d_model), o is (d_model, n_heads x head_dim). They follow
the matrix rule with those shapes: k and v are input slots like q, with fan-in d_model (their smaller
fan-out changes nothing), and o's fan-in is n_heads x head_dim; ``w`` compares each with the same slot
of the reference chassis, so the reference still trains at multiplier 1.

``a = WIDTH_EXPONENT`` and ``b = DEPTH_EXPONENT`` (1 is full muP / depth-muP; the default 1/2 is
what transfers at proxy scale, see the constants). ``mean over uses`` is weighted by the elements each use reads. Init: hidden matrices are rescaled
after the model draws them, by ``sqrt(mean w)``, which makes their std scale as 1/sqrt(fan-in)
relative to the reference (muP init); the reference keeps its draw bit for bit. ``SHARING_EXPONENT``
is 1/2: Adam's per-entry normalisation alone would ask for no correction (k**0), fully coherent
updates of the k reads would ask for 1/k; the geometric middle is the documented default, and
whether the optimum of tied, pooled and relaxed models lands where the reference's does under it is
measured, not assumed (docs/results/learning-rates.md).

Every parameter of every mechanism has a row above: ``RULES`` maps parameter names to them, and
``rules`` raises ``UnruledParameter`` for a name no row matches (a new mechanism must add its row,
with its reason, rather than train silently at the base rate).

The ``uniform`` parameterization is the old behaviour: the model's own weight-decay groups, every
multiplier 1, no re-initialisation.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from npas.allocation.config import ArchConfig, Chassis
from npas.allocation.lora_sharing import relaxed_uses, split_rank
from npas.allocation.sharing import RESIDUAL_SLOTS

SHARING_EXPONENT = 0.5  # lr multiplier k**-0.5 for a tensor read k times per element (see the table)
# Width and depth corrections of the learning rate are muP / depth-muP's raised to these powers. Full
# transfer theory (1.0 each) is for long training at large width; measured here it was found
# overshooting at npas's proxy scale (d_model 32-128, 2-8 layers, 400 steps): with exponent 1 the
# d_model x2 model's optimum moved two x2 steps up and the x0.5, depth /2 and depth x2 ones one step
# the other way, while one rate for all kept width within a step. Half the correction (the geometric
# middle, as for sharing) is the documented default; the bench re-measures it on seeds it was not
# chosen on.
WIDTH_EXPONENT = 0.5  # lr multiplier w**0.5 with w = fan_in_ref / fan_in
DEPTH_EXPONENT = 0.5  # residual-output slots r**0.5, input slots r**0.25, with r = L_ref / L
_OUTPUT_SLOTS = frozenset(RESIDUAL_SLOTS) | {"attn_out", "attn_o", "mlp_down"}  # old and new names

@dataclass(frozen=True)
class Rule:
    """What the parameterization decided for one parameter: its group, lr multiplier and init scale."""

    group: str  # embedding | norm | matrix | bank | coef | lora | expert | router | atom | atom_coef
    #            | lora_shared | lora_vec | frozen
    lr_mult: float
    init_scale: float = 1.0  # multiplies the model's draw once, before training (1: untouched)


class UnruledParameter(LookupError):
    """A model parameter that no row of ``RULES`` covers: a bug in npas (a mechanism added without its
    learning-rate rule), not a user mistake, so it is not an NpasError."""


def depth_factor(slot: str, depth_ratio: float) -> float:
    """Residual-output slots step as (L_ref/L)**DEPTH_EXPONENT, input slots as its square root
    (depth-muP for Adam, softened by DEPTH_EXPONENT)."""
    full = depth_ratio if slot in _OUTPUT_SLOTS else math.sqrt(depth_ratio)
    return full**DEPTH_EXPONENT


def width_factor(w: float) -> float:
    """The lr multiplier of a use whose fan-in is ``1/w`` of the reference's (muP for Adam: ``w``),
    softened by WIDTH_EXPONENT."""
    return w**WIDTH_EXPONENT


def sharing_factor(k: float) -> float:
    return max(1.0, k) ** -SHARING_EXPONENT


def _use_factors(cfg: ArchConfig, ref: Chassis, uses: Iterable[tuple[int, str]]) -> tuple[float, float, float]:
    """(elements read, mean of w*d, mean of w) over ``(layer, slot)`` uses, weighted by elements read."""
    depth_ratio = ref.n_layers / cfg.chassis.n_layers
    total = wd = ww = 0.0
    for layer, slot in uses:
        out_f, fan_in = cfg.chassis.slot_shape(slot, cfg.mlp_widths[layer])  # GQA K/V: narrower out_f
        w = ref.slot_shape(slot, ref.d_ff)[1] / fan_in
        n = out_f * fan_in
        total += n
        wd += n * width_factor(w) * depth_factor(slot, depth_ratio)
        ww += n * w
    return total, wd / total, ww / total


@dataclass(frozen=True)
class _Scope:
    """What every rule may read: the model, its allocation, the reference chassis, ``r = L_ref / L``."""

    model: nn.Module
    cfg: ArchConfig
    ref: Chassis
    depth_ratio: float


def _shared_norm_rule(s: _Scope, m: re.Match[str], p: nn.Parameter) -> Rule:
    """A shared block's norm (norms tied with the block): a gain read by each of its layers."""
    return Rule("norm", sharing_factor(len(s.cfg.members_of(int(m[1])))))


def _matrix_rule(s: _Scope, m: re.Match[str], p: nn.Parameter) -> Rule:
    b, slot = int(m[1]), m[2]
    read, wdf, w = _use_factors(s.cfg, s.ref, [(layer, slot) for layer in s.cfg.members_of(b)])
    return Rule("matrix", sharing_factor(read / p.numel() * _read_share(s.cfg, b)) * wdf, math.sqrt(w))


def _read_share(cfg: ArchConfig, block: int) -> float:
    """Mean share of tokens that read a block per use: 1, or with per-token recursion the capacities
    of the steps its layers belong to (a token routed out of a step never reads the stack there)."""
    if cfg.recursion is None:
        return 1.0
    members = cfg.members_of(block)
    share = cfg.recursion.layer_share()
    return sum(share[i] for i in members) / len(members)


def _recursion_router_rule(s: _Scope, m: re.Match[str], p: nn.Parameter) -> Rule:
    """The recursion router (steps x d_model): an input-slot matrix each token reads once per step."""
    w = s.ref.d_model / s.cfg.chassis.d_model
    return Rule("router", width_factor(w) * depth_factor("mlp_up", s.depth_ratio), math.sqrt(w))


def _bank_rule(s: _Scope, m: re.Match[str], p: nn.Parameter) -> Rule:
    cfg = s.cfg
    bank = cfg.banks[int(m[1])]
    if m[2] == "coef":
        k = sum(len(cfg.members_of(b)) for b, _ in bank.members) / len(bank.members)
        return Rule("coef", sharing_factor(k))
    uses = [(layer, slot) for b, slot in bank.members for layer in cfg.members_of(b)]
    read, wdf, w = _use_factors(cfg, s.ref, uses)
    return Rule("bank", sharing_factor(read / bank.size) * wdf, math.sqrt(w))


def _lora_rule(s: _Scope, m: re.Match[str], p: nn.Parameter) -> Rule:
    layer, slot = int(m[1]), m[2]
    d_in = p.shape[1] if m[3] == "A" else s.model.h[layer].lora[slot].A.shape[1]
    w = s.ref.slot_shape(slot, s.ref.d_ff)[1] / d_in
    return Rule("lora", width_factor(w) * depth_factor(slot, s.depth_ratio))


def _shared_lora_rule(s: _Scope, m: re.Match[str], p: nn.Parameter) -> Rule:
    """A LoRA factor shared by the relaxed layers of one slot type: the bank rule, with the elements
    each layer reads (rank rows of A at its d_in, rank columns of B at its d_out, or its shards)."""
    cfg, name, which = s.cfg, m[1], m[2]
    if name == "frozen":
        return Rule("frozen", 0.0)
    uses = relaxed_uses(cfg)[name]
    reads = 0
    for _, r, o, n in uses:
        k = r if cfg.lora_sharing == "shared_a" else split_rank(r, cfg.lora_private_fraction)[0]
        reads += k * (n if which == "A" else o)
    _, wdf, w = _use_factors(cfg, s.ref, [(layer, name) for layer, *_ in uses])
    return Rule("lora_shared", sharing_factor(reads / max(p.numel(), 1)) * wdf)


def _vera_rule(s: _Scope, m: re.Match[str], p: nn.Parameter) -> Rule:
    """VeRA's per-layer scaling vectors d (r) and b (d_out): gains read by one layer."""
    return Rule("lora_vec", 1.0)


def _expert_rule(s: _Scope, m: re.Match[str], p: nn.Parameter) -> Rule:
    """A pool's stacked expert matrices: an MLP slot of width ``d_expert`` whose sharing count is the
    expected reads of one expert per token, (layers reading the pool) x top_k / (experts in it).
    A SwiGLU ``gate`` takes its sibling ``up``'s rule: same shape, same reads, and it multiplies
    ``up``'s output elementwise, so the pair must step in proportion."""
    cfg, ref, pool, which = s.cfg, s.ref, int(m[1]), m[2]
    e = cfg.experts
    readers = sum(q == pool for q in e.pool_of_layer)
    k = readers * e.top_k / e.pool_sizes[pool]
    slot = "mlp_down" if which == "down" else "mlp_up"  # up and gate: input slots reading d_model
    w = ref.d_ff / e.d_expert if which == "down" else ref.d_model / cfg.chassis.d_model
    d = depth_factor(slot, s.depth_ratio)
    return Rule("expert", sharing_factor(k) * width_factor(w) * d, math.sqrt(w))


def _router_rule(s: _Scope, m: re.Match[str], p: nn.Parameter) -> Rule:
    cfg = s.cfg
    e = cfg.experts
    readers = ([i for i, q in enumerate(e.pool_of_layer) if q == int(m[1])] if e.router == "shared"
               else [int(m[1])])
    w = s.ref.d_model / cfg.chassis.d_model
    return Rule("router", sharing_factor(len(readers)) * width_factor(w) * depth_factor("mlp_up", s.depth_ratio),
                math.sqrt(w))


def _atom_rule(s: _Scope, m: re.Match[str], p: nn.Parameter) -> Rule:
    """A MASA dictionary: like a template_mix bank whose templates are the K atoms. Every reading
    layer's weight mixes all K atoms, so each atom element is read once per reading layer (k = the
    layers reading the slot; its reads over one atom's d x d elements). The coefficients are gains
    read by the layers of their row (one, or a block's readers with scope block)."""
    cfg = s.cfg
    spec = next(a for a in cfg.atoms if a.slot == m[1])
    layers = [i for i in range(cfg.chassis.n_layers) if cfg.layer_reads(i, spec.slot)]
    if m[2] == "coef":
        return Rule("atom_coef", sharing_factor(len(layers) / len(cfg.atom_rows(spec))))
    read, wdf, w = _use_factors(cfg, s.ref, [(layer, spec.slot) for layer in layers])
    return Rule("atom", sharing_factor(read / (p.numel() / spec.n_atoms)) * wdf, math.sqrt(w))


def _norm_rule(s: _Scope, m: re.Match[str], p: nn.Parameter) -> Rule:
    """A norm gain read by one layer (a layer's own norms, the final norm)."""
    return Rule("norm", 1.0)


def _embedding_rule(s: _Scope, m: re.Match[str], p: nn.Parameter) -> Rule:
    return Rule("embedding", 1.0)


# name pattern -> the rule of the table in the module docstring; the first pattern that matches a
# parameter's full name decides (order matters: a shared block's norms before the block's matrices).
# A parameter that matches none is refused by `rules` (UnruledParameter): add its row here and in
# the docstring table, with its reason.
RULES: tuple[tuple[re.Pattern[str], Callable[[_Scope, re.Match[str], nn.Parameter], Rule]], ...] = (
    (re.compile(r"blocks\.(\d+)\.ln_[12]\.weight$"), _shared_norm_rule),
    (re.compile(r"blocks\.(\d+)\.(\w+)$"), _matrix_rule),
    (re.compile(r"banks\.(\d+)\.(weight|coef)$"), _bank_rule),
    (re.compile(r"h\.(\d+)\.lora\.(\w+)\.([AB])$"), _lora_rule),
    (re.compile(r"h\.(\d+)\.lora\.(\w+)\.([db])$"), _vera_rule),
    (re.compile(r"lora_shared\.pairs\.(\w+)\.([AB])$"), _shared_lora_rule),
    (re.compile(r"experts\.pools\.(\d+)\.(up|gate|down)$"), _expert_rule),
    (re.compile(r"experts\.routers\.(\d+)$"), _router_rule),
    (re.compile(r"atoms\.(\w+)\.(atoms|coef)$"), _atom_rule),
    (re.compile(r"recursion\.router$"), _recursion_router_rule),
    (re.compile(r"(?:h\.\d+\.)?ln_\w+\.weight$"), _norm_rule),
    (re.compile(r"(?:wte|wpe|lm_head)\.weight$"), _embedding_rule),
)


def _match(scope: _Scope, name: str, p: nn.Parameter) -> Rule | None:
    for pattern, rule in RULES:
        if m := pattern.match(name):
            return rule(scope, m, p)
    return None


def rules(model: nn.Module, reference: Chassis | None = None) -> dict[str, Rule]:
    """The fair rule of every named parameter of an npas model (``model.cfg`` is its allocation);
    ``reference`` defaults to the model's own chassis, whose untied uniform model the base lr is for.
    Raises UnruledParameter, naming them, for parameters no row of ``RULES`` covers."""
    cfg: ArchConfig = model.cfg
    ref = reference or cfg.chassis
    scope = _Scope(model, cfg, ref, ref.n_layers / cfg.chassis.n_layers)
    out: dict[str, Rule] = {}
    unruled: list[str] = []
    for name, p in model.named_parameters():
        rule = _match(scope, name, p)
        if rule is None:
            unruled.append(name)
        else:
            out[name] = rule
    if unruled:
        raise UnruledParameter(f"no learning-rate rule for parameter(s) {', '.join(unruled)}: add a row to "
                               "npas.training.parameterization.RULES (and its docstring table) with its reason")
    return out


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """The model's own groups when it has them, else decay only >= 2-D parameters (matrices)."""
    if hasattr(model, "param_groups"):
        return model.param_groups(weight_decay)
    params = list(model.parameters())
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def _decays(model: nn.Module, weight_decay: float) -> dict[int, float]:
    """Parameter id -> weight decay, from the model's own groups (or matrices-only decay)."""
    return {id(p): g["weight_decay"] for g in param_groups(model, weight_decay) for p in g["params"]}


def optimizer_groups(model: nn.Module, weight_decay: float, parameterization: str = "fair",
                     reference: Chassis | None = None) -> list[dict[str, Any]]:
    """AdamW parameter groups, each with an ``lr_mult`` that the training loop multiplies the
    schedule's learning rate by at every step (so the rules survive warmup and decay).

    ``uniform`` (or a model without an allocation) keeps the model's weight-decay groups with
    multiplier 1: the old single-learning-rate behaviour. ``fair`` groups parameters with equal
    (group, multiplier, decay) together, so fused AdamW still sees a handful of groups.
    """
    if parameterization == "uniform" or not isinstance(getattr(model, "cfg", None), ArchConfig):
        return [{**g, "lr_mult": 1.0, "group": "all"} for g in param_groups(model, weight_decay) if g["params"]]
    decay = _decays(model, weight_decay)
    table = rules(model, reference)
    merged: dict[tuple[str, float, float], list[nn.Parameter]] = defaultdict(list)
    for name, p in model.named_parameters():
        r = table[name]
        merged[r.group, r.lr_mult, decay[id(p)]].append(p)
    return [{"params": ps, "weight_decay": wd, "lr_mult": mult, "group": group}
            for (group, mult, wd), ps in merged.items()]


@torch.no_grad()
def apply_init(model: nn.Module, parameterization: str = "fair", reference: Chassis | None = None) -> None:
    """Rescale hidden matrices' fresh init by their rule's ``init_scale`` (fair only; uniform and the
    reference itself are untouched). Call once, right after ``build_model``."""
    if parameterization == "uniform" or not isinstance(getattr(model, "cfg", None), ArchConfig):
        return
    table = rules(model, reference)
    for name, p in model.named_parameters():
        scale = table[name].init_scale
        if scale != 1.0:
            p.mul_(scale)
