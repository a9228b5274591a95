"""Training-step overhead of sharing: tied, pooled, tapered and relaxed allocations vs the dense reference.

    python benchmarks/sharing_overhead.py            # d_model 128, 8 layers, batch 16 x seq 128
    python benchmarks/sharing_overhead.py --quick    # small shape, few steps, 1 thread: a smoke run
    python benchmarks/sharing_overhead.py --threads 1   # when other jobs hold the cores (see below)

Every variant runs on the reference's chassis (d_model, n_layers, d_ff), so the weights each token
multiplies with, and hence its FLOPs, match the dense reference; sharing only changes where the
weights are stored. That is checked analytically (`npas.count(...).flops_per_token`, printed as the
FLOP ratio; the `+gen` column adds the once-per-step work amortised over the batch's tokens:
template_mix generation, atom combinations and LoRA merges). So any extra step time is the price of sharing itself:
generating weights from banks or atoms, strided slices, gradient accumulation into shared tensors,
merges. The exception is kv_shared_g2: its consumer layers skip the K/V projections, so it does
fewer FLOPs than the reference (its FLOP ratio says how many) and should run faster.

A step is forward + backward + AdamW step at fp32 on 2 threads, same batch for every variant.
The machine is noisy, so measurements interleave (reference, variant, reference, variant, ...) for
several rounds, each block counts its fastest step, and the ratio is the median of the paired ratios.
When other jobs keep the 2 cores busy, 2 OpenMP threads stall at every barrier (steps run 5-10x
slower and the ratios are meaningless); `--threads 1` still gives usable ratios there.

Target: each variant <= 1.10x the reference's step time. Prints PASS/MISS per variant; exits 0.
Hashed sharing (rows `hashed_global_<budget>x`: one array for every weight, at 0.5x, 0.25x and 0.1x of
the reference's stored parameters) runs the reference's shapes and gathers every weight from the array
once per step; its target is <= 1.25x the reference, the dense model of equal FLOPs per token.
The shared-LoRA rows (`relaxed_cycle_{shared_a,vera,shards}8`) are also printed against private LoRA
of equal rank (`relaxed_cycle_lora8`), same 1.10x target: the price of sharing the factors.

The same sharing variants run again on a LLaMA-family chassis (RMSNorm, rotary positions, SwiGLU,
grouped-query attention with 2 K/V heads for 4 query heads: search_spaces/llama.yaml's reference),
each paired with that chassis' own dense reference of equal FLOPs per token, in a table of its own
(rows `llama_<variant>`, same 1.10x target). `--family classic` or `--family llama` times one of them.

Expert pools (a third table) change what a token computes, so they are held to their own targets.
Each runs k experts per layer of width d_ff / k, so its activated FLOPs per token equal the dense
reference's plus the routers' scores (FLOP ratio printed): the reference *is* the dense model of
equal activated FLOPs, and the ratio to it is the price of routing and sparse dispatch (target
<= 1.5x on CPU). Step time must grow with k, not with pool size: the global pool 4x larger at the
same k is timed against the global pool (target <= 1.15x). That row depends on the tokens each expert
sees: what a larger pool adds per step (its weight gradients and AdamW state, the routers' scores,
smaller per-expert matmuls) is per expert, what the experts compute is per token; `--batch 64`
gives the 4x pool 128 rows an expert a layer instead of 32.

Per-token recursion (a fourth table, `--family recursion`) is timed against the fixed-depth stack it
skips work of: N_r = 3 passes through a stack of U = 2 layers (no unique layers), batch 16 x 64
tokens, expert-choice routing with per-step keys/values. At capacity 1 every token runs every pass
(the routing's own cost: router scores, gates, the auxiliary loss); at capacity 0.5 for passes 2-3
the stack runs on the gathered half of the tokens there, which must show as time saved: target
<= 0.80x the fixed-depth step (its FLOP ratio is ~0.7), the median of interleaved paired ratios.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from dataclasses import dataclass

import torch

import npas
from npas import ArchConfig, Bank, Chassis, reference_config
from npas.allocation.config import AtomSpec, ExpertPool
from npas.allocation.fit import fit_banks
from npas.allocation.layer_maps import bank_members, taper_profile, tying_map
from npas.allocation.recursion import RecursionSpec
from npas.allocation.recursion_allocation import recursion_config

TARGET = 1.10
HASH_TARGET = 1.25  # hashed sharing: one gather of every weight per step (see `hashed_variants`)
HASH_BUDGETS = (0.5, 0.25, 0.1)  # of the reference's stored parameters
HASH_TILE = 64
EXPERT_TARGET = 1.5  # expert pool vs the dense model of equal activated FLOPs, on CPU
POOL_SIZE_TARGET = 1.15  # a pool 4x larger at the same k vs the pool
RECURSION_TARGET = 0.80  # capacity 0.5 at passes 2-3 vs the fixed-depth stack


@dataclass(frozen=True)
class Shape:
    chassis: Chassis
    batch: int
    seq_len: int


FULL = Shape(Chassis(vocab_size=68, context=128, d_model=128, n_layers=8, n_heads=4, d_ff=512), 16, 128)
QUICK = Shape(Chassis(vocab_size=68, context=32, d_model=32, n_layers=4, n_heads=2, d_ff=128), 4, 32)
# search_spaces/llama.yaml's reference: SwiGLU at ~8/3 d_model, 2 K/V heads for 4 query heads
LLAMA = Chassis(vocab_size=68, context=128, d_model=128, n_layers=8, n_heads=4, d_ff=352, activation="swiglu",
                family="llama", n_kv_heads=2, rms_norm_eps=1e-5)
LLAMA_QUICK = Chassis(vocab_size=68, context=32, d_model=32, n_layers=4, n_heads=2, d_ff=96, activation="swiglu",
                      family="llama", n_kv_heads=1, rms_norm_eps=1e-5)


# each shared-LoRA mode's fields at rank 8: shards pool a quarter of private LoRA's 8 x L rank vectors
# (at least a layer's 6 shared ones), with a quarter of each rank private
LORA_SHARING_KW = {"shared_a": {}, "vera": {"lora_seed": 0}, "shards": {"lora_shards": 16, "lora_private_fraction": 0.25}}


def variants(ch: Chassis) -> dict[str, ArchConfig]:
    """The sharing mechanisms, each at the reference's per-token shape."""
    L = ch.n_layers
    ref = reference_config(ch)
    widths = (ch.d_ff,) * L
    cycle = tying_map("cycle", L, L // 2)

    def pooled(generator: str) -> ArchConfig:
        members = bank_members(ref, "by_type", 1)  # one bank per slot type over all 8 blocks
        banks = []
        for m in members:
            numels = ref.member_numels(Bank(m, "tie", 1))
            if generator == "template_mix":  # 4 full-length templates, learned per-member mixing
                banks.append(Bank(m, generator, size=max(numels), templates=4))
            else:  # slice: a quarter of the untied size, so windows overlap (and wrap around)
                banks.append(Bank(m, generator, size=sum(numels) // 4))
        return ArchConfig(chassis=ch, mlp_widths=widths, block_of_layer=ref.block_of_layer, banks=tuple(banks))

    taper = tuple(round(ch.d_ff * p) for p in taper_profile("cosine", L, 3.0))
    # MASA: Q, K, V and O each from a dictionary of K = L/3 atoms (the seed's "a third of the layers")
    atoms = tuple(AtomSpec(s, max(1, round(L / 3))) for s in ("attn_q", "attn_k", "attn_v", "attn_o"))
    return {
        "tied_all": ArchConfig(chassis=ch, mlp_widths=widths, block_of_layer=(0,) * L),
        "tied_cycle": ArchConfig(chassis=ch, mlp_widths=widths, block_of_layer=cycle),
        "pooled_template_mix": pooled("template_mix"),
        "pooled_slice": pooled("slice"),
        "tapered_cosine3": ArchConfig(chassis=ch, mlp_widths=taper, block_of_layer=ref.block_of_layer),
        "relaxed_cycle_lora8": ArchConfig(chassis=ch, mlp_widths=widths, block_of_layer=cycle,
                                          lora_attn=(8,) * L, lora_mlp=(8,) * L),
        # LoRA factors shared across layers, each at private LoRA's rank 8 (also timed against it, below)
        **{f"relaxed_cycle_{mode}8": ArchConfig(chassis=ch, mlp_widths=widths, block_of_layer=cycle,
                                                lora_attn=(8,) * L, lora_mlp=(8,) * L, lora_sharing=mode, **kw)
           for mode, kw in LORA_SHARING_KW.items()},
        "atoms_qkvo_third": ArchConfig(chassis=ch, mlp_widths=widths, block_of_layer=ref.block_of_layer, atoms=atoms),
        # consumers skip their K/V projections: fewer FLOPs than the reference (FLOP ratio < 1)
        "kv_shared_g2": ArchConfig(chassis=ch, mlp_widths=widths, block_of_layer=ref.block_of_layer,
                                   kv_source=tuple(i // 2 * 2 for i in range(L))),
    }


def hashed_variants(ch: Chassis) -> dict[str, ArchConfig]:
    """Hashed sharing (ROAST / STABLE-RPS) at 0.5x, 0.25x and 0.1x of the reference's stored parameters:
    one global array read by every slot of every block, fitted to the budget (`fit_banks`). It keeps
    the reference's shapes, so the reference is the dense model of equal FLOPs per token, and the
    ratio is the price of gathering every weight from the array once per step (and scattering its
    gradient back): held to HASH_TARGET, not TARGET."""
    ref = reference_config(ch)
    members = bank_members(ref, "all", 1)
    n_ref = npas.count(ref).stored_params
    return {f"hashed_global_{frac:g}x": fit_banks(ref, members, "hash", int(frac * n_ref), tile=HASH_TILE).config
            for frac in HASH_BUDGETS}


def expert_variants(ch: Chassis, per_layer: int = 4) -> dict[str, ArchConfig]:
    """Expert pools at the reference's activated FLOPs: k experts of width d_ff / k per token and layer."""
    L = ch.n_layers

    def moe(pools: tuple[int, ...], of_layer: tuple[int, ...], k: int) -> ArchConfig:
        return ArchConfig(chassis=ch, mlp_widths=(ch.d_ff,) * L, block_of_layer=tuple(range(L)),
                          experts=ExpertPool(pools, of_layer, ch.d_ff // k, k))

    glob = (0,) * L
    half = L * per_layer // 2  # a global pool at half the per-layer experts
    return {
        "experts_global_k1": moe((half,), glob, 1),
        "experts_global4x_k1": moe((4 * half,), glob, 1),
        "experts_global_k2": moe((half,), glob, 2),
        "experts_per_layer_k1": moe((per_layer,) * L, tuple(range(L)), 1),
    }


RECURSION_SHAPE = Shape(Chassis(vocab_size=68, context=64, d_model=128, n_layers=6, n_heads=4, d_ff=512), 16, 64)
RECURSION_QUICK = Shape(Chassis(vocab_size=68, context=32, d_model=32, n_layers=6, n_heads=2, d_ff=128), 4, 32)


def recursion_variants(ch: Chassis) -> tuple[ArchConfig, dict[str, ArchConfig]]:
    """(the fixed-depth stack: 3 passes of 2 tied layers, every token every pass; the same stack with
    per-token recursion at capacity 1, and at capacity 0.5 for passes 2-3)."""
    def mor(caps: tuple[float, ...]) -> ArchConfig:
        return recursion_config(ch, RecursionSpec(steps=3, stack=2, capacities=caps))

    fixed = dataclasses.replace(mor(()), recursion=None)
    return fixed, {"mor_capacity_1": mor((1.0, 1.0, 1.0)), "mor_capacity_0.5": mor((1.0, 0.5, 0.5))}


class Runner:
    """One model, its AdamW and a fixed batch; `time(steps)` returns seconds per training step."""

    def __init__(self, cfg: ArchConfig, idx: torch.Tensor, targets: torch.Tensor) -> None:
        torch.manual_seed(0)
        self.model = npas.build_model(cfg).train()
        self.opt = torch.optim.AdamW(self.model.param_groups(0.1), lr=1e-3, fused=False, foreach=True)
        self.idx, self.targets = idx, targets

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        _, loss = self.model(self.idx, self.targets)
        if self.model.experts is not None or self.model.recursion is not None:
            loss = loss + self.model.aux_loss  # balance / router losses train with the LM loss, as in the proxy
        loss.backward()
        self.opt.step()

    def time(self, steps: int) -> float:
        """Seconds of the fastest of `steps` steps: other jobs on the machine only ever add time."""
        best = float("inf")
        for _ in range(steps):
            t0 = time.perf_counter()
            self.step()
            best = min(best, time.perf_counter() - t0)
        return best


def flop_ratios(cfg: ArchConfig, ref: ArchConfig, shape: Shape) -> tuple[float, float]:
    """(per-token forward FLOPs, same plus bank generation amortised over the batch) vs the reference."""
    a, r = npas.count(cfg, shape.batch, shape.seq_len), npas.count(ref, shape.batch, shape.seq_len)
    tokens = shape.batch * shape.seq_len
    return (a.flops_per_token / r.flops_per_token,
            (a.flops_per_token + a.generation_flops_per_step / tokens) / r.flops_per_token)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7, help="interleaved reference/variant rounds (default 7)")
    ap.add_argument("--steps", type=int, default=3, help="training steps per timed block; its fastest counts (default 3)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per model first (default 2)")
    ap.add_argument("--only", nargs="+", metavar="VARIANT", help="time only these variants (default: all)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2; --quick uses 1)")
    ap.add_argument("--quick", action="store_true", help="small shape, 3 rounds of 1 step, 1 thread: a smoke run")
    ap.add_argument("--batch", type=int, default=None,
                    help="sequences per batch (default 16, --quick 4); the pool-size row needs enough tokens per "
                         "expert for the routed work to outweigh the per-expert work (see the module docstring)")
    ap.add_argument("--family", choices=("classic", "llama", "both", "recursion"), default="both",
                    help="which chassis' tables to time (default both: classic with expert pools, then llama, then "
                         "per-token recursion; recursion: only that table)")
    args = ap.parse_args(argv)
    shape = QUICK if args.quick else FULL
    if args.batch is not None:
        if args.batch < 1:
            ap.error(f"--batch must be >= 1, got {args.batch}")
        shape = dataclasses.replace(shape, batch=args.batch)
    if args.quick:
        # one thread: a smoke run must not stall when other jobs hold the cores (OpenMP oversubscription)
        args.rounds, args.steps, args.warmup, args.threads = 3, 1, 1, 1
    torch.set_num_threads(args.threads)
    ch = shape.chassis
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, ch.vocab_size, (shape.batch, shape.seq_len), generator=g)
    targets = torch.randint(0, ch.vocab_size, (shape.batch, shape.seq_len), generator=g)

    ref_cfg = reference_config(ch)
    cfgs = variants(ch)
    experts = expert_variants(ch)
    cfgs.update(experts)
    cfgs.update(hashed_variants(ch))
    llama_ch = LLAMA_QUICK if args.quick else LLAMA
    llama_cfgs = {f"llama_{name}": cfg for name, cfg in variants(llama_ch).items()}
    rec_shape = RECURSION_QUICK if args.quick else RECURSION_SHAPE
    fixed_cfg, rec_cfgs = recursion_variants(rec_shape.chassis)
    if args.family in ("llama", "recursion"):
        cfgs = {}
    if args.family in ("classic", "recursion"):
        llama_cfgs = {}
    if args.family in ("classic", "llama"):
        rec_cfgs = {}
    if args.only:
        unknown = sorted(set(args.only) - set(cfgs) - set(llama_cfgs) - set(rec_cfgs))
        if unknown:
            ap.error(f"--only: unknown variants {unknown}; known: {', '.join([*cfgs, *llama_cfgs, *rec_cfgs])}")
        cfgs = {name: cfgs[name] for name in args.only if name in cfgs}
        llama_cfgs = {name: llama_cfgs[name] for name in args.only if name in llama_cfgs}
        rec_cfgs = {name: rec_cfgs[name] for name in args.only if name in rec_cfgs}
    if cfgs:
        print_sharing(ref_cfg, cfgs, experts, args, shape, idx, targets)
    if llama_cfgs:
        if cfgs:
            print()
        print_sharing(reference_config(llama_ch), llama_cfgs, {}, args, shape, idx, targets, "llama ")
    if rec_cfgs:
        if cfgs or llama_cfgs:
            print()
        print_recursion(fixed_cfg, rec_cfgs, args, rec_shape)
    return 0


def print_recursion(fixed_cfg: ArchConfig, cfgs: dict[str, ArchConfig], args: argparse.Namespace,
                    shape: Shape) -> None:
    """Per-token recursion against the fixed-depth stack of the same weights (module docstring)."""
    ch = shape.chassis
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, ch.vocab_size, (shape.batch, shape.seq_len), generator=g)
    targets = torch.randint(0, ch.vocab_size, (shape.batch, shape.seq_len), generator=g)
    ref_times, times, ratios = measure(fixed_cfg, cfgs, args, idx, targets)
    print(f"per-token recursion vs the fixed-depth stack (3 passes x 2 tied layers, d_model {ch.d_model}, d_ff "
          f"{ch.d_ff}; batch {shape.batch} x seq {shape.seq_len}; fp32, {torch.get_num_threads()} threads, AdamW; "
          f"expert-choice, per-step K/V); interleaved {args.rounds} rounds x {args.steps} steps, median paired ratio")
    print(f"{'variant':<22}{'ms/step':>9}{'ratio':>8}{'FLOP ratio':>12}{'target':>8}  result")
    print(f"{'fixed_depth':<22}{1e3 * statistics.median(ref_times):>9.1f}{1.0:>8.3f}{1.0:>12.4f}")
    fixed_flops = npas.count(fixed_cfg, shape.batch, shape.seq_len).flops_per_token
    for name, cfg in cfgs.items():
        ratio = statistics.median(ratios[name])
        target = TARGET if name == "mor_capacity_1" else RECURSION_TARGET
        fr = npas.count(cfg, shape.batch, shape.seq_len).flops_per_token / fixed_flops
        print(f"{name:<22}{1e3 * statistics.median(times[name]):>9.1f}{ratio:>8.3f}{fr:>12.4f}{target:>8.2f}  "
              f"{'PASS' if ratio <= target else 'MISS'}  {cfg.summary()}")


def measure(ref_cfg: ArchConfig, cfgs: dict[str, ArchConfig], args: argparse.Namespace, idx: torch.Tensor,
            targets: torch.Tensor) -> tuple[list[float], dict[str, list[float]], dict[str, list[float]]]:
    """(reference block times, each variant's block times, paired variant/reference ratios), interleaved."""
    ref = Runner(ref_cfg, idx, targets)
    runs = {name: Runner(cfg, idx, targets) for name, cfg in cfgs.items()}
    for r in (ref, *runs.values()):
        for _ in range(args.warmup):
            r.step()
    ref_times: list[float] = []
    times: dict[str, list[float]] = {name: [] for name in runs}
    ratios: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            t_ref = ref.time(args.steps)
            t_var = run.time(args.steps)
            ref_times.append(t_ref)
            times[name].append(t_var)
            ratios[name].append(t_var / t_ref)
    return ref_times, times, ratios


def print_sharing(ref_cfg: ArchConfig, cfgs: dict[str, ArchConfig], experts: dict[str, ArchConfig],
                  args: argparse.Namespace, shape: Shape, idx: torch.Tensor, targets: torch.Tensor,
                  label: str = "") -> None:
    """Time `cfgs` against `ref_cfg` and print the sharing table (and the expert table, if any).
    `label` ("llama ") prefixes the reference row and the result line of a second chassis' table."""
    ch = ref_cfg.chassis
    ref_times, times, ratios = measure(ref_cfg, cfgs, args, idx, targets)
    w = max(22, max(len(n) for n in cfgs) + 2)  # the classic table keeps its 22 columns
    ref_acc = npas.count(ref_cfg, shape.batch, shape.seq_len)
    family = (f"llama chassis: RMSNorm, rotary, {ch.activation}, {ch.kv_heads} K/V heads; " if ch.llama else "")
    print(f"npas bench: training-step overhead of sharing vs the dense {label}reference "
          f"({family}d_model {ch.d_model}, {ch.n_layers} layers, {ch.n_heads} heads, d_ff {ch.d_ff}, vocab {ch.vocab_size}; "
          f"batch {shape.batch} x seq {shape.seq_len}; fp32, {torch.get_num_threads()} threads, AdamW)")
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores (other jobs skew absolute times; "
          f"the paired ratios less so)")
    print(f"interleaved {args.rounds} rounds x {args.steps} steps per block (fastest step counts); ratio = median of paired "
          f"variant/reference ratios; target <= {TARGET:.2f}x (hashed_*: {HASH_TARGET:.2f}x)")
    print(f"{'variant':<{w}}{'ms/step':>9}{'ratio':>8}{'FLOP ratio':>12}{'+gen':>8}{'stored':>11}  result")
    print(f"{label.replace(' ', '_') + 'reference':<{w}}{1e3 * statistics.median(ref_times):>9.1f}{1.0:>8.3f}{1.0:>12.4f}{1.0:>8.4f}"
          f"{ref_acc.stored_params:>11,}")
    misses = []
    sharing = {n: c for n, c in cfgs.items() if n not in experts}
    for name, cfg in sharing.items():
        ratio = statistics.median(ratios[name])
        fr, fr_gen = flop_ratios(cfg, ref_cfg, shape)
        ok = ratio <= (HASH_TARGET if name.startswith("hashed_") else TARGET)
        if not ok:
            misses.append(name)
        print(f"{name:<{w}}{1e3 * statistics.median(times[name]):>9.1f}{ratio:>8.3f}{fr:>12.4f}{fr_gen:>8.4f}"
              f"{npas.count(cfg).stored_params:>11,}  {'PASS' if ok else 'MISS'}  {cfg.summary()}")
    if sharing:
        print(f"{label}result: {len(sharing) - len(misses)}/{len(sharing)} variants within {TARGET:.2f}x of the "
              f"{label}reference (hashed_*: {HASH_TARGET:.2f}x)" + (f"; MISS: {', '.join(misses)}" if misses else ""))
    shared = [n for n in cfgs if n.endswith(tuple(f"_{m}8" for m in LORA_SHARING_KW))]
    private = next((n for n in cfgs if n.endswith("relaxed_cycle_lora8")), None)
    if shared and private:
        print_lora_sharing(shared, private, ratios)
    timed = {n: c for n, c in cfgs.items() if n in experts}
    if timed:
        print_experts(timed, ratios, times, ref_cfg, shape)


def print_lora_sharing(shared: list[str], private: str, ratios: dict[str, list[float]]) -> None:
    """Each shared-LoRA variant's step time against private LoRA of equal rank: both are paired with the same
    reference blocks, so the quotient of their median ratios cancels the machine's drift."""
    base = statistics.median(ratios[private])
    for name in shared:
        r = statistics.median(ratios[name]) / base
        print(f"{name} vs {private} (equal rank): {r:.3f}x the step time (target <= {TARGET:.2f}x) "
              f"{'PASS' if r <= TARGET else 'MISS'}")


def print_experts(cfgs: dict[str, ArchConfig], ratios: dict[str, list[float]], times: dict[str, list[float]],
                  ref_cfg: ArchConfig, shape: Shape) -> None:
    """The expert pools' table: ratio to the dense model of equal activated FLOPs, and pool-size scaling."""
    print(f"\nexpert pools (k experts of width d_ff/k: activated FLOPs = the reference's + routers); "
          f"target <= {EXPERT_TARGET:.2f}x the dense reference")
    print(f"{'variant':<22}{'ms/step':>9}{'ratio':>8}{'FLOP ratio':>12}{'activated':>11}{'stored':>11}  result")
    for name, cfg in cfgs.items():
        ratio = statistics.median(ratios[name])
        acc = npas.count(cfg)
        fr, _ = flop_ratios(cfg, ref_cfg, shape)
        print(f"{name:<22}{1e3 * statistics.median(times[name]):>9.1f}{ratio:>8.3f}{fr:>12.4f}"
              f"{acc.activated_params:>11,}{acc.stored_params:>11,}  {'PASS' if ratio <= EXPERT_TARGET else 'MISS'}"
              f"  {cfg.summary()}")
    if {"experts_global_k1", "experts_global4x_k1"} <= set(cfgs):
        # both ratios are paired with the same reference blocks: their quotient cancels the machine's drift
        pool = statistics.median(ratios["experts_global4x_k1"]) / statistics.median(ratios["experts_global_k1"])
        rows = shape.batch * shape.seq_len * cfgs["experts_global_k1"].experts.top_k
        sizes = [cfgs[n].experts.pool_sizes[0] for n in ("experts_global_k1", "experts_global4x_k1")]
        print(f"pool size: global pool 4x larger at the same k = {pool:.3f}x the step time "
              f"(target <= {POOL_SIZE_TARGET:.2f}x) {'PASS' if pool <= POOL_SIZE_TARGET else 'MISS'}")
        print(f"  at {rows / sizes[0]:.0f} vs {rows / sizes[1]:.0f} rows an expert a layer (--batch sets them)")
    if {"experts_global_k1", "experts_global_k2"} <= set(cfgs):
        k2 = statistics.median(ratios["experts_global_k2"]) / statistics.median(ratios["experts_global_k1"])
        print(f"top-k: k=2 (experts half as wide, same FLOPs) = {k2:.3f}x the step time of k=1")


if __name__ == "__main__":
    sys.exit(main())
