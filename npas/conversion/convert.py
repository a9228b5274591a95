"""Convert a trained model into another allocation of its chassis: weights derived, not drawn.

Order of work, each step reading only what the previous ones settled:
  1. read the source's effective per-layer weights (`source`), refuse what cannot be converted;
  2. per layer, the *target* weights: residual dims narrowed (`residual`), MLP resized (`widths`),
     tied layers' MLP units matched to each other (`align`);
  3. every shared tensor from the targets of the layers that read it: direct blocks (`tying`),
     banks (`banks`), attention atoms (`atoms`); norms and embeddings copied (averaged when tied);
  4. with those loaded, each relaxed layer's LoRA delta from what sharing lost (`lora`).
Every state-dict entry gets a provenance record; an entry without one is a bug and raises.

The seed only draws what provenance declares fresh: the input rows of a widened MLP's new units
(`widths`) and the init of elements nothing is fitted to. Every fit leaves the new units' random rows
out (unit matching, shared weights, banks, LoRA residuals and the reported errors see the trained
units only), so a tensor labelled "derived" is bit for bit the same whatever the seed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from npas.allocation.config import ArchConfig, block_slots
from npas.allocation.transformer import TransformerLM, build_model
from npas.conversion.align import match_units, permute_units
from npas.conversion.atoms import fit_atoms
from npas.conversion.banks import fit_copy_bank, fit_template_bank
from npas.conversion.calibration import mlp_inputs
from npas.conversion.experts import split_experts
from npas.conversion.hashed import fit_hashed_bank
from npas.conversion.lora import lora_factors, relative_error
from npas.conversion.provenance import ProvenanceRecord
from npas.conversion.residual import ResidualPlan, narrow_slot, narrow_vector, plan_residual
from npas.conversion.shared_lora import fit_relaxation
from npas.conversion.source import SourceModel, read_source
from npas.conversion.tying import TIE_INITS, TieInit, fresh_only, shared_weight
from npas.conversion.widths import fresh_elements, resize_mlp
from npas.errors import ConfigError


@dataclass
class Conversion:
    """The converted model (fp32), its allocation, where each tensor came from, and how well each
    relaxed or shared layer weight matches its target (relative Frobenius error, per layer.slot)."""

    model: TransformerLM
    cfg: ArchConfig
    provenance: ProvenanceRecord
    errors: dict[str, float]


def convertible_problems(src: ArchConfig, dst: ArchConfig) -> list[str]:
    """Why `src`'s weights cannot become `dst`'s (empty when they can)."""
    a, b = src.chassis, dst.chassis
    out = []
    if a.n_layers != b.n_layers:
        out.append(f"the trained model has {a.n_layers} layers and the allocation {b.n_layers}; conversion keeps "
                   f"the depth, so convert to an allocation of the same chassis (n_layers: {a.n_layers})")
    for name in ("vocab_size", "n_heads", "activation"):
        if getattr(a, name) != getattr(b, name):
            out.append(f"chassis.{name} differs (trained {getattr(a, name)!r}, allocation {getattr(b, name)!r}); "
                       f"convert to an allocation of the trained model's chassis")
    if a.family != b.family:
        out.append(f"chassis.family differs (trained {a.family!r}, allocation {b.family!r}); convert to an "
                   f"allocation of the trained model's chassis")
    elif a.llama:
        # rotary pairs and grouped heads do not survive a narrowed residual: one llama chassis only
        for name in ("d_model", "n_kv_heads", "head_dim", "rope_theta", "rms_norm_eps", "tie_embeddings",
                     "rope_scaling"):
            if getattr(a, name) != getattr(b, name):
                out.append(f"chassis.{name} differs (trained {getattr(a, name)!r}, allocation "
                           f"{getattr(b, name)!r}); a llama model converts to allocations of its own chassis")
    if b.d_model > a.d_model:
        out.append(f"the allocation's d_model={b.d_model} is wider than the trained model's {a.d_model}; conversion "
                   f"can only keep or narrow the residual stream")
    if b.context > a.context and not a.llama:  # llama: rotary positions, no table that ends
        out.append(f"the allocation's context={b.context} is longer than the trained model's {a.context}, whose "
                   f"position embeddings end there; use context <= {a.context}")
    if src.recursion is not None:
        out.append("the trained model routes each token through its shared stack a number of times of its own "
                   "(recursion), so no layer's weights are what every token computed with; convert from a model "
                   "without recursion")
    if src.kv_source != tuple(range(a.n_layers)):
        out.append("the trained model shares keys/values across layers (kv_source), so some layers have no "
                   "key/value weights of their own to convert; convert from a model without KV sharing")
    return out


def _targets(src: SourceModel, cfg: ArchConfig, plan: ResidualPlan, gen: torch.Generator,
             inputs: list[Tensor] | None
             ) -> tuple[list[dict[str, Tensor]], list[str | None], list[str], list[Tensor]]:
    """Per layer: the weights this allocation's layer should compute with, its fresh-element note,
    how its MLP width was changed ("" when it was not) and which of its MLP units are new."""
    targets, notes, how, new = [], [], [], []
    for i, ws in enumerate(src.layers):
        narrowed = {slot: narrow_slot(plan, slot, w.value) for slot, w in ws.items()}
        h = None if inputs is None else narrow_vector(plan, inputs[i])
        resized, note, method = resize_mlp(narrowed, cfg.mlp_widths[i], gen, h)
        targets.append(resized)
        notes.append(note)
        how.append(method)
        new.append(torch.arange(resized["mlp_down"].shape[1]) >= narrowed["mlp_down"].shape[1])  # appended
    return targets, notes, how, new


def _align_tied_mlps(cfg: ArchConfig, targets: list[dict[str, Tensor]], new: list[Tensor]) -> None:
    """Permute each tied layer's MLP units to match its block's first layer (see `align`); in place,
    the new-unit masks along. A permutation changes nothing a layer computes: every target stays exact."""
    for b in range(cfg.n_blocks):
        members = cfg.members_of(b)
        if len(members) < 2 or len({cfg.mlp_widths[i] for i in members}) > 1:
            continue
        first = targets[members[0]]
        for i in members[1:]:
            perm = match_units(first, targets[i], new[members[0]], new[i])
            targets[i] = permute_units(targets[i], perm)
            new[i] = new[i][perm]


def _readers(cfg: ArchConfig, block: int, slot: str) -> list[int]:
    return [i for i in cfg.members_of(block) if cfg.layer_reads(i, slot)]


def _relaxed(cfg: ArchConfig, layer: int, slot: str) -> bool:
    return bool(cfg.lora_attn[layer] if slot.startswith("attn") else cfg.lora_mlp[layer])


def tie_mode(cfg: ArchConfig, layers: list[int], slot: str, tie_init: str) -> str:
    """`auto` resolved for one shared weight: average when LoRA relaxes its readers, else stepwise."""
    if tie_init != "auto":
        return tie_init
    return "average" if any(_relaxed(cfg, i, slot) for i in layers) else "stepwise"


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """Conversion runs hundreds of small SVDs and least-squares solves (<= d_ff x d_model): on one
    thread each takes milliseconds, while a multi-threaded LAPACK call on a busy machine spins its
    threads and was measured 100x slower (256x64 SVD: 6 ms vs 680 ms with 2 threads under load)."""
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(prev)


def convert_model(source: TransformerLM, cfg: ArchConfig, tie_init: TieInit = "auto",
                  seed: int = 0, align: bool = True, calibration: Tensor | None = None) -> Conversion:
    """`source` (any trained allocation without KV sharing) converted into `cfg`; see the module doc.
    `align`: match tied layers' MLP units before sharing them (`align`); False averages them as they are.
    `calibration`: (n, T) token ids of training text for data-aware MLP narrowing (`calibration`)."""
    with _one_thread(), torch.no_grad():
        return _convert(source, cfg, tie_init, seed, align, calibration)


def _convert(source: TransformerLM, cfg: ArchConfig, tie_init: TieInit, seed: int, align: bool,
             calibration: Tensor | None) -> Conversion:
    if tie_init not in TIE_INITS:
        raise ConfigError(f"tie init {tie_init!r} is not one of {list(TIE_INITS)}")
    problems = convertible_problems(source.cfg, cfg)
    if problems:
        raise ConfigError("cannot convert: " + "; ".join(problems))
    src = read_source(source)
    plan = plan_residual(src, cfg.chassis.d_model)
    gen = torch.Generator().manual_seed(seed)
    narrows = any(w < n for w, n in zip(cfg.mlp_widths, source.cfg.mlp_widths, strict=True))
    inputs = mlp_inputs(source, calibration) if calibration is not None and narrows else None
    targets, notes, resized, new = _targets(src, cfg, plan, gen, inputs)
    if align:
        _align_tied_mlps(cfg, targets, new)
    # per layer and slot, the target's fresh (seed-drawn) elements, None where it has none: every fit
    # below leaves them out, so what it derives does not depend on the seed
    fresh_at = [{slot: None for slot in ws} | fresh_elements(ws, new[i]) for i, ws in enumerate(targets)]
    torch.manual_seed(seed)  # the few elements kept fresh (declared in provenance) are reproducible
    model = build_model(cfg).float()
    prov = ProvenanceRecord()
    params = dict(model.named_parameters())
    narrowed = "" if plan.identity else f", residual narrowed {source.cfg.chassis.d_model}->{cfg.chassis.d_model}"

    def srcs(layers: list[int], slot: str) -> list[str]:
        return [s for i in layers for s in src.layers[i][slot].sources]

    def width_how(layers: list[int], slot: str) -> str:
        got = sorted({resized[i] for i in layers if resized[i]}) if slot.startswith("mlp") else []
        return "".join(f"; {g}" for g in got)

    def fresh_of(layers: list[int], slot: str) -> str | None:
        if not slot.startswith("mlp"):
            return None
        got = [f"layer {i}: {notes[i]}" for i in layers if notes[i]]
        return "; ".join(got) or None

    # ---- shared and direct block weights ------------------------------------------------------
    block_target: dict[tuple[int, str], Tensor] = {}
    block_fresh: dict[tuple[int, str], Tensor | None] = {}  # elements only fresh target elements cover
    block_sources: dict[tuple[int, str], list[str]] = {}
    for b in range(cfg.n_blocks):
        for slot in block_slots(cfg.chassis.activation):
            if not cfg.block_stores(b, slot):
                continue
            readers = _readers(cfg, b, slot)
            mode = tie_mode(cfg, readers, slot, tie_init)
            shape, ws, fs = cfg.slot_shape(b, slot), [targets[i][slot] for i in readers], [fresh_at[i][slot] for i in readers]
            block_target[b, slot] = shared_weight(shape, ws, mode, fs)
            block_fresh[b, slot] = fresh_only(shape, ws, fs)
            block_sources[b, slot] = srcs(readers, slot)
            name = f"blocks.{b}.{slot}"
            if name in params:
                params[name].copy_(block_target[b, slot])
                how = "copy" if len(readers) == 1 else f"tied {mode} of layers {readers}"
                prov.add(name, block_sources[b, slot], how + narrowed + width_how(readers, slot),
                         fresh_of(readers, slot))
    for k, (bank_cfg, bank) in enumerate(zip(cfg.banks, model.banks, strict=True)):
        members = [block_target[m] for m in bank_cfg.members]
        members_fresh = [block_fresh[m] for m in bank_cfg.members]
        sources = [s for m in bank_cfg.members for s in block_sources[m]]
        layers = sorted({i for b, s in bank_cfg.members for i in _readers(cfg, b, s)})
        mlp_notes = "; ".join(sorted({n for b, s in bank_cfg.members
                                      if (n := fresh_of(_readers(cfg, b, s), s))})) or None
        if bank_cfg.generator == "template_mix":
            relaxed = any(_relaxed(cfg, i, s) for b, s in bank_cfg.members for i in _readers(cfg, b, s))
            mode = tie_init if tie_init != "auto" else "average" if relaxed else "stepwise"
            weight, coef, spare = fit_template_bank(bank, members, mode, members_fresh)
            bank.weight.copy_(weight)
            bank.coef.copy_(coef)
            fresh = "; ".join(x for x in (f"{spare} template(s) beyond the members' rank (zero coefficients)"
                                          if spare else None, mlp_notes) if x) or None
            how = (f"templates = the first {bank_cfg.templates} members" if mode == "stepwise"
                   else f"least squares (rank {bank_cfg.templates})")
            prov.add(f"banks.{k}.weight", sources, f"template_mix {how} of {len(members)} members{narrowed}", fresh)
            prov.add(f"banks.{k}.coef", sources, "template_mix least squares coefficients")
        elif bank_cfg.generator == "hash":
            weight, _ = fit_hashed_bank(bank, members, members_fresh)
            bank.weight.copy_(weight)
            prov.add(f"banks.{k}.weight", sources, f"hash bank: least squares, each array element the sign-corrected "
                     f"mean of the member elements hashed to it (layers {layers}){narrowed}", mlp_notes)
        else:
            weight, unread = fit_copy_bank(bank, members, members_fresh)
            bank.weight.copy_(weight)
            fresh = "; ".join(x for x in (f"{unread} elements no member reads" if unread else None, mlp_notes)
                              if x) or None
            prov.add(f"banks.{k}.weight", sources, f"{bank_cfg.generator} bank: mean of the member elements "
                     f"read at each position (layers {layers}){narrowed}", fresh)
    for spec in cfg.atoms:
        rows = cfg.atom_rows(spec)
        if spec.scope == "layer":
            row_w = [targets[i][spec.slot] for i in rows]
            sources = srcs(list(rows), spec.slot)
        else:
            row_w = [shared_weight(cfg.slot_shape(b, spec.slot), [targets[i][spec.slot] for i in
                                                                   _readers(cfg, b, spec.slot)],
                                   tie_mode(cfg, _readers(cfg, b, spec.slot), spec.slot, tie_init))
                     for b in rows]
            sources = [s for b in rows for s in srcs(_readers(cfg, b, spec.slot), spec.slot)]
        dictionary = model.atoms[spec.slot]
        atom_mode = tie_mode(cfg, [i for i in range(cfg.chassis.n_layers) if cfg.layer_reads(i, spec.slot)],
                             spec.slot, tie_init)
        atoms, coef, spare = fit_atoms(dictionary, row_w, atom_mode)
        dictionary.atoms.copy_(atoms)
        dictionary.coef.copy_(coef)
        how = "the first readers' weights" if atom_mode == "stepwise" else "truncated SVD"
        prov.add(f"atoms.{spec.slot}.atoms", sources, f"{how} of {len(rows)} {spec.scope} weights "
                 f"({spec.n_atoms} atoms){narrowed}",
                 f"{spare} atom(s) beyond the readers' rank (zero coefficients)" if spare else None)
        prov.add(f"atoms.{spec.slot}.coef", sources, "truncated SVD coefficients")

    # ---- expert pools: the dense MLP units of each pool's layers, split into its experts --------
    if cfg.experts is not None:
        dense = [{slot: narrow_slot(plan, slot, w.value) for slot, w in src.layers[i].items() if slot.startswith("mlp")}
                 for i in range(cfg.chassis.n_layers)]
        readers = split_experts(cfg, model.experts, dense)
        e = cfg.experts
        for p, layers in readers.items():
            mlp = [s for i in layers for slot in src.layers[i] if slot.startswith("mlp") for s in src.layers[i][slot].sources]
            for part in ("up", "gate", "down"):
                if f"experts.pools.{p}.{part}" in params:
                    prov.add(f"experts.pools.{p}.{part}", mlp, f"{e.pool_sizes[p]} experts of {e.d_expert} units split "
                             f"from layers {layers}' MLPs by importance" + (f", scaled by E/k = {e.pool_sizes[p]}/"
                                                                           f"{e.top_k}" if part == "down" else "")
                             + narrowed)
        for r in range(len(model.experts.routers)):
            p = r if e.router == "shared" else e.pool_of_layer[r]
            mlp = [s for i in readers[p] for s in src.layers[i]["mlp_up"].sources]
            prov.add(f"experts.routers.{r}", mlp, "each expert's row: the normalised centroid of its up-projection rows")

    # ---- recursion: the stack came from the dense layers as tying's; the router lets every token run
    if cfg.recursion is not None:
        _open_router(model, prov)

    # ---- norms and embeddings -----------------------------------------------------------------
    for i in range(cfg.chassis.n_layers):
        for ln in ("ln_1", "ln_2"):
            if cfg.norms_in_layer(i):
                params[f"h.{i}.{ln}.weight"].copy_(narrow_vector(plan, src.norms[i][ln].value))
                prov.add(f"h.{i}.{ln}.weight", src.norms[i][ln].sources, "copy" + narrowed)
    for b in range(cfg.n_blocks):
        if f"blocks.{b}.ln_1.weight" in params:
            layers = list(cfg.members_of(b))
            for ln in ("ln_1", "ln_2"):
                vals = torch.stack([narrow_vector(plan, src.norms[i][ln].value) for i in layers])
                mode = "stepwise" if tie_init == "stepwise" else "average"  # a mean of gains is no blur
                params[f"blocks.{b}.{ln}.weight"].copy_(vals.mean(0) if mode == "average" else vals[0])
                prov.add(f"blocks.{b}.{ln}.weight", [s for i in layers for s in src.norms[i][ln].sources],
                         f"tied {mode} of layers {layers}" + narrowed)
    ctx = cfg.chassis.context
    for name in src.embed:  # wte, ln_f, and wpe (classic) or an untied lm_head (llama)
        v = narrow_vector(plan, src.embed[name].value)
        params[f"{name}.weight"].copy_(v[:ctx] if name == "wpe" else v)
        prov.add(f"{name}.weight", src.embed[name].sources, "copy" + narrowed
                 + (f", first {ctx} positions" if name == "wpe" and ctx < source.cfg.chassis.context else ""))

    # ---- LoRA: what sharing lost, per relaxed layer --------------------------------------------
    errors: dict[str, float] = {}
    read = _read_weights(model)
    if cfg.lora_sharing != "private":  # factors shared across layers (npas.conversion.shared_lora)
        relaxed = [(i, slot) for i, layer in enumerate(model.h) for slot in layer.lora]
        fit_relaxation(model, cfg, {(i, s): _trained(targets[i][s], fresh_at[i][s]) - _trained(read[i][s], fresh_at[i][s])
                                    for i, s in relaxed}, {(i, s): srcs([i], s) + block_sources.get(
                                        (cfg.block_of_layer[i], s), []) for i, s in relaxed}, prov)
        for i, s in relaxed:
            errors[f"{i}.{s}"] = relative_error(_trained(targets[i][s], fresh_at[i][s]), _trained(
                read[i][s] + model.h[i].lora[s].delta(), fresh_at[i][s]))
    for i, layer in enumerate(model.h if cfg.lora_sharing == "private" else ()):
        for slot, lora in layer.lora.items():
            target = _trained(targets[i][slot], fresh_at[i][slot])
            residual = target - _trained(read[i][slot], fresh_at[i][slot])  # fitted to the trained units only
            B, A, k = lora_factors(residual, lora.A.shape[0], lora.scale, lora.A.detach())
            lora.A.copy_(A)
            lora.B.copy_(B)
            errors[f"{i}.{slot}"] = relative_error(target, _trained(read[i][slot] + lora.delta(), fresh_at[i][slot]))
            r = lora.A.shape[0]
            names = srcs([i], slot) + [s for b in {cfg.block_of_layer[i]} for s in block_sources.get((b, slot), [])]
            fresh = f"{r - k} of {r} components with nothing left to fit (A fresh, B zero)" if k < r else None
            for part in ("A", "B"):
                prov.add(f"h.{i}.lora.{slot}.{part}", names, f"rank-{r} SVD of layer {i}'s weight minus the "
                         f"shared one (scale {lora.scale:g})", fresh)
    for i, ws in enumerate(_read_weights(model)):
        for slot, w in ws.items():
            f = fresh_at[i][slot]
            errors.setdefault(f"{i}.{slot}", relative_error(_trained(targets[i][slot], f), _trained(w, f)))
    missing = prov.missing(model.state_dict())
    if missing:
        raise RuntimeError(f"conversion wrote no provenance for {missing}")  # a bug, never a user error
    return Conversion(model, cfg, prov, errors)


@torch.no_grad()
def _open_router(model: TransformerLM, prov: ProvenanceRecord) -> None:
    """A dense model routes no tokens, so the router starts at zero with the causal rule's threshold
    below it: under evaluation every token scores 0, clears -1 and runs every step (the depth of the
    dense model), until training moves scores and threshold (its first update sets the threshold)."""
    rec = model.recursion
    rec.router.zero_()
    rec.threshold.fill_(-1.0)
    rec.updates.zero_()
    gated = rec.spec.gate == "sigmoid"  # the gate scales each pass's update by sigmoid(score): 0.5 at a zero score
    prov.add("recursion.router", [], "zeros: every token scores 0 at every step" + (
        "; with gate: sigmoid each pass's update starts halved (sigmoid(0) = 0.5) until training moves the "
        "scores, so only gate: none starts at the tied conversion's function" if gated else ""),
             "every row (a dense model routes no tokens)")
    prov.add("recursion.threshold", [], "-1 below every score: under evaluation every token runs every step")
    prov.add("recursion.updates", [], "0: the first training step sets the threshold from its top-k")


def _trained(w: Tensor, fresh: Tensor | None) -> Tensor:
    """w with its fresh elements zeroed: what a fit against the trained units sees."""
    return w if fresh is None else torch.where(fresh, 0.0, w)


@torch.no_grad()
def _read_weights(model: TransformerLM) -> list[dict[str, Tensor]]:
    """What each layer of `model` multiplies with before its LoRA delta, at the layer's MLP width."""
    cfg = model.cfg
    blocks = model.materialise()
    atoms = {slot: d.generate() for slot, d in model.atoms.items()}
    out = []
    for i in range(cfg.chassis.n_layers):
        b, n = cfg.block_of_layer[i], cfg.mlp_widths[i]
        ws = {}
        for slot in block_slots(cfg.chassis.activation):
            if not cfg.layer_reads(i, slot):
                continue
            w = atoms[slot][model._atom_row[slot][i]] if slot in atoms else blocks[b][slot]
            ws[slot] = w[:n] if slot in ("mlp_up", "mlp_gate") else w[:, :n] if slot == "mlp_down" else w
        out.append(ws)
    return out
