"""`npas train CONFIG.yaml` and `npas sample DIR`: train an exported allocation for real, then use it.

Only this module prints; the work lives in ``npas.training.train`` so the Python API does the same thing.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from npas.errors import ConfigError, NpasError, TrialError
from npas.files import read_text
from npas.presentation.cli.args import COUNT_MAX, POSITIVE, SEED, add_data_args, int_in, temperature
from npas.service.runner import RUNS_DIR

DEFAULT_RECIPE = "long"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train an exported allocation and save it (safetensors + tokenizer.json)")
    p.add_argument("config", help="allocation YAML, e.g. from `npas export NAME --out best.yaml`")
    p.add_argument("--recipe", default=DEFAULT_RECIPE,
                   help=f"recipe name in trials/ or a YAML path (default: {DEFAULT_RECIPE})")
    add_data_args(p, default_note="the recipe's data, else bundled Shakespeare; --tokenizer defaults to "
                  "the tokenizer.json `npas export` wrote beside CONFIG, else char")
    p.add_argument("--out", default=None, help="output directory (default: trials/runs/train-<hash>)")
    p.add_argument("--steps", type=POSITIVE, default=None, help="override the recipe's steps")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    p.add_argument("--force", action="store_true", help="overwrite a directory that already holds a model")
    p.set_defaults(func=run_train)

    s = sub.add_parser("sample", help="generate text from a model written by `npas train`")
    s.add_argument("model_dir", help="the --out directory of `npas train`")
    s.add_argument("--prompt", default="\n", help="text to continue (characters must be in the vocabulary)")
    s.add_argument("--tokens", type=int_in(0, COUNT_MAX, 300), default=300,
                   help="tokens to generate (default: 300)")
    s.add_argument("--temperature", type=temperature, default=0.8, help="0 = greedy; higher = more varied")
    s.add_argument("--seed", type=SEED, default=0, help="sampling seed, for reproducible output")
    s.add_argument("--device", default="cpu", help="device to sample on (default: cpu)")
    s.set_defaults(func=run_sample)


def run_train(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from npas.allocation.config import ArchConfig
    from npas.training.data import load_corpus
    from npas.training.recipe import load_recipe
    from npas.training.train import MODEL_FILE, train_allocation

    path = Path(args.config)
    if not path.is_file():
        raise ConfigError(f"allocation file {path} does not exist; write one with "
                          "`npas export NAME --out best.yaml`")
    cfg = ArchConfig.from_yaml(read_text(path, "allocation file"))
    recipe = load_recipe(args.recipe)
    if args.steps is not None:
        recipe = recipe.with_steps(args.steps)
    from npas.training.corpora import DEFAULT_GLOB, DEFAULT_TEXT_FIELD
    from npas.training.train import exported_tokenizer

    tokenizer = args.tokenizer or exported_tokenizer(path)
    corpus = load_corpus(args.data if args.data is not None else recipe.data, val_fraction=recipe.val_fraction,
                         test_fraction=recipe.test_fraction, tokenizer=tokenizer,
                         glob=args.data_glob or DEFAULT_GLOB, text_field=args.text_field or DEFAULT_TEXT_FIELD)
    from npas.training.proxy import check_compatible

    check_compatible(cfg, recipe, corpus)  # one line before the progress bar and the output directory
    out = Path(args.out) if args.out else RUNS_DIR / f"train-{cfg.hash}"
    if (out / MODEL_FILE).exists() and not args.force:
        raise NpasError(f"{out} already holds a trained model; pass --force to overwrite or choose another --out")

    from npas.allocation.budget import count

    acc = count(cfg)
    print(f"training {cfg.hash} ({cfg.summary()}, {acc.stored_params:,} params) on {corpus.source}, "
          f"recipe {recipe.name}: {recipe.steps} steps x {recipe.tokens_per_step:,} tokens -> {out}")
    bar = tqdm(total=recipe.steps, unit="step", dynamic_ncols=True, file=sys.stderr)
    post: dict[str, str] = {}

    def progress(step: int, loss: float, tok_s: float) -> None:
        bar.update(step - bar.n)
        post.update({"loss": f"{loss:.3f}", "tok/s": f"{tok_s:,.0f}"})
        bar.set_postfix(post, refresh=True)

    def report(step: int, val_loss: float) -> bool:
        post["val"] = f"{val_loss:.3f}"
        bar.set_postfix(post, refresh=True)
        return False

    try:
        result = train_allocation(cfg, recipe, corpus, out, device=args.device, progress=progress, report=report)
    finally:
        bar.close()
    if result.status == "failed":
        raise TrialError(f"training failed: {result.failure_reason}; metrics in {out / 'metrics.json'}")
    print(f"{result.status}: val_loss {result.val_loss:.4f} nats/token ({result.val_bpb:.3f} bits/byte), "
          f"{result.steps_done} steps, {result.tokens_per_s:,.0f} tokens/s, {result.wall_s:.1f} s")
    print(f"wrote {out}/ (model.safetensors, tokenizer.json, config.yaml, metrics.json); try "
          f"`npas sample {out} --prompt 'ROMEO:'`")
    return 0


def run_sample(args: argparse.Namespace) -> int:
    from npas.training.train import load_trained, sample

    if not math.isfinite(args.temperature) or args.temperature < 0:
        raise ConfigError(f"--temperature must be a number >= 0 (0 = greedy), got {args.temperature}")
    model, tokenizer, _ = load_trained(args.model_dir, device=args.device)
    text = sample(model, tokenizer, args.prompt, tokens=args.tokens, temperature=args.temperature,
                  seed=args.seed)
    print(args.prompt + text)
    return 0
