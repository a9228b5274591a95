"""What a Ray worker needs to run a trial (`WorkerSpec`), and the trainable that runs it there.

The driver builds one frozen `WorkerSpec` per run (`WorkerSpec.of`) and Tune hands it to every
trial; nothing in the worker reads a setting by a string key or restates a default.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from npas.allocation.config import Chassis
from npas.training.corpora import DEFAULT_GLOB, DEFAULT_TEXT_FIELD

if TYPE_CHECKING:
    from npas.service.study.record import StudyRecord
    from npas.training.data import Corpus
    from npas.training.recipe import Recipe


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
    init_from: dict[str, str] | None = None  # `search --init-from`: each worker converts this model
    corpus: Any = None  # embedded Ray: the corpus itself, shipped through the object store
    locate_lr: bool = False  # the ladder: choose each trial's rate at the rung at T/4 (npas.training.located_rate)

    @classmethod
    def of(cls, corpus: Corpus, reference: Chassis, repeats: int, init: dict | None, embed: bool) -> WorkerSpec:
        """The spec of a study on `corpus`; `embed` ships the loaded corpus (one machine, no reload)."""
        bundled = corpus.source.startswith("bundled")
        return cls(fingerprint=corpus.fingerprint, source=None if bundled else corpus.source,
                   tokenizer_json=corpus.tokenizer.to_json(), tokenizer_fingerprint=corpus.tokenizer.fingerprint,
                   glob=corpus.glob, text_field=corpus.text_field, reference=reference, repeats=repeats,
                   init_from=None if init is None else dict(init), corpus=corpus if embed else None)

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
        from npas.training.data import load_known_corpus

        if self.corpus is not None:
            return self.corpus
        return load_known_corpus(self.source, recipe.val_fraction, recipe.test_fraction, self.fingerprint,
                                 self.tokenizer_json, self.glob, self.text_field, self.tokenizer_fingerprint)


def trainable(config: dict, spec: WorkerSpec) -> None:
    """One trial: its allocation trained on `spec.repeats` seeds, one after another.

    Only the first seed reports its validation loss at each evaluation, so ASHA ranks and stops a
    trial on one seed's curve, exactly as without repeats, and decides before the other R-1 seeds
    cost anything; a trial it lets through trains the remaining seeds without reports, and the final
    report carries the mean over all seeds (`npas.service.search.outcome.combine_repeats`). A seed whose run
    fails or diverges ends the trial as failed, naming the seed: a mean without it would not be
    comparable with the other trials'.
    """
    import ray
    from ray import tune

    from npas.allocation.config import ArchConfig
    from npas.service.search.outcome import combine_repeats, repeat_seeds
    from npas.training.forks import run_proxy  # the recipe's schedule: cosine as ever, or WSD with forks
    from npas.training.recipe import Recipe

    cfg = ArchConfig.from_dict(config["allocation"])
    recipe = Recipe.from_dict(config["recipe"])
    corpus = spec.load_corpus(recipe)
    seeds = repeat_seeds(recipe.seed, spec.repeats)

    def report(step: int, val_loss: float) -> bool:
        tune.report({"val_loss": val_loss if math.isfinite(val_loss) else math.inf, "step": step, "final": False})
        return False  # ASHA stops a trial by ending it at a report, not through this return value

    def which(seed: int) -> str:
        return f"seed {seed} (repeat {seeds.index(seed) + 1} of {len(seeds)}): " if len(seeds) > 1 else ""

    node = ray.get_runtime_context().get_node_id()  # recorded so a study shows where each trial ran

    def fail(reason: str) -> None:
        tune.report({"val_loss": math.inf, "step": 0, "final": True, "node": node,
                     "proxy": json.dumps({"status": "failed", "failure_reason": reason[:1500]})})

    init_state = None
    if spec.init_from:  # every seed starts from the trained model, converted
        try:
            from npas.conversion.init_from import initial_state

            init_state = initial_state(spec.init_from, cfg, recipe.seed, corpus, recipe.seq_len)
        except Exception as e:  # a conversion that raises would raise on every retry: the trial fails
            return fail(f"converting the --init-from model raised {type(e).__name__}: {' '.join(str(e).split())}")
    runs = []
    for seed in seeds:
        run_recipe = recipe if seed == recipe.seed else Recipe.from_dict({**recipe.to_dict(), "seed": seed})
        try:
            result = run_proxy(cfg, run_recipe, corpus, report=report if seed == seeds[0] else None,
                               reference=spec.reference, init_state=init_state)
        except Exception as e:
            # raised by the run itself, so it would raise again on every retry: report it as the trial's
            # failure instead of crashing the worker (Tune retries only workers and nodes that died)
            return fail(f"{which(seed)}the proxy run raised {type(e).__name__}: {' '.join(str(e).split())}")
        if result.status != "ok" or result.val_loss is None:
            failed = result.to_dict()
            if failed.get("failure_reason"):
                failed["failure_reason"] = which(seed) + failed["failure_reason"]
            loss = result.val_loss if result.val_loss is not None else math.inf
            tune.report({"val_loss": loss, "step": result.steps_done, "final": True, "node": node,
                         "proxy": json.dumps(failed)})
            return None
        runs.append(result.to_dict())
    proxy = combine_repeats(runs, seeds)
    # Tune flattens nested result dicts; the metrics travel as one JSON string and are decoded by the searcher
    tune.report({"val_loss": proxy["val_loss"], "step": proxy["steps_done"], "final": True, "node": node,
                 "proxy": json.dumps(proxy)})
    return None
