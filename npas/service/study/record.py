"""What an npas study stores in Optuna's user attributes: the study's record and its trials' keys.

The attribute names are what plain Optuna, optuna-dashboard and older npas versions read, so they
never change: a study written by any earlier npas loads through `StudyRecord.from_attrs`. Everything
a resume or a joining driver needs lives in the record; nothing about a study is stored outside it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from enum import StrEnum
from typing import Any

from npas.errors import StudyError
from npas.training.init_source import InitSource, as_init_source


class StudyAttr(StrEnum):
    """Keys of `study.user_attrs`; the values are the names stored in the database."""

    VERSION = "npas_version"
    SPACE_TEXT = "space_text"
    SPACE_HASH = "space_hash"
    SPACE_NAME = "space_name"
    SPACE_SOURCE = "space_source"
    BUDGET = "budget_params"
    BUDGET_SPEC = "budget_spec"
    REFERENCE = "reference_params"
    RECIPE = "recipe"
    DATA = "data_source"
    FINGERPRINT = "data_fingerprint"
    VOCAB = "vocab_size"
    OBJECTIVES = "objectives"
    SAMPLER = "sampler"
    SEED = "seed"
    EARLY_STOP = "early_stop"
    TARGET = "target_trials"
    OVERRIDES = "overrides"  # vocab_size / budget bound at launch, re-applied on resume
    SPLIT = "data_split"  # how the text was cut into train / validation / test, with each part's fingerprint
    REPEATS = "repeats"  # training seeds per trial (`npas search --repeats R`); the objective is their mean
    INIT_FROM = "init_from"  # {"dir", "weights", "config_hash"}: the trained model trials start from
    TOKENIZER = "tokenizer"  # the spec the study was started with: char, bpe:N or a tokenizer.json path
    TOKENIZER_JSON = "tokenizer_json"  # the tokenizer itself, serialized: resume and workers load it, never retrain
    TOKENIZER_FP = "tokenizer_fingerprint"  # sha256 of tokenizer_json, 16 hex chars
    DATA_GLOB = "data_glob"  # files read from a directory corpus
    TEXT_FIELD = "text_field"  # JSONL field / Parquet column holding the documents
    # {"origin", "dir", "weights", "similarity"}: the trained model learned sharing groups cluster by
    # (npas.service.search.learned) and its (L, L) layer similarity; resume and joiners read the matrix from here
    LEARNED = "learned_source"
    LOCATE_LR = "locate_lr"  # `--locate-lr`: each trial's rate is chosen at the ladder's rung at T/4
    READY = "npas_ready"  # written last at creation: a study without it is still being set up


class RetrainAttr(StrEnum):
    """Keys of the trials of a study's linked validation study (``"{study}:validate"``, written by
    `npas validate`: value = test loss), readable by plain Optuna; and the linked study's own key."""

    SOURCE = "source_trial"  # the searched trial the retrained allocation came from (None: not searched)
    SEED = "seed"  # the fresh training seed of this retraining
    RECIPE = "recipe"  # the long recipe's name
    TEST_LOSS = "test_loss"
    HASH = "allocation_hash"
    KEY = "job_key"  # allocation x seed: a retraining that completed never runs again
    ROLES = "roles"  # why it was retrained: front, sample, baseline, pick, memory_matched
    SPLIT = "split"
    ALLOC = "allocation"
    DRIVER = "driver"  # the `npas validate` process that runs it (study.faults.driver_id)
    REASON = "failure_reason"
    SOURCE_STUDY = "source_study"  # a user attr of the linked study itself: the searched study's name
    LR_FACTOR = "lr_factor"  # the source trial's located learning-rate factor it was retrained at; absent = 1


class TrialAttr(StrEnum):
    """Keys of `trial.user_attrs`."""

    STATUS = "npas_status"  # ok | failed | stopped | infeasible | duplicate | orphaned | interrupted | surplus
    REASON = "failure_reason"
    BASELINE = "baseline"  # name of the hand-crafted baseline, or absent
    BASELINE_FIXED = "baseline_fixed"  # a baseline's values that are not Optuna params (npas.service.search.samplers)
    KNOBS = "knobs"
    ALLOC = "allocation"
    HASH = "allocation_hash"
    ACCOUNTING = "accounting"
    PROXY = "proxy"
    FIDELITY = "fidelity"  # steps trained
    MAX_FIDELITY = "max_fidelity"  # steps the recipe asks for
    CURVE = "curve"
    KEY = "trial_key"  # same allocation, recipe and data -> same key
    FILL = "budget_fill"  # stored (budgeted) params / the budget, exact to 6 decimals
    SHORT = "budget_short"  # why a candidate stores under the fill target (npas.allocation.fill); absent: it does not
    FIT_VERSION = "fit_version"  # the fit that sampled the allocation (npas.allocation.fill.FIT_VERSION); absent = 1
    DRIVER = "driver"  # which driver process claimed the trial
    RETRY_OF = "retry_of"
    NODE = "ray_node"
    SAME_AS = "same_as"  # for a duplicate: the trial whose result stands
    RETRIES = "retries"  # times Ray Tune restarted the trial after its worker or node died
    SEEDS = "seeds"  # the training seeds of its repeats, in repeat order (npas.service.execution.outcome.repeat_seeds)
    SEED_LOSSES = "seed_losses"  # the validation loss of each seed, same order; the loss objective is their mean
    LOSS_STD = "seed_loss_std"  # sample std (ddof=1) of seed_losses; None with one seed
    # wsd recipes: {"t": loss of a WSD run of length t} at every rung passed, the loss the ladder ranked the trial
    # on there (under --locate-lr: at the fair rate below the locating rung, the located run's from it up)
    RUNG_LOSSES = "rung_losses"
    # --locate-lr: the located run's own {"t": loss} at every rung it passed, those below the locating rung included
    # (at the located factor: not what the ladder ranked there); absent on a study written before it was kept
    LOCATED_RUNG_LOSSES = "located_rung_losses"
    TRAINED_STEPS = "trained_steps"  # wsd: optimizer steps actually run, all seeds (top rung + forks, each)
    TOP_RUNG = "top_rung"  # the ladder: the highest rung the trial reached (== fidelity)
    LADDER = "ladder"  # the ladder, while running: {"objectives", "promoted": [rungs]} (rung_exchange)
    LADDER_CHECKPOINT = "ladder_checkpoint"  # the ladder: the trial's last climb checkpoint (a paused trial resumes from it)
    # the ladder: the trial's directory in the run's storage (path or URI), recorded as it starts: where every
    # checkpoint it writes goes, so a retry finds one written just before a crash, and the search's clean-up
    # finds them wherever the run's storage was
    LADDER_DIR = "ladder_trial_dir"
    STEPS_BEFORE = "steps_before_retry"  # a re-enqueued trial: the steps its earlier attempt had trained (trained_steps)
    LOST_STEPS = "lost_steps"  # the ladder: steps earlier attempts trained past their last checkpoint (in trained_steps)
    LR_FACTOR = "lr_factor"  # located rate: the chosen factor of the recipe's fair rate
    LR_GRID_STEPS = "lr_grid_steps"  # located rate: steps of the rate grid's runs not kept (apart from trained_steps)


class Constraint(StrEnum):
    """Optuna constraint names (`trial.set_constraint`); a trial is feasible when all are <= 0."""

    BUDGET = "budget"  # stored params minus the budget
    FIDELITY = "fidelity"  # the fraction of steps an early-stopped trial did not train
    FIT = "fit"  # 1.0 on an infeasible ask told COMPLETE so the sampler learns (nothing fits the budget)


@dataclass(frozen=True)
class StudyRecord:
    """A study's settings as stored: the truth that `resume` and joining drivers read back.

    Fields added after the first release have defaults equal to what those early studies ran with,
    so their records load unchanged.
    """

    version: str
    space_text: str
    space_hash: str
    space_name: str
    space_source: str
    budget_params: int
    budget_spec: str
    reference_params: int
    recipe: Mapping[str, Any]
    data_source: str | None  # None: the bundled corpus
    data_fingerprint: str
    vocab_size: int
    objectives: tuple[str, ...]
    sampler: str = "tpe"
    seed: int | None = 0
    early_stop: bool = True
    target_trials: int = 20
    overrides: Mapping[str, Any] = field(default_factory=dict)
    data_split: Mapping[str, Any] | None = None  # None: a study from before the text-level split
    repeats: int = 1  # training seeds per trial; 1 is what every study before `--repeats` ran
    tokenizer: str = "char"  # studies from before tokenizers were stored ran on characters
    tokenizer_json: str | None = None  # None: rebuild the character vocabulary from the text (old studies)
    tokenizer_fingerprint: str | None = None
    data_glob: str = "**/*.txt"  # npas.training.corpora.DEFAULT_GLOB
    text_field: str = "text"  # npas.training.corpora.DEFAULT_TEXT_FIELD
    init_from: InitSource | None = None  # `--init-from`: the model trials start from (stored as its mapping)
    learned: dict | None = None  # learned groups' source and layer similarity; None: the space learns no groups
    locate_lr: bool = False  # each trial's rate located at the rung at T/4; studies before it ran at the fair rate

    # field name -> stored attribute name (the two differ where the database name predates the record)
    _KEYS = {"version": StudyAttr.VERSION, "space_text": StudyAttr.SPACE_TEXT, "space_hash": StudyAttr.SPACE_HASH,
             "space_name": StudyAttr.SPACE_NAME, "space_source": StudyAttr.SPACE_SOURCE,
             "budget_params": StudyAttr.BUDGET, "budget_spec": StudyAttr.BUDGET_SPEC,
             "reference_params": StudyAttr.REFERENCE, "recipe": StudyAttr.RECIPE, "data_source": StudyAttr.DATA,
             "data_fingerprint": StudyAttr.FINGERPRINT, "vocab_size": StudyAttr.VOCAB,
             "objectives": StudyAttr.OBJECTIVES, "sampler": StudyAttr.SAMPLER, "seed": StudyAttr.SEED,
             "early_stop": StudyAttr.EARLY_STOP, "target_trials": StudyAttr.TARGET,
             "overrides": StudyAttr.OVERRIDES, "data_split": StudyAttr.SPLIT, "repeats": StudyAttr.REPEATS,
             "tokenizer": StudyAttr.TOKENIZER, "tokenizer_json": StudyAttr.TOKENIZER_JSON,
             "tokenizer_fingerprint": StudyAttr.TOKENIZER_FP, "data_glob": StudyAttr.DATA_GLOB,
             "text_field": StudyAttr.TEXT_FIELD, "init_from": StudyAttr.INIT_FROM, "learned": StudyAttr.LEARNED,
             "locate_lr": StudyAttr.LOCATE_LR}
    _OMITTED_AT_DEFAULT = frozenset({"locate_lr"})

    def to_attrs(self) -> dict[str, Any]:
        """Plain JSON-able values keyed by their stored names (the ready marker is separate: it is
        written last, after the baselines, by `mark_ready`)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in self._OMITTED_AT_DEFAULT and value == f.default:
                continue  # a study that does not use it is stored as before it existed
            if isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, Mapping):
                value = dict(value)
            out[str(self._KEYS[f.name])] = value
        return out

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any], study: str = "?") -> StudyRecord:
        """Read a stored record; a missing required key means the study was not made by npas (or
        its creator died while writing it)."""
        values: dict[str, Any] = {}
        missing = []
        for f in fields(cls):
            key = str(cls._KEYS[f.name])
            if key in attrs:
                values[f.name] = attrs[key]
            elif f.default is MISSING and f.default_factory is MISSING:
                missing.append(key)
        if missing:
            raise StudyError(f"study {study!r} has no npas record ({', '.join(missing)} missing); it was not "
                             f"created by npas, or its creator stopped while setting it up")
        values["objectives"] = tuple(values["objectives"])
        values["overrides"] = dict(values.get("overrides") or {})
        values["repeats"] = int(values.get("repeats", 1))
        values["init_from"] = as_init_source(values.get("init_from"))
        return cls(**values)

    def corpus_args(self) -> dict[str, Any]:
        """What reloads the study's corpus exactly (``training.data.load_known_corpus`` keywords, less
        the recipe's split fractions): the text's source and fingerprint and the stored tokenizer."""
        return {"source": self.data_source, "fingerprint": self.data_fingerprint,
                "tokenizer_json": self.tokenizer_json, "glob": self.data_glob, "text_field": self.text_field}

    def with_target(self, target: int) -> StudyRecord:
        return replace(self, target_trials=int(target))


def is_ready(attrs: Mapping[str, Any]) -> bool:
    return bool(attrs.get(StudyAttr.READY))
