"""npas's public entry points beyond the core (``npas.count``, ``npas.search`` ...): the one table of
names that tools built on npas (benchmarks, experiments) may use, each resolved lazily as
``npas.<name>`` (``from npas import Recipe, tying_map``), so they never import an internal module and
an internal move is a one-line change here, not a broken bench.

Grouped by what they serve; a name here is public and stable, the module behind it is not.
"""

from __future__ import annotations

# name -> (module, attribute there); resolved on first use by ``npas.__getattr__``.
ENTRY_POINTS: dict[str, tuple[str, str]] = {
    # -- allocations: configs, fitting, models
    **{n: ("npas.allocation.config", n) for n in (
        "ATTN_SLOTS", "MLP_SLOTS", "AtomSpec", "ExpertPool", "block_slots", "slot_shape")},
    **{n: ("npas.allocation.fit", n) for n in ("bank_members", "fit_width", "taper_profile", "tying_map")},
    "stored_params": ("npas.allocation.budget", "stored_params"),
    "RecursionSpec": ("npas.allocation.recursion", "RecursionSpec"),
    "recursion_config": ("npas.allocation.config", "recursion_config"),
    "export_state": ("npas.allocation.transformer", "export_state"),
    "parse_space": ("npas.allocation.space_parser", "parse_space"),
    # -- training: recipes, corpora, the proxy loop and its parts
    "Recipe": ("npas.training.recipe", "Recipe"),
    "PARAMETERIZATIONS": ("npas.training.recipe", "PARAMETERIZATIONS"),
    "resolve_recipe": ("npas.training.recipe", "resolve_recipe"),  # a recipe name or path -> its file
    "SHARING_EXPONENT": ("npas.training.parameterization", "SHARING_EXPONENT"),
    "apply_init": ("npas.training.parameterization", "apply_init"),
    "train_model": ("npas.training.forks", "train_model"),  # the one loop, any schedule
    "NUMERICS_VERSION": ("npas.conversion.numerics", "NUMERICS_VERSION"),  # what a training computes: keys caches
    **{n: ("npas.training.proxy", n) for n in (
        "autocast_for", "eval_batches", "evaluate", "make_optimizer", "pick_device")},
    "bundled_text": ("npas.training.data", "bundled_text"),
    "fingerprint_text": ("npas.training.data", "fingerprint_text"),
    "SEPARATOR": ("npas.training.corpora", "SEPARATOR"),
    "cached_tokens": ("npas.training.token_cache", "cached_tokens"),
    **{n: ("npas.training.tokenizers", n) for n in ("BATCH_PIECES", "split_pieces", "train_bpe")},
    # -- conversion of a trained model
    "convert_model": ("npas.conversion", "convert_model"),
    "calibration_ids": ("npas.conversion.calibration", "calibration_ids"),
    # -- Hugging Face checkpoints in and out (transformers is imported by write_hf only)
    "read_hf_dir": ("npas.conversion.hf_source", "read_hf_dir"),
    "write_hf": ("npas.conversion.hf_export", "write_hf"),
    # -- search service (npas/service/: study/, search/, certify/, export/)
    "Launch": ("npas.service.search.launch", "Launch"),
    "NpasSearcher": ("npas.service.search.searcher", "NpasSearcher"),
    "MAX_SKIPPED_IN_A_ROW": ("npas.service.search.searcher", "MAX_SKIPPED_IN_A_ROW"),
    **{n: ("npas.service.search.samplers", n) for n in (
        "enqueue_baselines", "learns_from_infeasible", "make_sampler", "split_baseline")},
    **{n: ("npas.service.study.studies", n) for n in ("counts_toward_target", "front_trials", "is_full_fidelity",
                                               "was_evaluated")},
    "study_status": ("npas.service.study.studies", "status"),
    "StudyAttr": ("npas.service.study.record", "StudyAttr"),
    "TrialAttr": ("npas.service.study.record", "TrialAttr"),
    "open_storage": ("npas.service.study.storage", "open_storage"),
    "reachable": ("npas.service.study.storage", "reachable"),
    "init_ray": ("npas.service.execution.session", "init_ray"),
    "hypervolume": ("npas.service.study.optuna_adapter", "hypervolume"),
    "repeat_seeds": ("npas.service.execution.outcome", "repeat_seeds"),
    **{n: ("npas.service.study.ladder", n) for n in ("Ladder", "RungResult")},
    "ladder_agreement": ("npas.service.study.ladder", "agreement"),
    # the promotion rule's pure parts, for replays of cached runs under a variant of the rule
    "LadderDecision": ("npas.service.study.ladder", "Decision"),
    "ladder_decide": ("npas.service.study.ladder", "decide"),
    "ladder_rank": ("npas.service.study.ladder", "rank"),
    "ladder_objective_config": ("npas.service.search.admission", "objective_config"),
    "STOPPED_AS": ("npas.service.search.recorder", "STOPPED_AS"),  # what a trial stopped below T may be told
    # the located learning-rate rule (npas.training.located_rate): its grid and the pure next/best choice
    "LR_GRID": ("npas.training.located_rate", "DEFAULT_GRID"),
    "LR_MAX_EXTENSIONS": ("npas.training.located_rate", "MAX_EXTENSIONS"),
    "lr_locate_rung": ("npas.training.located_rate", "locate_rung"),
    "lr_next_factor": ("npas.training.located_rate", "next_factor"),
    "lr_best_factor": ("npas.training.located_rate", "best_factor"),
    **{n: ("npas.service.study.fidelity", n) for n in ("BOOTSTRAP", "mean_interval", "paired_delta", "rank_correlation")},
    "certify": ("npas.service.certify.retrain", "certify"),
    "CertifyOptions": ("npas.service.certify.retrain", "Options"),
    "certificate_table": ("npas.presentation.cli.validate", "format_table"),
}
