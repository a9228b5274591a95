"""Export a chosen trial as an allocation YAML that rebuilds the exact module it trained."""

from __future__ import annotations

import logging
from pathlib import Path

import optuna
import yaml

from npas.allocation.config import ArchConfig
from npas.allocation.space_parser import parse_space
from npas.errors import NpasError, StudyError
from npas.service.export.picks import objective_names
from npas.service.export.picks import pick as choose
from npas.service.study.record import StudyAttr, TrialAttr
from npas.training.lr_factor import LR_FACTOR_KEY, LR_FACTOR_RECIPE_KEY, check_lr_factor
from npas.training.train import REFERENCE_KEY, tokenizer_beside

log = logging.getLogger(__name__)


def reference_chassis(study: optuna.Study) -> dict | None:
    """The chassis the study's proxy runs scaled every trial's learning rates and init against (its
    space's reference, bound to the study's vocabulary and budget as at launch), or None when the
    study does not record its space. `npas train` of the export passes it on, as the runner did."""
    attrs = study.user_attrs
    text = attrs.get(StudyAttr.SPACE_TEXT)
    if not text:
        return None
    over = attrs.get(StudyAttr.OVERRIDES) or {}
    try:
        space = parse_space(text, attrs.get(StudyAttr.SPACE_SOURCE) or study.study_name).rebind(over)
    except NpasError as err:  # a space an older npas wrote and this one no longer reads
        log.warning("study %s: its space no longer parses (%s); the export records no reference chassis",
                    study.study_name, str(err).splitlines()[0])
        return None
    return space.reference_chassis.to_dict()


def export(study: optuna.Study, pick: str = "knee") -> ArchConfig:
    """The allocation of the trial chosen by `pick` (knee | min-loss | max-memory=BYTES | trial=N)."""
    trial = choose(study, pick)
    cfg = ArchConfig.from_dict(trial.user_attrs[TrialAttr.ALLOC])
    if cfg.hash != trial.user_attrs.get(TrialAttr.HASH):
        raise StudyError(f"trial {trial.number}: stored allocation hash {trial.user_attrs.get(TrialAttr.HASH)} does not "
                         f"match its allocation ({cfg.hash}); the database was edited by hand")
    return cfg


def export_document(study: optuna.Study, pick: str = "knee") -> dict:
    """The YAML document `npas export` writes: allocation first, then where it came from and how it did."""
    trial = choose(study, pick)
    cfg = export(study, f"trial={trial.number}")
    names = objective_names(study)
    # the trial's located learning rate, as a factor of the recipe's fair rate: `npas train` applies it.
    # A trial that located none (every study searched without --locate-lr) writes none
    # With it, the recipe it was located under (the study's: every trial ran under it), so `npas train`
    # under another recipe knows the factor is not its own (npas.training.lr_factor.choose_factor)
    factor = trial.user_attrs.get(TrialAttr.LR_FACTOR)
    rate = {} if factor is None else {LR_FACTOR_KEY: check_lr_factor(factor, f"trial {trial.number}: lr_factor"),
                                      LR_FACTOR_RECIPE_KEY: study.user_attrs.get(StudyAttr.RECIPE)}
    return {
        "allocation": cfg.to_dict(),
        "hash": cfg.hash,
        "summary": cfg.summary(),
        REFERENCE_KEY: reference_chassis(study),  # what the trial's learning rates and init were scaled against
        **rate,
        "study": study.study_name,
        "trial": trial.number,
        "pick": pick,
        "baseline": trial.user_attrs.get(TrialAttr.BASELINE),
        "values": dict(zip(names, trial.values, strict=False)),
        "accounting": trial.user_attrs.get(TrialAttr.ACCOUNTING),
        "budget_params": study.user_attrs.get(StudyAttr.BUDGET),
        "budget_fill": trial.user_attrs.get(TrialAttr.FILL),  # stored / budget_params
        "fit_version": trial.user_attrs.get(TrialAttr.FIT_VERSION, 1),  # the fit that sampled the allocation
        "proxy": {k: v for k, v in (trial.user_attrs.get(TrialAttr.PROXY) or {}).items() if k != "curve"},
        "recipe": study.user_attrs.get(StudyAttr.RECIPE),
        "data_fingerprint": study.user_attrs.get(StudyAttr.FINGERPRINT),
        "tokenizer": study.user_attrs.get(StudyAttr.TOKENIZER, "char"),
        "tokenizer_fingerprint": study.user_attrs.get(StudyAttr.TOKENIZER_FP),
    }


def write_export(study: optuna.Study, out: str | Path, pick: str = "knee") -> dict:
    doc = export_document(study, pick)
    header = ("# npas export: rebuild with npas.build_model(npas.ArchConfig.from_yaml(open(PATH).read()))\n"
              f"# train for real: npas train {out}"
              + (f"  (at lr_factor {doc[LR_FACTOR_KEY]:g} x the recipe's fair rate, under recipe "
                 f"{(doc[LR_FACTOR_RECIPE_KEY] or {}).get('name')!r} it was located with; another recipe trains at "
                 f"x1 unless --lr-factor located)" if LR_FACTOR_KEY in doc else "")
              + "\n")
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=120))
    tok_json = study.user_attrs.get(StudyAttr.TOKENIZER_JSON)
    if tok_json is not None:  # the study's tokenizer beside its allocation: `npas train` picks it up
        tokenizer_beside(path).write_text(tok_json, encoding="utf-8")
    return doc
