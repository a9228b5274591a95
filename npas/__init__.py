"""npas - Neural Parameter Allocation Search.

Search where a fixed parameter budget goes in a transformer LM (pools, tapers, tying, LoRA
relaxation), holding every candidate to the budget exactly, training short proxy runs on Ray, and
keeping the Pareto front of loss against memory in an Optuna SQL study.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from npas.allocation.budget import Accounting, count
from npas.allocation.budget_scope import parse_budget
from npas.allocation.config import ArchConfig, Bank, Chassis, reference_config
from npas.errors import (
    BudgetError,
    ConfigError,
    DataError,
    Interrupted,
    NpasError,
    RayError,
    SampleError,
    SpaceError,
    StorageError,
    StudyError,
)
from npas.version import __version__ as __version__  # re-exported: `npas.__version__`

# Heavy parts (torch models, optuna, ray) load on first use so `import npas` stays fast: name -> the
# module that defines it ("module:attr" where the public name differs). Only the names of `__all__`
# live here; tools that need more (the benchmarks, the experiments) import the module named in
# docs/architecture.md that defines it, so the public surface stays what a user scripts with.
_LAZY = {
    "build_model": "npas.allocation.transformer",
    "load_space": "npas.allocation.space_parser",
    "Space": "npas.allocation.space",
    "Candidate": "npas.allocation.space",
    "load_corpus": "npas.training.data",
    "load_recipe": "npas.training.recipe",
    "run_proxy": "npas.training.forks",  # the one loop, any schedule (cosine or wsd)
    "search": "npas.service.search.driver",
    "SearchPlan": "npas.service.search.plan",
    "plan_search": "npas.service.search.plan",
    "resume": "npas.service.search.driver",
    "export": "npas.service.export.exporter",
    "load_trained": "npas.training.train",
    "train_allocation": "npas.training.train",
    "Recipe": "npas.training.recipe",
    "Launch": "npas.service.search.launch",
    "open_storage": "npas.service.study.storage",
    "front_trials": "npas.service.study.studies",
    "StudyAttr": "npas.service.study.record",
    "TrialAttr": "npas.service.study.record",
    "certify": "npas.service.certify.retrain",
    "CertifyOptions": "npas.service.certify.retrain:Options",
    "convert_model": "npas.conversion",
    "read_hf_dir": "npas.conversion.hf_source",
    "write_hf": "npas.conversion.hf_export",
}


def _register_hf_when_imported() -> None:
    """Make `AutoModelForCausalLM.from_pretrained` read npas's Hugging Face model type once npas is
    imported, without importing transformers here (seconds): register now if transformers is loaded,
    else right after its package finishes importing (a one-shot meta-path hook)."""
    import sys

    if "transformers" in sys.modules:
        _register_hf()
        return
    import importlib.abc
    import importlib.util

    class _Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):  # noqa: ANN001
            if name != "transformers":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            if spec is None or spec.loader is None:
                return spec
            exec_module = spec.loader.exec_module

            def run(module):  # noqa: ANN001
                exec_module(module)
                _register_hf()

            spec.loader.exec_module = run
            return spec

    sys.meta_path.insert(0, _Hook())


def _register_hf() -> None:
    try:
        from npas.conversion.hf_export import register

        register()
    except Exception:  # noqa: BLE001 - a transformers npas does not support must not break `import transformers`
        pass


_register_hf_when_imported()


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, _, attr = _LAZY[name].partition(":")
        return getattr(import_module(module), attr or name)
    raise AttributeError(f"module 'npas' has no attribute {name!r}")


# The user-facing API, documented in docs/python-api.md (generated from these names' docstrings by
# `python -m npas.presentation.docs`). Nothing else is public: a name a user needs goes here (at most 45).
__all__ = [
    # search spaces and allocations: what a candidate is and costs
    "load_space", "Space", "Candidate", "count", "Accounting", "parse_budget", "build_model",
    "ArchConfig", "Chassis", "Bank", "reference_config",
    # training: a proxy run, and an exported allocation trained for real and loaded back
    "load_recipe", "Recipe", "load_corpus", "run_proxy", "train_allocation", "load_trained",
    # searching: plan, run, continue, pick
    "plan_search", "SearchPlan", "Launch", "search", "resume", "export",
    # the studies a search leaves
    "open_storage", "front_trials", "TrialAttr", "StudyAttr",
    # the fidelity certificate (npas validate)
    "certify", "CertifyOptions",
    # trained models in and out: conversion, Hugging Face checkpoints
    "convert_model", "read_hf_dir", "write_hf",
    # errors: every refusal is an NpasError with one line
    "NpasError", "ConfigError", "SpaceError", "SampleError", "BudgetError", "DataError", "StorageError",
    "StudyError", "RayError", "Interrupted",
]
