"""Proxy recipes: how one candidate allocation is trained and scored.

A recipe is plain data read from ``trials/<name>.yaml``. It is validated in one pass that collects
every problem (unknown keys with a did-you-mean, wrong types, values out of range) and raises a
single ConfigError, so a user fixes a file in one edit instead of one error per run.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal

import yaml

from npas.allocation.knobs import closest
from npas.builtin import find_named, looks_like_path, shipped
from npas.errors import ConfigError, format_problems

RECIPE_VERSION = 2  # 2 added test_fraction and parameterization
DTYPES = ("float32", "bfloat16")
Dtype = Literal["float32", "bfloat16"]
PARAMETERIZATIONS = ("fair", "uniform")
Parameterization = Literal["fair", "uniform"]
SCHEDULES = ("cosine", "wsd")
Schedule = Literal["cosine", "wsd"]
DECAY_SHAPES = ("1-sqrt", "linear")
DecayShape = Literal["1-sqrt", "linear"]


@dataclass(frozen=True)
class Recipe:
    """One proxy training recipe; defaults are the ``proxy`` recipe's values."""

    name: str = "proxy"
    seq_len: int = 64  # tokens per training window; must be <= the chassis context
    batch_size: int = 48  # windows per optimizer step
    steps: int = 400  # maximum fidelity: optimizer steps of a full trial
    lr: float = 6e-3  # peak learning rate after warmup, of the chassis' untied reference model
    min_lr: float = 6e-4  # floor of the cosine decay
    warmup_steps: int = 30  # linear warmup from lr/warmup_steps to lr
    weight_decay: float = 0.1  # AdamW decay on weight matrices; norms and mixing coefficients get none
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0  # max global grad norm; 0 turns clipping off
    eval_every: int = 100  # steps between validation evaluations (and report() calls)
    eval_batches: int = 8  # fixed validation batches per evaluation
    seed: int = 0  # init, batch order and eval batches all derive from it
    dtype: Dtype = "bfloat16"  # autocast dtype on GPU; CPU always trains in float32
    threads: int = 1  # torch CPU threads per worker; 0 keeps torch's default
    val_fraction: float = 0.1  # share of the text held out as contiguous validation chunks
    test_fraction: float = 0.1  # share held out as test chunks: never read by a search, only by validation
    parameterization: Parameterization = "fair"  # per-group lr/init rules (training/parameterization.py)
    data: str | None = None  # corpus path; None = bundled Shakespeare (--data overrides)
    version: int = RECIPE_VERSION
    # The fields below came after version 2. Each is left out of ``to_dict`` at its default, so a recipe
    # that does not set them serializes exactly as before: studies resume unchanged.
    horizon: int = 4000  # target length: the steps (at this batch) the user trains a winner for (`long`)
    schedule: Schedule = "cosine"  # "wsd": warmup-stable-decay, scored by cooldown forks (npas.training.forks)
    decay_fraction: float = 0.2  # wsd: the last fraction of a run of length t that decays to min_lr
    decay_shape: DecayShape = "1-sqrt"  # wsd: how the rate falls during the decay (see ``lr_at``)
    rungs: tuple[int, ...] | None = None  # wsd: lengths scored by forks; None = horizon/16, /4, /1 (<= steps)

    def __post_init__(self) -> None:
        problems = recipe_problems(asdict(self))
        if problems:
            raise ConfigError(format_problems(f"recipe {self.name!r}", problems))
        for f in _FLOAT_FIELDS:  # YAML 1.1 reads 3e-4 as text; store numbers
            object.__setattr__(self, f, float(getattr(self, f)))
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        if self.rungs is not None:
            object.__setattr__(self, "rungs", tuple(sorted(set(self.rungs))))

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.batch_size

    @property
    def horizon_tokens(self) -> int:
        return self.horizon * self.tokens_per_step

    def describe(self) -> str:
        """One line for the places a recipe is shown: its length, schedule and target horizon in tokens."""
        sched = (f"wsd ({self.decay_fraction:g} {self.decay_shape} decay, rungs "
                 f"{', '.join(map(str, self.fork_rungs()))})" if self.schedule == "wsd" else self.schedule)
        return (f"recipe {self.name}: {self.steps:,} steps x {self.tokens_per_step:,} tokens "
                f"({self.steps * self.tokens_per_step / 1e6:.2f}M), {sched}; horizon {self.horizon:,} steps "
                f"({self.horizon_tokens / 1e6:.2f}M tokens)")

    def lr_at(self, step: int, length: int | None = None) -> float:
        """Learning rate for 0-based ``step`` of a run of ``length`` steps (default ``steps``).

        ``cosine``: linear warmup, then cosine from lr to min_lr at ``length``. A cosine run's whole
        second half depends on its length, so a 400-step cosine proxy and a 1,600-step run train under
        different schedules from step ~30 on.

        ``wsd`` (warmup-stable-decay, trapezoidal): linear warmup, lr held flat, then over the last
        ``decay_steps(length)`` steps a fall to min_lr, reached at the last step. Every WSD run is at the
        same rate until its decay starts, whatever its length, which is what lets one stable run branch
        a short decay off at any step and read the loss a WSD run of that length finishes at
        (``npas.training.forks``). The decay's shape is ``1-sqrt`` by default: Hägele et al. (2024,
        "Scaling Laws and Compute-Optimal Training Beyond Fixed Training Durations") found that a
        1 - sqrt cooldown of 10-20% of the run matches or beats cosine at every length and beats a
        linear cooldown of the same length, because it keeps the rate high longer and drops it
        steeply at the very end; ``linear`` is kept for comparison.
        """
        steps = self.steps if length is None else length
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if self.schedule == "wsd":
            start = self.decay_start(steps)
            if step < start:
                return self.lr
            progress = min(1.0, (step + 1 - start) / (steps - start))
            fall = math.sqrt(progress) if self.decay_shape == "1-sqrt" else progress
            return self.min_lr + (1.0 - fall) * (self.lr - self.min_lr)
        span = max(1, steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        return self.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (self.lr - self.min_lr)

    def decay_steps(self, length: int) -> int:
        """WSD: steps of the decay of a run of ``length`` steps, ``decay_fraction`` of it, at least 1."""
        return max(1, math.floor(self.decay_fraction * length + 0.5))

    def decay_start(self, length: int) -> int:
        """WSD: the first step of a run of ``length`` that decays; never inside the warmup."""
        return min(length, max(self.warmup_steps, length - self.decay_steps(length)))

    def fork_rungs(self) -> tuple[int, ...]:
        """The run lengths a WSD run of this recipe scores, ascending, ending at ``steps``: the
        explicit ``rungs``, else horizon/16, horizon/4 and horizon that a run of ``steps`` reaches past
        its warmup; ``steps`` itself is always the last (the main run's own decay ends there)."""
        if self.rungs is not None:
            picked = {r for r in self.rungs if r <= self.steps}
        else:
            picked = {max(1, self.horizon // k) for k in (16, 4, 1)}
            picked = {r for r in picked if self.warmup_steps < r <= self.steps}
        return tuple(sorted(picked | {self.steps}))

    def with_steps(self, steps: int) -> Recipe:
        """This recipe cut to (or extended to) ``steps``, keeping warmup, eval cadence and rungs valid."""
        d = {**self.to_dict(), "steps": steps, "warmup_steps": min(self.warmup_steps, steps),
             "eval_every": min(self.eval_every, steps)}
        if self.rungs is not None:
            d["rungs"] = [r for r in self.rungs if r <= steps] or None  # none left: the horizon's defaults
        return Recipe.from_dict(d)

    def with_seed(self, seed: int) -> Recipe:
        """This recipe on another seed (a trial's repeats, a certificate's retrainings): init, batch
        order and nothing else change; the recipe itself when ``seed`` is already its own."""
        return self if seed == self.seed else dataclasses.replace(self, seed=seed)

    def with_lr_factor(self, factor: float) -> Recipe:
        """This recipe at ``factor`` x its learning rate, the cosine floor scaled with it: a learning-rate
        sweep moves the whole schedule, not only its peak (the benches' checks and grids all do this)."""
        return Recipe.from_dict({**self.to_dict(), "lr": self.lr * factor, "min_lr": self.min_lr * factor})

    def to_dict(self) -> dict[str, Any]:
        """The recipe as plain data; the fields added after version 2 only where they differ from
        their defaults, so every recipe that existed before them keeps its exact serialized form."""
        d = asdict(self)
        d["betas"] = list(self.betas)
        for key in _LATER_FIELDS:
            if d[key] == _FIELDS[key].default:
                del d[key]
        if d.get("rungs") is not None:
            d["rungs"] = list(d["rungs"])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "recipe") -> Recipe:
        if not isinstance(d, dict):
            raise ConfigError(f"{source}: a recipe must be a mapping of keys to values, got "
                              f"{type(d).__name__}; see trials/proxy.yaml for the layout")
        if d.get("version") == 1 and "parameterization" not in d:
            # a recipe stored before version 2 (e.g. in a study) trained with one learning rate:
            # keep it that way, so a resumed study does not change training half-way
            d = {**d, "parameterization": "uniform"}
        problems = recipe_problems(d)
        if problems:
            raise ConfigError(format_problems(source, problems))
        return cls(**d)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


_FIELDS = {f.name: f for f in fields(Recipe)}
_LATER_FIELDS = ("horizon", "schedule", "decay_fraction", "decay_shape", "rungs")  # omitted at their defaults
_INT_FIELDS = ("seq_len", "batch_size", "steps", "warmup_steps", "eval_every", "eval_batches", "seed",
               "threads", "version", "horizon")
_FLOAT_FIELDS = ("lr", "min_lr", "weight_decay", "grad_clip", "val_fraction", "test_fraction", "decay_fraction")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _as_float(v: Any) -> float | None:
    """Numbers, and strings such as ``3e-4`` that YAML 1.1 leaves as text, count as floats."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def recipe_problems(d: dict[str, Any]) -> list[str]:
    """Every problem of a recipe mapping, one line each; empty when it is valid."""
    problems: list[str] = []
    for key in d:
        if key not in _FIELDS:
            hint = closest(key, list(_FIELDS)) or f"; known keys: {', '.join(_FIELDS)}"
            problems.append(f"unknown key {key!r}{hint}")

    def get(key: str) -> Any:
        return d.get(key, _FIELDS[key].default)

    ints: dict[str, int] = {}
    for key in _INT_FIELDS:
        v = get(key)
        if _is_int(v):
            ints[key] = v
        else:
            problems.append(f"{key}: expected an integer, got {v!r} ({type(v).__name__})")
    floats: dict[str, float] = {}
    for key in _FLOAT_FIELDS:
        v = get(key)
        f = _as_float(v)
        if f is None or not math.isfinite(f):
            problems.append(f"{key}: expected a finite number, got {v!r}")
        else:
            floats[key] = f

    for key, low in (("seq_len", 1), ("batch_size", 1), ("steps", 1), ("warmup_steps", 0),
                     ("eval_every", 1), ("eval_batches", 1), ("seed", 0), ("threads", 0), ("horizon", 1)):
        if key in ints and ints[key] < low:
            problems.append(f"{key}: must be >= {low}, got {ints[key]}")
    if "version" in ints and ints["version"] > RECIPE_VERSION:
        problems.append(f"version: {ints['version']} is newer than this npas understands "
                        f"({RECIPE_VERSION}); upgrade npas")
    if "warmup_steps" in ints and "steps" in ints and ints["warmup_steps"] > ints["steps"]:
        problems.append(f"warmup_steps: must be <= steps ({ints['steps']}), got {ints['warmup_steps']}")
    if "lr" in floats and floats["lr"] <= 0:
        problems.append(f"lr: must be > 0, got {floats['lr']}")
    if "min_lr" in floats:
        if floats["min_lr"] < 0:
            problems.append(f"min_lr: must be >= 0, got {floats['min_lr']}")
        elif "lr" in floats and floats["min_lr"] > floats["lr"]:
            problems.append(f"min_lr: must be <= lr ({floats['lr']}), got {floats['min_lr']}")
    for key in ("weight_decay", "grad_clip"):
        if key in floats and floats[key] < 0:
            problems.append(f"{key}: must be >= 0, got {floats[key]}")
    if "val_fraction" in floats and not 0 < floats["val_fraction"] <= 0.5:
        problems.append(f"val_fraction: must be in (0, 0.5], got {floats['val_fraction']}")
    if "test_fraction" in floats and not 0 < floats["test_fraction"] <= 0.5:
        problems.append(f"test_fraction: must be in (0, 0.5], got {floats['test_fraction']}")
    elif ("test_fraction" in floats and 0 < floats.get("val_fraction", 0) <= 0.5
          and floats["val_fraction"] + floats["test_fraction"] > 0.5):
        problems.append(f"test_fraction: val_fraction + test_fraction must be <= 0.5 so most text trains, "
                        f"got {floats['val_fraction']} + {floats['test_fraction']}")
    par = get("parameterization")
    if par not in PARAMETERIZATIONS:
        problems.append(f"parameterization: must be one of {', '.join(PARAMETERIZATIONS)}, got {par!r}"
                        f"{closest(str(par), PARAMETERIZATIONS)}")

    problems.extend(_schedule_problems(get, ints, floats))

    betas = get("betas")
    if not (isinstance(betas, list | tuple) and len(betas) == 2
            and all(_as_float(b) is not None and 0 <= _as_float(b) < 1 for b in betas)):
        problems.append(f"betas: expected two numbers in [0, 1), e.g. [0.9, 0.95], got {betas!r}")
    dtype = get("dtype")
    if dtype not in DTYPES:
        problems.append(f"dtype: must be one of {', '.join(DTYPES)}, got {dtype!r}{closest(dtype, DTYPES)}")
    name = get("name")
    if not isinstance(name, str) or not name:
        problems.append(f"name: expected a non-empty string, got {name!r}")
    data = get("data")
    if data is not None and not isinstance(data, str):
        problems.append(f"data: expected a path string or null, got {data!r}")
    return problems


def _schedule_problems(get: Any, ints: dict[str, int], floats: dict[str, float]) -> list[str]:
    """The schedule's fields: its name, the WSD decay and the fork rungs."""
    problems: list[str] = []
    schedule = get("schedule")
    if schedule not in SCHEDULES:
        problems.append(f"schedule: must be one of {', '.join(SCHEDULES)}, got {schedule!r}"
                        f"{closest(str(schedule), SCHEDULES)}")
    shape = get("decay_shape")
    if shape not in DECAY_SHAPES:
        problems.append(f"decay_shape: must be one of {', '.join(DECAY_SHAPES)}, got {shape!r}"
                        f"{closest(str(shape), DECAY_SHAPES)}")
    if "decay_fraction" in floats and not 0 < floats["decay_fraction"] <= 1:
        problems.append(f"decay_fraction: must be in (0, 1] (0.1-0.2 is usual), got {floats['decay_fraction']}")
    if schedule == "cosine":  # the wsd decay's own keys: a cosine run decays over its whole length, ignoring them
        changed = [k for k, v in (("decay_fraction", floats.get("decay_fraction")), ("decay_shape", shape))
                   if v is not None and v != _FIELDS[k].default and (k != "decay_shape" or v in DECAY_SHAPES)]
        problems += [f"{k}: only a wsd schedule has a decay phase (a cosine run decays over its whole length); "
                     f"add schedule: wsd or remove {k}" for k in changed]
    rungs = get("rungs")
    if rungs is None:
        return problems
    if not (isinstance(rungs, list | tuple) and rungs and all(_is_int(r) for r in rungs)):
        problems.append(f"rungs: expected a list of step counts, e.g. [100, 400, 1600], got {rungs!r}")
        return problems
    if schedule != "wsd":
        problems.append("rungs: only a wsd schedule is scored at rungs; add schedule: wsd or remove rungs")
    low, high = ints.get("warmup_steps", 0), ints.get("steps")
    bad = [r for r in rungs if r <= low or (high is not None and r > high)]
    if bad:
        problems.append(f"rungs: each must be past the warmup and at most steps ({low} < rung <= {high}), "
                        f"got {', '.join(map(str, bad))}")
    return problems


def resolve_recipe(name_or_path: str | Path) -> Path:
    """A YAML path as given, or a bare name: ``trials/<name>.yaml`` in the working directory (a project's
    own recipes win), else the recipe of that name shipped in the package, so ``--recipe smoke`` works
    from any directory, installed or in a checkout."""
    text = str(name_or_path)
    if looks_like_path(text):
        p = Path(text).expanduser()
        if not p.is_file():
            raise ConfigError(f"recipe file {p} does not exist; pass a YAML path or a name such as "
                              f"'smoke' ({_available()})")
        return p
    found = find_named("recipes", text, "trials")
    if found is None:
        raise ConfigError(f"recipe {text!r} not found (looked in ./trials and the shipped recipes)"
                          f"{closest(text, _names())}; pass a YAML path or one of: {_available()}")
    return found


def _names() -> list[str]:
    local = Path.cwd() / "trials"
    return sorted({*shipped("recipes"), *(p.stem for p in local.glob("*.yaml") if local.is_dir())})


def _available() -> str:
    return ", ".join(_names()) or "no recipes found"


def load_recipe(name_or_path: str | Path) -> Recipe:
    """Read, validate and return a recipe; every problem of the file is reported at once."""
    path = resolve_recipe(name_or_path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise ConfigError(f"recipe {path} is not valid YAML: {' '.join(str(err).split())}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read recipe {path}: {err}; check the file") from None
    if raw is None:
        raw = {}
    if isinstance(raw, dict):
        raw = {"name": path.stem, **raw}
    return Recipe.from_dict(raw, source=str(path))
