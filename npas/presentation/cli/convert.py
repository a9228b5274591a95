"""`npas convert DENSE_DIR --to ALLOC.yaml --out DIR`: start an allocation from a model you trained.

Only this module prints; the work lives in ``npas.conversion`` so the Python API does the same thing.
"""

from __future__ import annotations

import argparse

from npas.presentation.cli.args import SEED


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("convert", help="convert a model written by `npas train` into an allocation, "
                       "weights derived from it (tying, LoRA, banks, widths)")
    p.add_argument("dense_dir", help="the --out directory of `npas train` (e.g. the untied reference), or a "
                   "Hugging Face save_pretrained directory of a LlamaForCausalLM (config.json + safetensors)")
    p.add_argument("--to", default=None, dest="alloc", help="allocation YAML, e.g. from `npas export`; optional for "
                   "a Hugging Face directory (default: its identity allocation, whose config.yaml is the starting "
                   "point for others)")
    p.add_argument("--out", required=True, help="output directory (a `npas train`-style model directory; "
                   "`npas train OUT` continues from its weights)")
    p.add_argument("--tie-init", choices=("auto", "average", "stepwise"), default="auto",
                   help="shared weights: mean of the layers that use them (average), the first such layer's "
                        "(stepwise), or auto: average where LoRA relaxes them, else stepwise")
    p.add_argument("--data", default=None, help="text the source was trained on, when its recorded path moved")
    p.add_argument("--seed", type=SEED, default=0, help="seed for the few elements initialised fresh")
    p.add_argument("--device", default="cpu", help="device for the validation pass (default: cpu)")
    p.add_argument("--force", action="store_true", help="overwrite a directory that already holds a model")
    p.add_argument("--quiet", action="store_true", help="print the provenance summary, not every tensor")
    p.add_argument("--format", choices=("npas", "hf"), default="npas", dest="fmt",
                   help="npas: a `npas train`-style directory; hf: a Hugging Face checkpoint that "
                        "AutoModelForCausalLM.from_pretrained loads once npas is imported (needs npas[hf])")
    p.add_argument("--unroll", action="store_true", help="with --format hf: write a stock LlamaForCausalLM, "
                   "shared weights materialised per layer (loads without npas)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                   help="weights' dtype of a Hugging Face source's output (default: the source's)")
    p.set_defaults(func=run_convert)


def run_convert(args: argparse.Namespace) -> int:
    from npas.conversion.hf_convert import check_format
    from npas.conversion.hf_source import is_hf_dir
    from npas.errors import ConfigError

    check_format(args.fmt, args.unroll)  # before any work: --unroll without hf, transformers missing
    if is_hf_dir(args.dense_dir):
        return _run_convert_hf(args)
    if args.alloc is None:
        raise ConfigError(f"--to is required to convert {args.dense_dir} (an npas model directory); pass an "
                          "allocation YAML, e.g. from `npas export NAME --out best.yaml`")
    if args.dtype is not None:
        raise ConfigError("--dtype applies to a Hugging Face source; set dtype in the allocation file instead")
    from npas.conversion.directory import convert_dir, read_allocation
    from npas.conversion.hf_convert import check_output

    if args.fmt == "hf":  # before convert_dir writes --out
        check_output(read_allocation(args.alloc), args.fmt, args.unroll)
    res = convert_dir(args.dense_dir, args.alloc, args.out, tie_init=args.tie_init, data=args.data,
                      force=args.force, device=args.device, seed=args.seed)
    written = None
    if args.fmt == "hf":
        from npas.conversion.hf_convert import reformat_dir

        written = reformat_dir(res.out, args.unroll)
    _report(args, res, written)
    return 0


def _run_convert_hf(args: argparse.Namespace) -> int:
    from npas.conversion.hf_convert import convert_hf_dir

    res = convert_hf_dir(args.dense_dir, args.alloc, args.out, tie_init=args.tie_init, data=args.data,
                         force=args.force, seed=args.seed, fmt=args.fmt, unroll=args.unroll, dtype=args.dtype)
    if res.note is not None:
        print(f"no loss pass: {res.note}; the conversion is written without a validation loss")
    _report(args, res, res.written)
    return 0


def _report(args: argparse.Namespace, res, written: dict | None) -> None:
    conv = res.conversion
    if not args.quiet:
        print("provenance (tensor, kind, how <- source tensors):")
        for line in conv.provenance.lines():
            print("  " + line)
    counts = conv.provenance.counts()
    src = "-" if res.source_val_loss is None else f"{res.source_val_loss:.4f}"
    n = sum(p.numel() for p in conv.model.parameters())
    print(f"converted {args.dense_dir} -> {conv.cfg.hash} ({conv.cfg.summary()}, {n:,} params): "
          f"{counts['derived']} tensors derived, {counts['partly fresh']} partly fresh, {counts['fresh']} fresh")
    if written is not None:
        kind = "stock LlamaForCausalLM" if written["kind"] == "llama" else "npas model type (import npas first)"
        print(f"wrote {res.out}/ as a Hugging Face checkpoint ({kind}): {written['params']:,} stored params, "
              f"{written['bytes'] / 2**20:.2f} MiB of weights; load it with "
              f"AutoModelForCausalLM.from_pretrained({str(res.out)!r})")
        return
    val = "-" if res.val_loss != res.val_loss else f"{res.val_loss:.4f}"
    print(f"val_loss before training {val} nats (source {src}); wrote {res.out}/ "
          f"(model.safetensors, tokenizer.json, config.yaml, metrics.json, provenance.json); try "
          f"`npas sample {res.out}`, or continue training from these weights with `npas train {res.out}`")
