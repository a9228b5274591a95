"""What `npas validate` retrains: the plan, deterministic for a given study and options.

- the K front points with the lowest loss (the loss objective found by name), the point `--pick`
  chooses, every hand-crafted baseline, and on top of those M other completed full-fidelity trials
  spread over the proxy-loss range (one per equal-count stratum, the one nearest the stratum's
  middle), drawn from the trials none of the above already retrains: baselines never use up the
  sample, so ``--sample M`` always adds M searched allocations where the study has them;
- two matched baselines for the picked point: the dense untied model with equal stored parameters
  (the space's `narrow_untied` baseline is exactly that) and the dense untied model whose FLOPs per
  token come as close to the pick's as a uniform MLP width allows (the exact ratio is reported);
- fresh seeds ``10_000 + s``, never a recipe's own seed: training a pick again on the seed that
  selected it would keep the luck that put it on the front (the winner's curse);
- each searched allocation at the learning-rate factor its trial located (``lr_factor``; 1 where
  none was located, and for the constructed FLOPs match, which has no trial): validated as it would be
  trained, at that factor of the long recipe's fair rate -- when the long recipe has the rate of the
  study's recipe, under which every factor was located; otherwise at x1, said in one note (``Plan.note``),
  unless ``Options.lr_factor`` is ``located`` (the stored factors anyway) or a number (every retraining
  at it), as for ``npas train`` (``npas.training.lr_factor.choose_factor``).

Every (allocation, seed) is one job with a key over allocation, recipe, seed, data and split, so the
same retraining is recognised whatever role it plays and however often the command is rerun.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import optuna
from optuna.trial import FrozenTrial, TrialState

from npas.allocation.budget import count
from npas.allocation.config import ArchConfig
from npas.allocation.space import LOSS_OBJECTIVES
from npas.errors import ConfigError
from npas.service.execution.outcome import repeat_seeds
from npas.service.export.picks import objective_index
from npas.service.export.picks import pick as choose
from npas.service.study import studies
from npas.service.study.record import StudyAttr, TrialAttr
from npas.training.lr_factor import LOCATED, not_its_rate
from npas.training.proxy import eval_batches
from npas.training.recipe import Recipe

SEED_BASE = 10_000  # fresh seeds are SEED_BASE + s: far from the small seeds recipes use


# ---- the one place that knows whether the corpus has a test split ------------------------------
def scoring_split() -> str:
    """Validation scores on the held-out test split, which no search ever reads (the search selects
    on the validation split); every certificate records the split it was scored on."""
    return "test"


def score_batches(corpus, recipe: Recipe):
    """The fixed scoring windows, drawn with the *long recipe's* own seed so every allocation and
    every fresh training seed is scored on the same text."""
    return eval_batches(corpus, recipe, split=scoring_split())


@dataclass(frozen=True)
class Options:
    """What `npas validate` retrains and how; defaults fit about two hours on 2 CPU cores."""

    pick: str = "knee"
    top: int = 4  # front points with the lowest loss
    sample: int = 4  # other completed trials, not counting the baselines (always retrained on top)
    recipe: str = "long"
    seeds: int = 2  # fresh seeds per allocation; >= 2 so seed noise and SNR exist
    workers: int = 2  # concurrent retrainings on Ray; 0 runs them one by one in this process
    threads: int | None = 1  # torch threads per retraining (None: the recipe's); one run per core
    # scales better than one run on two threads, so the long recipe's 2 threads become 1 here
    ray_address: str | None = None
    lr_factor: float | str | None = None  # --lr-factor: None (the located factors where the rate is the study's),
    # "located" (the located factors whatever the recipe) or a number (every retraining at it)
    on_progress: Callable[[int, int], None] | None = field(default=None, compare=False)  # (done, total)
    on_note: Callable[[str], None] | None = field(default=None, compare=False)  # a one-line note (else logged)

    def problems(self) -> list[str]:
        out = []
        if self.top < 1:
            out.append(f"--top must be >= 1, got {self.top}")
        if self.sample < 0:
            out.append(f"--sample must be >= 0, got {self.sample}")
        if self.seeds < 2:
            out.append(f"--seeds must be >= 2 (seed noise and signal-to-noise need two), got {self.seeds}")
        if self.threads is not None and self.threads < 1:
            out.append(f"--threads must be >= 1, got {self.threads}")
        if self.workers < 0:
            out.append(f"--workers must be >= 0 (0 = in this process), got {self.workers}")
        f = self.lr_factor
        if f is not None and f != LOCATED and (isinstance(f, bool) or not isinstance(f, int | float)
                                               or not math.isfinite(f) or f <= 0):
            out.append(f"--lr-factor must be a finite number > 0 or `located`, got {f!r}")
        how = self.pick
        ok = how in ("knee", "min-loss") or (how.startswith("trial=") and how[6:].isdigit()) or (
            how.startswith("max-memory=") and _is_number(how[11:]))
        if not ok:
            out.append(f"--pick {how!r} is not one of knee, min-loss, max-memory=BYTES, trial=N")
        return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Target:
    """One allocation to retrain on every seed."""

    cfg: ArchConfig
    roles: tuple[str, ...]  # front | sample | baseline | pick | memory_matched | flops_matched
    source: int | None  # trial number in the source study; None for the constructed FLOPs match
    proxy_loss: float | None
    label: str = ""  # baseline name or how the allocation was constructed
    lr_factor: float = 1.0  # the source trial's located learning-rate factor (1: none located)


@dataclass(frozen=True)
class Plan:
    study: str
    targets: tuple[Target, ...]
    seeds: tuple[int, ...]
    recipe: Recipe
    pick: int  # source trial number of the picked point
    memory_matched: str | None  # allocation hashes of the matched baselines
    flops_matched: str | None
    flops_ratio: float | None  # matched FLOPs / picked FLOPs
    split: str
    fingerprint: str
    note: str | None = None  # why located factors are not applied (or applied anyway), in one line

    def key(self, target: Target, seed: int) -> str:
        """Same allocation, recipe, rate, seed and data -> same retraining, whatever role it plays (a
        factor of 1 is left out, so every key from before located rates stays as it was)."""
        rate = {} if target.lr_factor == 1.0 else {"f": target.lr_factor}
        blob = json.dumps({"a": target.cfg.hash, "r": self.recipe.to_dict(), "s": seed, "d": self.fingerprint,
                           "split": self.split, **rate}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def jobs(self) -> list[tuple[Target, int, str]]:
        return [(t, s, self.key(t, s)) for t in self.targets for s in self.seeds]


def fresh_seeds(n: int, avoid: set[int]) -> tuple[int, ...]:
    seeds, s = [], SEED_BASE
    while len(seeds) < n:
        if s not in avoid:
            seeds.append(s)
        s += 1
    assert not set(seeds) & avoid, "a validation seed equals a recipe's seed"
    return tuple(seeds)


def _cfg(t: FrozenTrial) -> ArchConfig:
    return ArchConfig.from_dict(t.user_attrs[TrialAttr.ALLOC])


def flops_matched(cfg: ArchConfig, seq_len: int) -> tuple[ArchConfig, float]:
    """The dense untied uniform model on ``cfg``'s chassis whose FLOPs per token are nearest ``cfg``'s
    (FLOPs grow monotonically with the MLP width, so a bisection over the width finds it)."""
    c, L = cfg.chassis, cfg.chassis.n_layers
    target = count(cfg, seq_len=seq_len).flops_per_token

    def dense(w: int) -> ArchConfig:
        return ArchConfig(chassis=c, mlp_widths=(w,) * L, block_of_layer=tuple(range(L)), dtype=cfg.dtype)

    def flops(w: int) -> int:
        return count(dense(w), seq_len=seq_len).flops_per_token

    lo, hi = 1, max(2, 16 * c.d_ff)
    while lo < hi:  # smallest width with flops >= target
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if flops(mid) < target else (lo, mid)
    best = min({max(1, lo - 1), lo}, key=lambda w: (abs(flops(w) - target), w))
    return dense(best), flops(best) / target


def make_plan(study: optuna.Study, opts: Options, recipe: Recipe) -> Plan:
    li = objective_index(study, LOSS_OBJECTIVES, "loss", opts.pick)  # spaces always name a loss objective
    front = [t for t in studies.front_trials(study) if TrialAttr.ALLOC in t.user_attrs]
    front.sort(key=lambda t: t.values[li])
    picked = choose(study, opts.pick)
    targets: dict[str, dict] = {}  # allocation hash -> Target fields, in plan order

    def add(t: FrozenTrial | None, role: str, cfg: ArchConfig | None = None, label: str = "") -> str:
        cfg = cfg or _cfg(t)
        entry = targets.setdefault(cfg.hash, {"cfg": cfg, "roles": [], "source": t.number if t else None,
                                              "proxy_loss": t.values[li] if t else None, "label": label,
                                              "lr_factor": _lr_factor(t)})
        if role not in entry["roles"]:
            entry["roles"].append(role)
        entry["label"] = entry["label"] or label
        return cfg.hash

    for t in front[:opts.top]:
        add(t, "front")
    add(picked, "pick")
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if studies.is_full_fidelity(t) and TrialAttr.ALLOC in t.user_attrs]
    baselines = sorted((t for t in done if t.user_attrs.get(TrialAttr.BASELINE)), key=lambda t: t.number)
    for t in baselines:
        add(t, "baseline", label=str(t.user_attrs[TrialAttr.BASELINE]))
    rest = sorted((t for t in done if _cfg_hash(t) not in targets), key=lambda t: (t.values[li], t.number))
    m = min(len(rest), opts.sample)  # baselines are already in: they come on top of the sample
    for k in range(m):  # the middle of each of m equal-count strata of the proxy-loss order
        add(rest[int((k + 0.5) * len(rest) / m)], "sample")
    narrow = next((t for t in baselines if t.user_attrs[TrialAttr.BASELINE] == "narrow_untied"), None)
    mem = add(narrow, "memory_matched", label="narrow_untied") if narrow is not None else None
    seq_len = recipe.seq_len
    dense, ratio = flops_matched(_cfg(picked), seq_len)
    flo = add(None, "flops_matched", cfg=dense, label=f"dense untied d_ff={dense.mlp_widths[0]}")
    proxy_seed = int((study.user_attrs.get(StudyAttr.RECIPE) or {}).get("seed", 0))
    repeats = int(study.user_attrs.get(StudyAttr.REPEATS) or 1)  # `search --repeats`: every proxy seed is taken
    seeds = fresh_seeds(opts.seeds, {*repeat_seeds(proxy_seed, repeats), recipe.seed})
    factor, note = _rate(study, [e["lr_factor"] for e in targets.values()], recipe, opts.lr_factor)
    return Plan(study=study.study_name,
                targets=tuple(Target(e["cfg"], tuple(e["roles"]), e["source"], e["proxy_loss"], e["label"],
                                     factor(e["lr_factor"])) for e in targets.values()),
                seeds=seeds, recipe=recipe, pick=picked.number, memory_matched=mem, flops_matched=flo,
                flops_ratio=ratio, split=scoring_split(), fingerprint=str(study.user_attrs.get(StudyAttr.FINGERPRINT, "")),
                note=note)


def _rate(study: optuna.Study, stored: list[float], recipe: Recipe,
          requested: float | str | None) -> tuple[Callable[[float], float], str | None]:
    """(stored factor -> the factor retrained at, a one-line note or None): `choose_factor`'s rule, with
    the study's recipe as the one every located factor was located under."""
    located = sorted({f for f in stored if f != 1.0})
    if requested is not None and requested != LOCATED:
        return (lambda f: float(requested)), None  # type: ignore[arg-type]
    try:
        under = Recipe.from_dict(dict(study.user_attrs.get(StudyAttr.RECIPE) or {}), "the study's recipe")
    except (ConfigError, TypeError, ValueError):
        under = None
    why = not_its_rate(under, recipe) if located else None
    if why is None:
        return (lambda f: f), None
    span = f"x{located[0]:g}" if len(located) == 1 else f"x{located[0]:g}-x{located[-1]:g}"
    what = f"study {study.study_name!r}: the located lr_factor ({span} on {sum(f != 1.0 for f in stored)} allocation(s))"
    if requested == LOCATED:
        return (lambda f: f), f"{what} {why}; retraining at it anyway (--lr-factor located)"
    return (lambda f: 1.0), (f"{what} {why}; retraining every allocation at x1: pass --lr-factor located to "
                             f"apply the located factors anyway, or --lr-factor X")


def _cfg_hash(t: FrozenTrial) -> str:
    return str(t.user_attrs.get(TrialAttr.HASH) or _cfg(t).hash)


def _lr_factor(t: FrozenTrial | None) -> float:
    factor = None if t is None else t.user_attrs.get(TrialAttr.LR_FACTOR)
    return 1.0 if factor is None else float(factor)
