"""`TrialContext`: what one trial trains, built once in the worker from Tune's config and the `WorkerSpec`
(defined here too: what every worker receives, read by the worker, the climber and its checkpoints).

The search's one trainable (`npas.service.execution.worker.trainable`) turns the config Tune hands it
into this typed, frozen context -- the allocation, the recipe, the study's corpus, the trial's seeds,
the model it starts from and how its failures are told -- and passes it whole to the way the trial
trains: whole runs on their evaluations (ASHA, or no early stopping) or a climb up the ladder's rungs
(`npas.service.execution.climber`). Neither rebuilds any of it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from npas.allocation.config import ArchConfig, Chassis
from npas.conversion.init_from import initial_state
from npas.service.execution.outcome import repeat_seeds
from npas.training.corpora import DEFAULT_GLOB, DEFAULT_TEXT_FIELD
from npas.training.data import load_known_corpus
from npas.training.init_source import InitSource
from npas.training.recipe import Recipe

if TYPE_CHECKING:
    from torch import Tensor

    from npas.service.study.record import StudyRecord
    from npas.training.data import Corpus

OBJECTIVE_PREFIX = "ladder_obj_"  # result keys of the study's other objectives (the ladder ranks on them too)
REASON_CHARS = 1500  # a failure's reason travels in one result row: cut past this


@dataclass(frozen=True)
class WorkerSpec:
    """The study's corpus, tokenizer, reference chassis, seeds per trial and starting model, as every
    worker needs them: each worker loads the study's tokenizer from `tokenizer_json` (never retrains)
    and refuses text whose fingerprint differs."""

    fingerprint: str
    source: str | None = None  # None: the bundled corpus
    tokenizer_json: str | None = None
    tokenizer_fingerprint: str | None = None
    glob: str = DEFAULT_GLOB
    text_field: str = DEFAULT_TEXT_FIELD
    # the chassis whose untied model the recipe's base lr is for: the fair parameterization scales
    # every candidate's per-group rates against it (training/parameterization.py)
    reference: Chassis | None = None
    repeats: int = 1  # seeds per trial: the trainable loops over them
    init_from: InitSource | None = None  # `search --init-from`: each worker converts this model
    corpus: Any = None  # embedded Ray: the corpus itself, shipped through the object store
    locate_lr: bool = False  # the ladder: choose each trial's rate at the rung at T/4 (npas.training.located_rate)
    ladder: bool = False  # trials climb the ladder's rungs (npas.service.execution.climber), else whole runs

    @classmethod
    def of(cls, corpus: Corpus, reference: Chassis, repeats: int, init: InitSource | None, embed: bool) -> WorkerSpec:
        """The spec of a study on `corpus`; `embed` ships the loaded corpus (one machine, no reload)."""
        bundled = corpus.source.startswith("bundled")
        return cls(fingerprint=corpus.fingerprint, source=None if bundled else corpus.source,
                   tokenizer_json=corpus.tokenizer.to_json(), tokenizer_fingerprint=corpus.tokenizer.fingerprint,
                   glob=corpus.glob, text_field=corpus.text_field, reference=reference, repeats=repeats,
                   init_from=init, corpus=corpus if embed else None)

    @classmethod
    def of_record(cls, record: StudyRecord, reference: Chassis | None) -> WorkerSpec:
        """The spec of a stored study, read from its record alone (the certificate's retrainings)."""
        return cls(fingerprint=record.data_fingerprint, source=record.data_source,
                   tokenizer_json=record.tokenizer_json, glob=record.data_glob or DEFAULT_GLOB,
                   text_field=record.text_field or DEFAULT_TEXT_FIELD, reference=reference,
                   repeats=record.repeats, init_from=record.init_from)

    @classmethod
    def embedded(cls, corpus: Corpus) -> WorkerSpec:
        """A spec that carries a loaded corpus and nothing else (tests, one-off runs)."""
        return cls(fingerprint=corpus.fingerprint, corpus=corpus)

    def load_corpus(self, recipe: Recipe) -> Corpus:
        """The study's corpus in this process: the shipped one, or loaded once and checked."""
        if self.corpus is not None:
            return self.corpus
        return load_known_corpus(self.source, recipe.val_fraction, recipe.test_fraction, self.fingerprint,
                                 self.tokenizer_json, self.glob, self.text_field, self.tokenizer_fingerprint)


@dataclass(frozen=True)
class FailurePolicy:
    """How a trial fails: whatever its run raises or wherever it diverges, the trial is *told* as failed
    with the reason (naming the seed when it has several), never raised -- a run that raised would
    raise again on every retry, and Tune retries only workers and nodes that died. ``ladder``: the row
    carries the rung reached and the steps paid (the ladder's compute counts failed trials too)."""

    ladder: bool = False

    def raised(self, what: str, err: BaseException) -> str:
        return f"{what} raised {type(err).__name__}: {' '.join(str(err).split())}"

    def row(self, reason: str, node: str, objectives: Mapping[str, float], rung: int = 0, steps: int = 0
            ) -> dict[str, Any]:
        """The final result row of a failed trial."""
        proxy: dict[str, Any] = {"status": "failed", "failure_reason": reason[:REASON_CHARS]}
        if not self.ladder:
            return {"val_loss": math.inf, "step": 0, "final": True, "node": node, "proxy": json.dumps(proxy)}
        return {"val_loss": math.inf, "rung": rung, "step": rung, "final": True, "node": node, **objectives,
                "trained_steps": steps, "proxy": json.dumps({**proxy, "steps_trained": steps})}


@dataclass(frozen=True)
class TrialContext:
    """One trial as its worker trains it: ``cfg`` under ``recipe`` on ``corpus``, once per seed of
    ``seeds`` (the recipe's own first), from ``init_from``'s weights converted when given, with the
    per-group rates of the fair parameterization taken against ``reference``."""

    cfg: ArchConfig
    recipe: Recipe
    corpus: Corpus
    seeds: tuple[int, ...]
    init_from: InitSource | None = None
    reference: Chassis | None = None
    failure: FailurePolicy = field(default_factory=FailurePolicy)
    node: str = ""  # the Ray node the trial runs on: recorded so a study shows where each trial ran
    objectives: Mapping[str, float] = field(default_factory=dict)  # the ladder: the other objectives' values
    locate_lr: bool = False  # the ladder: choose the rate at the rung at T/4 (npas.training.located_rate)
    _init: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)  # the converted state, once

    @classmethod
    def of(cls, config: Mapping[str, Any], spec: WorkerSpec, node: str = "") -> TrialContext:
        """The context of the trial Tune configured (``config``: its allocation, recipe and, under the
        ladder, its objectives' values) in the study ``spec`` describes; the corpus loaded once per process."""
        recipe = Recipe.from_dict(config["recipe"])
        return cls(cfg=ArchConfig.from_dict(config["allocation"]), recipe=recipe, corpus=spec.load_corpus(recipe),
                   seeds=repeat_seeds(recipe.seed, spec.repeats), init_from=spec.init_from,
                   reference=spec.reference, failure=FailurePolicy(ladder=spec.ladder), node=node,
                   objectives={OBJECTIVE_PREFIX + k: float(v)
                               for k, v in (config.get("ladder_objectives") or {}).items()},
                   locate_lr=spec.locate_lr)

    def seed_recipe(self, seed: int) -> Recipe:
        return self.recipe.with_seed(seed)

    def which(self, seed: int) -> str:
        """The prefix that names a seed in a failure's reason, when the trial has several."""
        if len(self.seeds) < 2:
            return ""
        return f"seed {seed} (repeat {self.seeds.index(seed) + 1} of {len(self.seeds)}): "

    def init_state(self) -> dict[str, Tensor] | None:
        """``--init-from``: the starting model converted into this allocation, once, when a run first
        needs it; every seed's run (and every run of the rate grid) starts from it. None from scratch."""
        if self.init_from is None:
            return None
        if "state" not in self._init:
            self._init["state"] = initial_state(self.init_from, self.cfg, self.recipe.seed, self.corpus,
                                                self.recipe.seq_len)
        return self._init["state"]

    def failed(self, reason: str, rung: int = 0, steps: int = 0) -> dict[str, Any]:
        """The row that tells this trial failed (``FailurePolicy.row``)."""
        return self.failure.row(reason, self.node, self.objectives, rung, steps)
