"""npas's proxy loop on a CUDA GPU: throughput, bf16 MFU and measured peak memory against the estimate.

The CPU twin is ``benchmarks/proxy_efficiency.py``. This one needs a GPU (it exits 2 without one) and prints,
in one run:
  1. the bf16 matrix-product rate of this GPU (8192^3, mean of timed products) beside the datasheet's
     dense bf16 peak (H100/H200 SXM: 989 TFLOP/s);
  2. for the shipped chassis (``search_spaces/full.yaml``'s reference model) and for d_model 512 and
     1024 x 8 layers at 65,536 tokens per step: npas's own proxy loop (``train_model``) in bf16
     autocast, tokens/s in the steady state (timed after warm-up steps), model FLOPs utilisation
     (training FLOPs = 3 x forward FLOPs from ``npas.count``) against the datasheet peak, and
     ``torch.cuda.max_memory_allocated`` against ``npas.count(...).train_memory_bytes``;
  3. the same at d_model 1024 with the model compiled (``torch.compile``), when it compiles.

Targets (issue "search at scale"): bf16 MFU >= 25% at d_model 1024; measured peak memory within 25%
of the estimate at d_model >= 512.

    python benchmarks/gpu_efficiency.py [--json PATH] [--no-compile]
    python benchmarks/gpu_efficiency.py --recheck benchmarks/results/gpu_efficiency_h200.json
        (here, no GPU: the memory verdict of a saved run against today's estimate)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import npas  # noqa: E402
from npas import (  # noqa: E402
    Chassis,
    Recipe,  # noqa: E402
    reference_config,
)

DATASHEET_BF16 = 989e12  # dense bf16 FLOP/s of an H100/H200 SXM (no sparsity)
TARGET_MFU, TARGET_MEM = 0.25, 0.25
STEPS, WARMUP = 30, 10


def matmul_rate(n: int = 8192, reps: int = 10) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * reps / (time.perf_counter() - t)


def shipped_chassis() -> Chassis:
    """full.yaml's reference chassis, read from the file (its chassis values are all fixed); the space
    loader would import optuna, which a bare GPU machine does not have."""
    import yaml

    data = yaml.safe_load((ROOT / "npas" / "builtin" / "spaces" / "full.yaml").read_text())["chassis"]
    return Chassis(**{k: v for k, v in data.items() if not isinstance(v, (list, dict))})


def measure(name: str, chassis: Chassis, batch: int, seq: int, compile_model: bool = False,
            dtype: str = "bfloat16", device: str = "cuda") -> dict:
    """Steady-state tokens/s of npas's training step (the proxy loop's own body) and its peak memory."""
    from npas import build_model
    from npas.training.parameterization import apply_init
    from npas.training.proxy import autocast_for, make_optimizer

    cfg = reference_config(chassis)
    recipe = Recipe(name="gpu-eff", seq_len=seq, batch_size=batch, steps=STEPS + WARMUP, warmup_steps=1,
                    eval_every=STEPS + WARMUP, eval_batches=1, dtype=dtype)
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    acc = npas.count(cfg, batch_size=batch, seq_len=seq, device=dev.type, autocast=dtype)
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    torch.manual_seed(0)
    model = build_model(cfg).float()
    apply_init(model, recipe.parameterization)
    model = model.to(dev).train()
    opt = make_optimizer(model, recipe, dev)
    params = [p for g in opt.param_groups for p in g["params"]]
    fwd = torch.compile(model) if compile_model else model
    x = torch.randint(0, chassis.vocab_size, (batch, seq + 1), device=dev)
    amp = autocast_for(dev, recipe)
    t_compile = time.perf_counter()

    def step() -> torch.Tensor:
        with amp:
            _, loss = fwd(x[:, :-1], x[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    steps, warmup = (STEPS, WARMUP) if cuda else (2, 1)  # CPU: a smoke run of the code path only
    for _ in range(warmup):
        step()
    sync()
    t_compile = time.perf_counter() - t_compile
    t = time.perf_counter()
    for _ in range(steps):
        loss = step()
    sync()
    dt = (time.perf_counter() - t) / steps
    tok_s = batch * seq / dt
    flops = 3 * acc.flops_per_token
    peak = torch.cuda.max_memory_allocated(dev) if cuda else acc.train_memory_bytes
    row = {"name": name, "chassis": chassis.to_dict(), "batch": batch, "seq_len": seq, "tokens_per_step": batch * seq,
           "dtype": dtype, "compiled": compile_model, "params": acc.stored_params, "step_s": dt, "tokens_per_s": tok_s,
           "train_flops_per_token": flops, "tflops": tok_s * flops / 1e12, "mfu_datasheet": tok_s * flops / DATASHEET_BF16,
           "peak_bytes": peak, "estimate_bytes": acc.train_memory_bytes, "estimate_activation_bytes": acc.activation_bytes,
           "peak_over_estimate": peak / acc.train_memory_bytes, "warmup_s": t_compile, "final_loss": float(loss.detach())}
    return row  # the model and optimizer go with this frame; the next row empties the cache first


def recheck(path: Path) -> int:
    """The measured peaks of a saved run against ``npas.count``'s estimate as the code is now."""
    saved = json.loads(path.read_text())
    print(f"[gpu_efficiency --recheck] {path} ({saved['device']}, torch {saved['torch']})")
    worst = 0.0
    for r in saved["rows"]:
        if "error" in r:
            continue
        acc = npas.count(reference_config(Chassis(**r["chassis"])), batch_size=r["batch"], seq_len=r["seq_len"],
                         device="cuda", autocast=r["dtype"])
        ratio = r["peak_bytes"] / acc.train_memory_bytes
        if r["chassis"]["d_model"] >= 512:
            worst = max(worst, abs(ratio - 1))
        print(f"  {r['name']:15s} measured {r['peak_bytes'] / 2**30:6.2f} GiB, estimate now "
              f"{acc.train_memory_bytes / 2**30:6.2f} GiB (x{ratio:.2f}; at the run: x{r['peak_over_estimate']:.2f})")
    print(f"target peak memory within {TARGET_MEM:.0%} of the estimate at d_model >= 512: worst {worst:.0%} off "
          f"{'PASS' if worst <= TARGET_MEM else 'MISS'} (re-estimated from the saved measurements)")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path, default=None, help="write the rows here")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile row")
    p.add_argument("--cpu-smoke", action="store_true", help="run the code path on the CPU at toy sizes (tests)")
    p.add_argument("--recheck", type=Path, default=None, help="a saved --json: re-estimate its rows' memory")
    a = p.parse_args(argv)
    if a.recheck:
        return recheck(a.recheck)
    if a.cpu_smoke:
        small = Chassis(vocab_size=68, context=32, d_model=32, n_layers=2, n_heads=2, d_ff=64)
        rows = [measure("smoke", small, 2, 16, False, "float32", device="cpu")]
        print(json.dumps(rows[0], default=str))
        return 0
    if not torch.cuda.is_available():
        print("gpu_efficiency: no CUDA device here; run it on a GPU machine", file=sys.stderr)
        return 2
    print(f"[gpu_efficiency] {torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    rate = matmul_rate()
    print(f"bf16 8192^3 matmul: {rate / 1e12:.0f} TFLOP/s measured, {DATASHEET_BF16 / 1e12:.0f} datasheet", flush=True)
    shipped = shipped_chassis()
    big = {w: Chassis(vocab_size=shipped.vocab_size, context=256, d_model=w, n_layers=8, n_heads=w // 64, d_ff=4 * w)
           for w in (512, 1024)}
    plan = [("shipped", shipped, 48, 64, False, "bfloat16"),
            ("d512", big[512], 256, 256, False, "bfloat16"),
            ("d1024", big[1024], 256, 256, False, "bfloat16"),
            ("d1024-fp32", big[1024], 256, 256, False, "float32")]
    if not a.no_compile:
        plan.append(("d1024-compiled", big[1024], 256, 256, True, "bfloat16"))
    rows = []
    for name, ch, b, t, comp, dt in plan:
        try:
            r = measure(name, ch, b, t, comp, dt)
        except Exception as err:  # one failing row (a compile error, an OOM) must not lose the others
            print(f"  {name}: FAILED {type(err).__name__}: {str(err).splitlines()[0][:200]}", flush=True)
            rows.append({"name": name, "error": f"{type(err).__name__}: {err}"[:500]})
            continue
        rows.append(r)
        print(f"  {name:15s} {r['params'] / 1e6:7.1f}M params {r['tokens_per_step']:>6} tok/step {r['dtype']:8s} "
              f"{r['tokens_per_s'] / 1e6:7.2f}M tok/s {r['tflops']:6.0f} TFLOP/s MFU {r['mfu_datasheet']:6.1%} | "
              f"peak {r['peak_bytes'] / 2**30:6.2f} GiB est {r['estimate_bytes'] / 2**30:6.2f} GiB "
              f"(x{r['peak_over_estimate']:.2f}) warm-up {r['warmup_s']:.1f} s", flush=True)
    ok = [r for r in rows if "error" not in r]
    d1024 = [r for r in ok if r["chassis"]["d_model"] == 1024 and r["dtype"] == "bfloat16"]
    best = max((r["mfu_datasheet"] for r in d1024), default=math.nan)
    print(f"target bf16 MFU >= {TARGET_MFU:.0%} at d_model 1024: best {best:.1%} "
          f"{'PASS' if best >= TARGET_MFU else 'MISS'}")
    mem = [r for r in ok if r["chassis"]["d_model"] >= 512]
    worst = max((abs(r["peak_over_estimate"] - 1) for r in mem), default=math.nan)
    print(f"target peak memory within {TARGET_MEM:.0%} of the estimate at d_model >= 512: worst "
          f"{worst:.0%} off {'PASS' if worst <= TARGET_MEM else 'MISS'}")
    if a.json:
        a.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                      "matmul_bf16_flops": rate, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
