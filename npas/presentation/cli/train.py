"""`npas train CONFIG.yaml|MODEL_DIR` and `npas sample DIR`: train an exported allocation for real (or
continue a trained or converted model), then use it.

Only this module prints; the work lives in ``npas.training.train`` so the Python API does the same thing.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from npas.errors import ConfigError, NpasError, TrialError
from npas.presentation.cli.args import COUNT_MAX, POSITIVE, SEED, add_data_args, int_in, temperature
from npas.service.execution.session import RUNS_DIR

DEFAULT_RECIPE = "long"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train an exported allocation, or continue a trained or converted model, and "
                       "save it (safetensors + tokenizer.json)")
    p.add_argument("config", help="allocation YAML, e.g. from `npas export NAME --out best.yaml` (fresh init), or "
                   "a model directory from `npas train --out` / `npas convert --out` (continues from its weights)")
    p.add_argument("--recipe", default=DEFAULT_RECIPE,
                   help=f"recipe name in trials/ or a YAML path (default: {DEFAULT_RECIPE})")
    add_data_args(p, default_note="a model directory's own text, else the recipe's data, else bundled Shakespeare; "
                  "--tokenizer defaults to a model directory's tokenizer.json or the one `npas export` wrote "
                  "beside CONFIG, else char")
    p.add_argument("--out", default=None, help="output directory (default: trials/runs/train-<hash>, or "
                   "train-<hash>-from-<weights> when continuing a model directory)")
    p.add_argument("--steps", type=POSITIVE, default=None, help="override the recipe's steps")
    p.add_argument("--lr-factor", type=lr_factor_arg, default=None, metavar="X|located",
                   help="train at X times the recipe's fair learning rate (whole schedule, every parameter group); "
                        "default: the factor the export (or the model directory) records, when --recipe has the "
                        "rate it was located (or trained) under, else 1; `located`: that factor whatever the recipe")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    p.add_argument("--force", action="store_true", help="overwrite a directory that already holds a model")
    p.add_argument("--format", choices=("npas", "hf"), default="npas", dest="fmt",
                   help="npas: model.safetensors + config.yaml (continuable with `npas train DIR`); hf: a Hugging "
                        "Face checkpoint AutoModelForCausalLM.from_pretrained loads (needs npas[hf]); a plain dense "
                        "llama allocation is a stock LlamaForCausalLM")
    p.add_argument("--unroll", action="store_true", help="with --format hf: any llama allocation as a stock "
                   "LlamaForCausalLM, shared weights materialised per layer")
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


def lr_factor_arg(text: str) -> float | str:
    from npas.training.lr_factor import LOCATED, LR_FACTOR_RANGE, check_lr_factor

    if text == LOCATED:
        return LOCATED
    try:
        return check_lr_factor(float(text), "--lr-factor")
    except (ValueError, NpasError):
        raise argparse.ArgumentTypeError(f"must be {LR_FACTOR_RANGE}, or `located`, got {text!r}") from None


def run_train(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from npas.conversion.hf_convert import check_format
    from npas.training.lr_factor import LOCATED, choose_factor
    from npas.training.recipe import load_recipe
    from npas.training.train import MODEL_FILE, train_allocation

    check_format(getattr(args, "fmt", "npas"), getattr(args, "unroll", False))  # before any work
    path = Path(args.config)
    recipe = load_recipe(args.recipe)
    if args.steps is not None:
        recipe = recipe.with_steps(args.steps)
    requested = getattr(args, "lr_factor", None)
    if path.is_dir():  # a trained or converted model: continue from its weights
        cfg, corpus, reference, start, what = _continue_from(path, recipe, args)
        lr_factor, note = choose_factor(start.lr_factor, start.recipe, recipe, requested, str(path / "metrics.json"))
    else:
        cfg, corpus, reference, what, alloc = _from_allocation(path, recipe, args)
        start = None
        lr_factor, note = choose_factor(alloc.lr_factor, alloc.located_under, recipe, requested, str(path))
    from npas.training.proxy import check_compatible

    check_compatible(cfg, recipe, corpus, padded=start is not None)  # one line before the progress bar and --out
    from npas.conversion.hf_convert import check_output

    check_output(cfg, getattr(args, "fmt", "npas"), getattr(args, "unroll", False))  # not after training
    out = Path(args.out) if args.out else RUNS_DIR / f"train-{cfg.hash}"
    if start is not None and not args.out:  # never the source's own default directory: keep what it continues
        from npas.conversion.directory import fingerprint_weights

        out = RUNS_DIR / f"train-{cfg.hash}-from-{fingerprint_weights(start.dir)[:8]}"
    if (out / MODEL_FILE).exists() and not args.force:
        raise NpasError(f"{out} already holds a trained model; pass --force to overwrite or choose another --out")

    from npas.allocation.budget import count

    if note:  # after every refusal: a refused run prints its one line only
        print(f"npas train: note: {note}", file=sys.stderr)
    acc = count(cfg)
    rate = "" if lr_factor == 1.0 else (f", at lr_factor {lr_factor:g} x its fair rate"
                                          + (" (--lr-factor)" if requested not in (None, LOCATED)
                                             else " (located by the search)" if start is None else " (as trained)"))
    print(f"training {cfg.hash} ({cfg.summary()}, {acc.stored_params:,} params){what} on {corpus.source}, "
          f"{recipe.describe()}{rate} -> {out}")
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
        result = train_allocation(cfg, recipe, corpus, out, device=args.device, progress=progress, report=report,
                                  reference=reference, init_state=None if start is None else start.state,
                                  started_from=None if start is None else start.dir.resolve(), lr_factor=lr_factor)
    finally:
        bar.close()
    if result.status == "failed":
        raise TrialError(f"training failed: {result.failure_reason}; metrics in {out / 'metrics.json'}")
    print(f"{result.status}: val_loss {result.val_loss:.4f} nats/token ({result.val_bpb:.3f} bits/byte), "
          f"{result.steps_done} steps, {result.tokens_per_s:,.0f} tokens/s, {result.wall_s:.1f} s")
    if getattr(args, "fmt", "npas") == "hf":
        from npas.conversion.hf_convert import reformat_dir

        written = reformat_dir(out, args.unroll)
        kind = "stock LlamaForCausalLM" if written["kind"] == "llama" else "npas model type (import npas first)"
        further = f", or convert it with `npas convert {out} --out DIR`" if written["kind"] == "llama" else ""
        print(f"wrote {out}/ as a Hugging Face checkpoint ({kind}): {written['params']:,} stored params, "
              f"{written['bytes'] / 2**20:.2f} MiB of weights; load it with "
              f"AutoModelForCausalLM.from_pretrained({str(out)!r}){further}")
        return 0
    print(f"wrote {out}/ (model.safetensors, tokenizer.json, config.yaml, metrics.json); try "
          f"`npas sample {out} --prompt 'ROMEO:'`")
    return 0


def _load_corpus(args: argparse.Namespace, recipe, data, tokenizer, glob=None, text_field=None):
    from npas.training.corpora import DEFAULT_GLOB, DEFAULT_TEXT_FIELD
    from npas.training.data import load_corpus

    return load_corpus(data, val_fraction=recipe.val_fraction, test_fraction=recipe.test_fraction,
                       tokenizer=tokenizer, glob=args.data_glob or glob or DEFAULT_GLOB,
                       text_field=args.text_field or text_field or DEFAULT_TEXT_FIELD)


def _from_allocation(path: Path, recipe, args: argparse.Namespace):
    """An allocation file: fresh init, scaled against the reference chassis its export records, so an
    exported trial trains as its search trained it."""
    from npas.training.train import exported_tokenizer, read_allocation_file

    alloc = read_allocation_file(path)
    if alloc.exported and alloc.reference is None:
        print(f"npas train: note: {path} was exported before npas recorded the search's reference chassis; "
              f"scaling learning rates and init against its own chassis instead (a narrowed d_model then trains "
              f"unlike its trial); export it again to match the search", file=sys.stderr)
    tokenizer = args.tokenizer or exported_tokenizer(path)
    corpus = _load_corpus(args, recipe, args.data if args.data is not None else recipe.data, tokenizer)
    return alloc.cfg, corpus, alloc.reference, "", alloc


def _continue_from(path: Path, recipe, args: argparse.Namespace):
    """A model directory (`npas train --out`, `npas convert --out`): its weights, its tokenizer, its
    reference chassis and, unless --data says otherwise, the text it was trained on."""
    from npas.training.data import is_bundled
    from npas.training.train import load_start

    start = load_start(path)
    recorded = start.data.get("source")
    if args.data is not None:
        data = args.data
    elif recorded is None:  # a directory that does not say what it was trained on
        data = recipe.data
    else:
        data = None if is_bundled(recorded) else recorded
    if args.tokenizer is not None:  # it must be the model's own: its embeddings index those tokens
        corpus = _load_corpus(args, recipe, data, args.tokenizer, start.data.get("glob"),
                              start.data.get("text_field"))
        if corpus.tokenizer.fingerprint != start.tokenizer.fingerprint:
            raise ConfigError(f"--tokenizer {args.tokenizer} is not the tokenizer the model in {path} reads "
                              f"({start.tokenizer.name}); drop --tokenizer to use its tokenizer.json")
    else:
        corpus = _load_corpus(args, recipe, data, start.tokenizer, start.data.get("glob"),
                              start.data.get("text_field"))
    loss = "" if start.val_loss is None else f", val_loss {start.val_loss:.4f} before training"
    return start.cfg, corpus, start.reference, start, f" from the weights in {path}{loss}"


def run_sample(args: argparse.Namespace) -> int:
    from npas.training.train import load_trained, sample

    if not math.isfinite(args.temperature) or args.temperature < 0:
        raise ConfigError(f"--temperature must be a number >= 0 (0 = greedy), got {args.temperature}")
    model, tokenizer, _ = load_trained(args.model_dir, device=args.device)
    text = sample(model, tokenizer, args.prompt, tokens=args.tokens, temperature=args.temperature,
                  seed=args.seed)
    print(args.prompt + text)
    return 0
