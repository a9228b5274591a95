"""`npas convert DENSE_DIR --to ALLOC.yaml --out DIR`: start an allocation from a model you trained.

Only this module prints; the work lives in ``npas.conversion`` so the Python API does the same thing.
"""

from __future__ import annotations

import argparse

from npas.presentation.cli.args import SEED


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("convert", help="convert a model written by `npas train` into an allocation, "
                       "weights derived from it (tying, LoRA, banks, widths)")
    p.add_argument("dense_dir", help="the --out directory of `npas train` (e.g. the untied reference)")
    p.add_argument("--to", required=True, dest="alloc", help="allocation YAML, e.g. from `npas export`")
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
    p.set_defaults(func=run_convert)


def run_convert(args: argparse.Namespace) -> int:
    from npas.conversion.directory import convert_dir

    res = convert_dir(args.dense_dir, args.alloc, args.out, tie_init=args.tie_init, data=args.data,
                      force=args.force, device=args.device, seed=args.seed)
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
    print(f"val_loss before training {res.val_loss:.4f} nats (source {src}); wrote {res.out}/ "
          f"(model.safetensors, tokenizer.json, config.yaml, metrics.json, provenance.json); try "
          f"`npas sample {res.out}`, or continue training from these weights with `npas train {res.out}`")
    return 0
