"""`npas count FILE.yaml`: accounting without training, for an allocation or a space's reference."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from npas.allocation.budget import Accounting, count
from npas.allocation.config import ArchConfig, reference_config
from npas.allocation.fill import FILL_TARGET, FIT_VERSION
from npas.builtin import looks_like_path, space_path
from npas.errors import ConfigError
from npas.files import read_text
from npas.presentation.cli.args import POSITIVE

if TYPE_CHECKING:
    from npas.allocation.space import Space


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("count", help="exact parameter, FLOP and memory accounting, without training")
    p.add_argument("file", help="an allocation YAML (from export) or a search space YAML")
    p.add_argument("--batch-size", type=POSITIVE, default=32, help="batch for the training-memory estimate")
    p.add_argument("--seq-len", type=POSITIVE, default=None, help="sequence length (default: the chassis context)")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.set_defaults(func=run)


def _rows(acc: Accounting, cfg: ArchConfig) -> list[tuple[str, str]]:
    mib = 2**20
    return [
        ("stored params", f"{acc.stored_params:,}"),
        ("  embeddings", f"{acc.embedding_params:,}"),
        ("  block weights", f"{acc.block_params:,}"),
        ("  banks + coefficients", f"{acc.bank_params:,}"),
        ("  atoms + coefficients", f"{acc.atom_params:,}{_atoms_note(cfg)}"),
        ("  experts + routers", f"{acc.expert_params:,}{_experts_note(cfg)}"),
        ("  LoRA", f"{acc.lora_params:,}{_lora_note(cfg, acc)}"),
        ("  norms", f"{acc.norm_params:,}"),
        *([("trainable params", f"{acc.trainable_params:,} (stored less {acc.frozen_params:,} frozen)")]
          if acc.frozen_params else []),
        *([("  recursion router", f"{acc.recursion_params:,}")] if cfg.recursion else []),
        ("non-embedding params", f"{acc.non_embedding_params:,}"),
        ("parameter bytes", f"{acc.param_bytes:,} ({acc.param_bytes / mib:.2f} MiB)"),
        ("materialised params", f"{acc.materialised_params:,}"),
        ("activated params / token", f"{acc.activated_params:,}"
                                     + (" (k experts and the routers, not the whole pool)" if cfg.experts else "")),
        ("forward FLOPs / token", f"{acc.flops_per_token:,}{_recursion_note(cfg, acc)}"),
        ("weight generation FLOPs / step", f"{acc.generation_flops_per_step:,}"),
        ("KV cache bytes / token", f"{acc.kv_cache_bytes_per_token:,}{_kv_note(cfg)}"),
        ("inference bytes (full context)", f"{acc.inference_bytes:,}"),
        ("training memory (estimate)", f"{acc.train_memory_bytes:,} ({acc.train_memory_bytes / mib:.1f} MiB)"),
    ]


def _lora_note(cfg: ArchConfig, acc: Accounting) -> str:
    """How the relaxation's factors are shared across layers, when they are (private LoRA: nothing)."""
    if cfg.lora_sharing == "private" or not acc.lora_params:
        return ""
    extra = {"vera": f", {acc.frozen_params:,} frozen (lora_seed {cfg.lora_seed})",
             "shards": f", {cfg.lora_shards} shards per factor pool, {cfg.lora_private_fraction:g} private"}
    return f" ({cfg.lora_sharing}: factors shared across layers{extra.get(cfg.lora_sharing, '')})"
def _recursion_note(cfg: ArchConfig, acc: Accounting) -> str:
    """Which depth the FLOPs assume: the capacities (what training pays, and what the causal rule's
    threshold aims at); a trained run stores the depth its causal rule realised on the validation windows."""
    r = cfg.recursion
    if r is None:
        return ""
    depth = sum(r.active_share())
    return (f" (at the capacities' expected depth, {depth:.2f} of {r.steps} passes through the stack of {r.stack}: "
            f"training FLOPs; a trained run stores the realised depth's)")


def _experts_note(cfg: ArchConfig) -> str:
    """The pools behind the count: sizes, expert width, k and router kind (stored: every pool expert)."""
    e = cfg.experts
    if e is None:
        return ""
    return (f" ({len(e.pool_sizes)} pool(s) of {', '.join(map(str, e.pool_sizes))} experts, d_expert {e.d_expert}, "
            f"top-{e.top_k}, {e.router} router)")


def _atoms_note(cfg: ArchConfig) -> str:
    """Which projections come from atoms, K, and the coefficient rows: the numbers behind the count."""
    if not cfg.atoms:
        return ""
    groups: dict[tuple[int, str, tuple[int, int]], list[str]] = {}
    for a in cfg.atoms:  # d x d, or a llama chassis' slot shape (GQA's K/V atoms are narrower)
        shape = cfg.chassis.slot_shape(a.slot, 1)
        groups.setdefault((a.n_atoms, a.scope, shape), []).append(a.slot.removeprefix("attn_"))
    rows = sum(len(cfg.atom_rows(a)) for a in cfg.atoms)
    parts = [f"{','.join(s)}: K={k} atoms of {o}x{i} per projection, coefficients per {scope}"
             for (k, scope, (o, i)), s in groups.items()]
    return f" ({'; '.join(parts)}; {rows} coefficient rows)"


def _kv_note(cfg: ArchConfig) -> str:
    """How many layers put their own keys and values in the cache: KV sharing is what lowers it."""
    c = cfg.chassis
    L = c.n_layers
    k, v = (sum(cfg.layer_reads(i, s) for i in range(L)) for s in ("attn_k", "attn_v"))
    gqa = f"{c.kv_heads} of {c.n_heads} heads x {c.head_size} for K and for V" if c.kv_heads < c.n_heads else ""
    if k == v == L:
        return f" ({gqa}: grouped-query attention)" if gqa else ""
    shared = "keys and values" if cfg.kv_mode == "kv" else "values"
    return (f" (K cached by {k} of {L} layers, V by {v} of {L}: the others reuse their group's {shared}"
            + (f"; {gqa}" if gqa else "") + ")")


def run(args: argparse.Namespace) -> int:
    path = Path(args.file)
    if not path.is_file() and not looks_like_path(args.file):
        path = space_path(args.file)  # a shipped space by name: `npas count full`
    if not path.exists():
        raise ConfigError(f"{path}: no such file; give an allocation (npas export ... --out X.yaml) or a space")
    text = read_text(path, "allocation or space file")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: YAML does not parse: {' '.join(str(e).split())}") from None
    is_space = isinstance(data, dict) and "budget" in data and "chassis" in data and "block_of_layer" not in data
    out: dict = {}
    if is_space:
        from npas.allocation.space_parser import parse_space

        space = parse_space(text, str(path))
        cfg = reference_config(space.reference_chassis, space.dtype)
        out["space"] = space.name
        out["budget_params"] = space.budget_params
        out["baselines"] = {}
        for name, vals in space.baselines().items():
            cand = space.candidate({**{k: kn.default for k, kn in space.chassis.items()}, **vals})
            out["baselines"][name] = (
                {"stored_params": cand.fit.stored, "fill": round(cand.fill, 5), "summary": cand.config.summary(),
                 **({"short": cand.short} if cand.short else {})}
                if cand.feasible else {"infeasible": cand.reason}
            )
        out["sample_fill"] = sample_fill(space)
    else:
        cfg = ArchConfig.from_yaml(text)
        if isinstance(data, dict) and data.get("budget_fill") is not None:  # an export: what its trial stored
            out.update({"budget_fill": data["budget_fill"], "fit_version": data.get("fit_version") or 1})
    if args.seq_len is not None and args.seq_len > cfg.chassis.context:
        raise ConfigError(f"--seq-len {args.seq_len} is longer than the chassis context {cfg.chassis.context}: the "
                          f"model cannot read such a sequence; give at most {cfg.chassis.context}")
    acc = count(cfg, batch_size=args.batch_size, seq_len=args.seq_len)
    out.update({"allocation": cfg.summary(), "hash": cfg.hash, "accounting": acc.to_dict()})
    if args.format == "json":
        print(json.dumps(out, indent=2))
        return 0
    title = f"reference model of space '{out['space']}'" if is_space else f"allocation {cfg.hash}"
    print(f"{title}: {cfg.summary()}")
    rows = _rows(acc, cfg)
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
    if is_space:
        print(f"  {'budget':<{width}}  {out['budget_params']:,} params ({space.budget_spec})")
        for name, b in out["baselines"].items():
            desc = f"{b['stored_params']:,} params, fill {b['fill']:.4f}, {b['summary']}" if "summary" in b \
                else f"infeasible: {b['infeasible']}"
            print(f"  baseline {name:<14} {desc}" + (f" (under {FILL_TARGET:g}: {b['short']})" if "short" in b else ""))
        for line in _sample_fill_lines(out["sample_fill"]):
            print(f"  {line}")
    elif "budget_fill" in out:
        print(f"  {'budget fill':<{width}}  {out['budget_fill']:.4f} of its study's budget "
              f"(fit version {out['fit_version']})")
    return 0


SAMPLES = 64  # random candidates `npas count SPACE` fits to show the space's fill (sampling only counts: ~0.1 s)


def sample_fill(space: Space, n: int = SAMPLES, seed: int = 0) -> dict:
    """How much of the budget random candidates of `space` store: what a search's candidates will hold.

    A fixed seed, so the same space prints the same line; the reasons of any under the fill target
    are listed once each."""
    import optuna  # only a space's count samples; the CLI starts without it

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "study created" line for the in-memory study
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    fills, short = [], {}
    for _ in range(n):
        cand = space.sample(study.ask())
        if cand.feasible:
            fills.append(cand.fill)
            if cand.short:
                short[cand.short] = short.get(cand.short, 0) + 1
    out: dict = {"samples": n, "feasible": len(fills), "target": FILL_TARGET, "fit_version": FIT_VERSION}
    if fills:
        out.update({"min": round(min(fills), 5), "median": round(statistics.median(fills), 5),
                    "under_target": sum(f < FILL_TARGET for f in fills), "short": short})
    return out


def _sample_fill_lines(s: dict) -> list[str]:
    if not s["feasible"]:
        return [f"fill of {s['samples']} random candidates: none feasible (see `npas search` for the reasons)"]
    lines = [f"fill of {s['samples']} random candidates: {s['feasible']} feasible, smallest {s['min']:.4f}, median "
             f"{s['median']:.4f}; {s['under_target']} under {s['target']:g} of the budget"]
    lines += [f"  {k} x under {s['target']:g}: {why}" for why, k in s["short"].items()]
    return lines
