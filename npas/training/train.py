"""Train an exported allocation for real, save it in safe formats, reload it, and sample from it.

A trained-model directory is self-describing, so it can be reloaded anywhere without the search
that produced it:
  model.safetensors  weights (safetensors: no pickle, shared tensors stored once)
  tokenizer.json     the tokenizer the model reads (Hugging Face tokenizer.json, or npas's character
                     vocabulary); directories from older npas hold vocab.json instead, still loadable
  config.yaml        the allocation (ArchConfig.to_yaml), which rebuilds the exact module
  metrics.json       the ProxyResult, the recipe, the data fingerprint and the reference chassis it was
                     trained with (and the directory it continued from, if any)
``metrics.json`` is written last, so its presence marks a complete directory.

A directory is also a starting point (``load_start``): ``npas train MODEL_DIR`` continues from its
weights, with the reference chassis it recorded, so a converted or trained model is not thrown away.

A model can be trained at a learning-rate factor a search located for it (``npas.training.lr_factor``).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import save_file
from torch import nn

from npas.allocation.config import ArchConfig, Chassis
from npas.allocation.transformer import build_model, export_state, load_weights
from npas.errors import ConfigError, DataError
from npas.files import read_text
from npas.training.data import Corpus
from npas.training.forks import train_model  # the recipe's schedule: cosine, or WSD with its forks
from npas.training.lr_factor import (
    LR_FACTOR_KEY,
    LR_FACTOR_RECIPE_KEY,
    check_lr_factor,
    located_under,
)
from npas.training.proxy import Progress, ProxyResult, Report, check_compatible
from npas.training.recipe import Recipe
from npas.training.tokenizers import Tokenizer, tokenizer_from_json
from npas.version import __version__

log = logging.getLogger(__name__)

MODEL_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"
VOCAB_FILE = "vocab.json"  # what older npas wrote for its character vocabulary; read when tokenizer.json is absent
CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.json"
OUTPUT_FILES = (MODEL_FILE, TOKENIZER_FILE, CONFIG_FILE, METRICS_FILE)


def train_allocation(cfg: Any, recipe: Recipe, corpus: Corpus, out_dir: str | Path,
                     device: str | torch.device | None = None, progress: Progress | None = None,
                     report: Report | None = None, reference: Any = None,
                     init_state: dict[str, torch.Tensor] | None = None,
                     started_from: str | Path | None = None, lr_factor: float = 1.0) -> ProxyResult:
    """Train ``cfg`` under ``recipe`` and write the four output files to ``out_dir``.

    ``reference`` is the chassis the fair parameterization scales learning rates and init against
    (default ``cfg.chassis``): pass the search space's reference chassis, as the search's runner does,
    and an exported trial trains exactly as it did in its study. ``init_state`` starts from given
    weights (``load_start``) instead of a fresh init; ``started_from`` names where they came from, for
    the record. ``lr_factor`` trains at that factor of the recipe's fair rate
    (``npas.training.lr_factor``); ``metrics.json`` records the recipe as given and the factor beside
    it. A run that ends ``failed`` writes only ``metrics.json`` (its weights are NaN and worth
    nothing); the caller decides whether that is an error.
    """
    lr_factor = check_lr_factor(lr_factor, "lr_factor")
    # before the directory exists: a refused run leaves nothing behind
    check_compatible(cfg, recipe, corpus, padded=init_state is not None)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model, result = train_model(cfg, recipe, corpus, report=report, device=device, progress=progress,
                                reference=reference, init_state=init_state, lr_factor=lr_factor)
    if result.status != "failed":
        save_trained(model, cfg, corpus.tokenizer, out)
    else:
        for name in (MODEL_FILE, TOKENIZER_FILE, VOCAB_FILE, CONFIG_FILE):  # never leave stale weights beside new metrics
            (out / name).unlink(missing_ok=True)
    extra: dict[str, Any] = {"reference": (reference if reference is not None else cfg.chassis).to_dict()}
    if started_from is not None:
        extra["started_from"] = str(started_from)
    if lr_factor != 1.0:
        extra[LR_FACTOR_KEY] = lr_factor
    write_metrics(out, result, recipe, corpus, extra)
    return result


def save_trained(model: nn.Module, cfg: Any, tokenizer: Tokenizer, out_dir: str | Path) -> None:
    """Weights (in ``cfg.dtype``, each tensor once: see ``export_state``), tokenizer and allocation;
    the rebuilt module re-ties shared Parameters."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = model.to("cpu")
    save_file(export_state(model), str(out / MODEL_FILE), metadata={"format": "npas", "config_hash": str(cfg.hash)})
    (out / TOKENIZER_FILE).write_text(tokenizer.to_json(), encoding="utf-8")  # byte-exact: its sha256 is its fingerprint
    (out / CONFIG_FILE).write_text(cfg.to_yaml(), encoding="utf-8")


def tokenizer_beside(config_path: str | Path) -> Path:
    """Where ``npas export`` puts the study's tokenizer next to an allocation: best.yaml -> best.tokenizer.json."""
    return Path(config_path).with_suffix(".tokenizer.json")


def exported_tokenizer(config_path: str | Path) -> str | None:
    """The tokenizer.json exported beside ``config_path``, if any: ``npas train`` uses it by default so
    a model trains on the tokens it was searched on."""
    p = tokenizer_beside(config_path)
    return str(p) if p.is_file() else None


REFERENCE_KEY = "reference"  # in an export and in metrics.json: the chassis the fair parameterization scaled against


def read_chassis(d: Any, where: str) -> Any:
    """A recorded reference chassis (a mapping of Chassis fields), refused in one line if malformed."""
    names = {f.name for f in fields(Chassis)}
    sizes = ("vocab_size", "context", "d_model", "n_layers", "n_heads", "d_ff")  # what every chassis states
    if (not isinstance(d, dict) or set(d) - names or any(n not in d for n in sizes)
            or any(isinstance(d[n], bool) or not isinstance(d[n], int) for n in sizes)):
        raise ConfigError(f"{where}: {REFERENCE_KEY} must be a chassis mapping with integer keys {list(sizes)} "
                          f"(and optionally {sorted(names - set(sizes))}), got {d!r}; export or train it again")
    chassis = Chassis(**d)  # the family's own fields are checked by problems() below
    problems = chassis.problems()
    if problems:
        raise ConfigError(f"{where}: {REFERENCE_KEY} {problems[0]}; export or train it again")
    return chassis


@dataclass(frozen=True)
class AllocationFile:
    """What ``npas train`` reads from an allocation YAML: the allocation, and, for an ``npas export``,
    the reference chassis its study scaled learning rates and init against."""

    cfg: Any  # ArchConfig
    reference: Any  # Chassis | None: None for a bare allocation or an export from before it was recorded
    exported: bool  # the file is an `npas export` document (an `allocation:` mapping with its record beside it)
    lr_factor: float = 1.0  # the trial's located learning-rate factor; 1.0 when the export carries none
    located_under: Recipe | None = None  # the recipe the factor was located under; None: unknown (or no factor)


def read_allocation_file(path: str | Path) -> AllocationFile:
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"allocation file {p} does not exist; write one with `npas export NAME --out best.yaml`, "
                          "or pass a model directory to continue training it")
    text = read_text(p, "allocation file")
    cfg = ArchConfig.from_yaml(text)  # refuses YAML that does not parse, with its own message
    doc = yaml.safe_load(text)
    exported = isinstance(doc, dict) and "allocation" in doc
    ref = doc.get(REFERENCE_KEY) if exported else None
    factor = doc.get(LR_FACTOR_KEY) if exported else None
    factor = 1.0 if factor is None else check_lr_factor(factor, f"{p}: {LR_FACTOR_KEY}")
    under = None
    if factor != 1.0 and LR_FACTOR_RECIPE_KEY in doc:
        under = located_under(doc[LR_FACTOR_RECIPE_KEY], f"{p}: {LR_FACTOR_RECIPE_KEY}")
    elif factor != 1.0:  # exported before the key: its study's recipe, which every located factor ran under
        under = _lenient_recipe(doc.get("recipe"))
    return AllocationFile(cfg, None if ref is None else read_chassis(ref, str(p)), exported, factor, under)


def _lenient_recipe(value: Any) -> Recipe | None:
    """A recipe a file records for information only (an old export's, a metrics.json's): None when
    it does not read, which makes a factor beside it one of unknown provenance rather than an error."""
    try:
        return located_under(value, "recipe")
    except ConfigError:
        return None


@dataclass(frozen=True)
class Start:
    """A model directory (``npas train --out`` or ``npas convert --out``) as the start of more training."""

    dir: Path
    cfg: Any  # ArchConfig
    tokenizer: Tokenizer
    state: dict[str, torch.Tensor]
    reference: Any  # Chassis | None: the one its metrics.json records; None: the allocation's own chassis
    data: dict  # its metrics.json's description of the corpus it was trained (or converted) on
    val_loss: float | None  # its validation loss as recorded (a conversion's: before any training)
    lr_factor: float = 1.0  # the learning-rate factor it was trained at (metrics.json), continued at by default
    recipe: Recipe | None = None  # the recipe it was trained under (metrics.json): the factor's own


def load_start(model_dir: str | Path) -> Start:
    """The weights, tokenizer and record of ``model_dir``, to continue training from (``train_allocation``'s
    ``init_state``). A converted directory records its validation loss under ``conversion``."""
    d = Path(model_dir)
    model, tokenizer, cfg = load_trained(d)
    metrics = read_metrics(d)
    ref = metrics.get(REFERENCE_KEY)
    val = (metrics.get("result") or {}).get("val_loss")
    if val is None:
        val = (metrics.get("conversion") or {}).get("val_loss")
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}  # train_model copies into fp32
    factor = metrics.get(LR_FACTOR_KEY)
    return Start(d, cfg, tokenizer, state, None if ref is None else read_chassis(ref, str(d / METRICS_FILE)),
                 metrics.get("data") or {}, val,
                 1.0 if factor is None else check_lr_factor(factor, f"{d / METRICS_FILE}: {LR_FACTOR_KEY}"),
                 _lenient_recipe(metrics.get("recipe")))


def write_metrics(out_dir: str | Path, result: ProxyResult, recipe: Recipe, corpus: Corpus,
                  extra: dict | None = None) -> dict:

    doc = {"result": result.to_dict(), "recipe": recipe.to_dict(), "data": corpus.describe(), **(extra or {}),
           "npas_version": __version__}
    (Path(out_dir) / METRICS_FILE).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return doc


def read_metrics(model_dir: str | Path) -> dict:
    path = Path(model_dir) / METRICS_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{path} is missing; {model_dir} is not a complete `npas train --out` directory "
                        "(training may have been interrupted); train again") from None
    except json.JSONDecodeError as err:
        raise DataError(f"{path} is not valid JSON ({err}); train again") from None


# what to do with npas's own Hugging Face model type, which only transformers loads
NPAS_HF_WAY_OUT = ("to train or convert a model further, write it with --format npas (the default), or as a stock "
                   "LlamaForCausalLM (--format hf --unroll), which `npas convert` reads")


def _hf_dir_hint(d: Path) -> str:
    """Why a Hugging Face checkpoint directory is not an npas model directory, and the way out."""
    try:
        npas_type = json.loads((d / "config.json").read_text(encoding="utf-8")).get("model_type") == "npas"
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        npas_type = False
    if npas_type:
        return (f"{d} is npas's Hugging Face model type (NpasForCausalLM, written with --format hf), which npas "
                f"loads only through transformers (AutoModelForCausalLM after `import npas`); {NPAS_HF_WAY_OUT}")
    return (f"{d} is a Hugging Face checkpoint (config.json), not an npas model directory; convert it first with "
            f"`npas convert {d} --out DIR` (its identity allocation), then use DIR")


def load_trained(model_dir: str | Path, device: str | torch.device = "cpu") -> tuple[nn.Module, Tokenizer, Any]:
    """(model, tokenizer, cfg) from a ``npas train`` directory; weights via safetensors, never pickle."""
    d = Path(model_dir)
    if not d.is_dir():
        raise DataError(f"trained-model directory {d} does not exist; pass the --out of `npas train`")
    if (d / "config.json").is_file() and not (d / CONFIG_FILE).is_file():
        raise DataError(_hf_dir_hint(d))
    tok_file = TOKENIZER_FILE if (d / TOKENIZER_FILE).is_file() or not (d / VOCAB_FILE).is_file() else VOCAB_FILE
    missing = [name for name in (MODEL_FILE, tok_file, CONFIG_FILE) if not (d / name).is_file()]
    if missing:
        raise DataError(f"{d} lacks {', '.join(missing)}; pass a directory written by `npas train` "
                        "(a failed run leaves only metrics.json)")
    text = read_text(d / CONFIG_FILE, "allocation file")
    try:
        cfg = ArchConfig.from_yaml(text)
    except ConfigError as err:  # a YAML error spans lines (a caret under a column): one line, naming the file
        raise DataError(f"{d / CONFIG_FILE} is damaged: {' '.join(str(err).split())}; train again or restore "
                        "the file") from None
    tokenizer = tokenizer_from_json(read_text(d / tok_file, "tokenizer", DataError), name=str(d / tok_file))
    if tokenizer.vocab_size > cfg.chassis.vocab_size:  # fewer is a padded vocabulary (an HF checkpoint's)
        raise DataError(f"{d}: {tok_file} has {tokenizer.vocab_size} tokens but config.yaml's chassis "
                        f"vocab_size is {cfg.chassis.vocab_size}; the files come from different runs")
    model = build_model(cfg)
    try:
        load_weights(model, d / MODEL_FILE, text)  # also splits a schema-1 fused attn_qkv
    except (SafetensorError, RuntimeError, OSError) as err:
        raise DataError(f"cannot load {d / MODEL_FILE}: {str(err).splitlines()[0]}; "
                        "the weights do not match config.yaml or the file is damaged") from None
    check_finite(model, d / MODEL_FILE)
    model.to(device).eval()
    log.debug("loaded %s (%s)", d, cfg.hash)
    return model, tokenizer, cfg


@torch.no_grad()
def check_finite(model: nn.Module, path: str | Path) -> None:
    """Refuse weights holding NaN or infinity at load: they would sample garbage (or fail inside
    torch.multinomial), convert into NaN allocations and start every `--init-from` trial diverged."""
    bad = [name for name, p in model.state_dict().items() if p.is_floating_point() and not torch.isfinite(p).all()]
    if bad:
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise DataError(f"{path} holds non-finite weights (NaN or inf in {', '.join(bad[:3])}{more}); the model "
                        "diverged or the file is damaged: retrain it")


@torch.no_grad()
def sample(model: nn.Module, tokenizer: Tokenizer, prompt: str, tokens: int = 200,
           temperature: float = 1.0, seed: int = 0) -> str:
    """Continue ``prompt`` by ``tokens`` tokens; temperature 0 is greedy. Returns the continuation,
    decoded with the model's own tokenizer.

    Characters outside a character vocabulary raise a DataError that names them, rather than being
    dropped, so a user learns the model cannot see them (byte-level BPE encodes any text).
    """
    if tokens < 0:
        raise DataError(f"--tokens must be >= 0, got {tokens}")
    if not math.isfinite(temperature) or temperature < 0:  # NaN passes `< 0` and poisons every probability
        raise DataError(f"--temperature must be a finite number >= 0 (0 = greedy), got {temperature}")
    ids = tokenizer.encode(prompt)
    if not ids:  # an empty prompt starts from a line break, the most neutral character
        try:
            ids = tokenizer.encode("\n")[:1] or [0]
        except DataError:  # a character vocabulary without a line break
            ids = [0]
    device = next(model.parameters()).device
    context = model.cfg.chassis.context if hasattr(model, "cfg") else len(ids) + tokens
    gen = torch.Generator(device=device).manual_seed(seed)
    idx = torch.tensor([ids], dtype=torch.long, device=device)
    was_training = model.training
    model.eval()
    out: list[int] = []
    for _ in range(tokens):
        # (1, V); a padded vocabulary's rows past the tokenizer's ids name no token: never emitted
        logits = model(idx[:, -context:])[0][:, -1, :tokenizer.vocab_size].float()
        if temperature == 0:
            nxt = logits.argmax(dim=-1, keepdim=True)
        else:
            nxt = torch.multinomial(F.softmax(logits / temperature, dim=-1), 1, generator=gen)
        idx = torch.cat([idx, nxt], dim=1)
        out.append(int(nxt))
    model.train(was_training)
    return tokenizer.decode(out)
