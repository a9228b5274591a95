"""npas - Neural Parameter Allocation Search.

Search where a fixed parameter budget goes in a transformer LM (pools, tapers, tying, LoRA
relaxation), holding every candidate to the budget exactly, training short proxy runs on Ray, and
keeping the Pareto front of loss against memory in an Optuna SQL study.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from npas.allocation.budget import Accounting, count, parse_budget
from npas.allocation.config import ArchConfig, Bank, Chassis, reference_config
from npas.errors import NpasError

__version__ = "0.1.0"

# Heavy parts (torch models, optuna, ray) load on first use so `import npas` stays fast.
_LAZY = {
    "build_model": "npas.allocation.transformer",
    "load_space": "npas.allocation.space_parser",
    "Space": "npas.allocation.space",
    "Candidate": "npas.allocation.space",
    "load_corpus": "npas.training.data",
    "load_recipe": "npas.training.recipe",
    "run_proxy": "npas.training.forks",  # cosine recipes run npas.training.proxy's loop as ever
    "search": "npas.service.search.driver",
    "SearchPlan": "npas.service.search.plan",
    "plan_search": "npas.service.search.plan",
    "resume": "npas.service.search.driver",
    "export": "npas.service.export.exporter",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'npas' has no attribute {name!r}")


__all__ = [
    "Accounting",
    "ArchConfig",
    "Bank",
    "Chassis",
    "NpasError",
    "count",
    "parse_budget",
    "reference_config",
    *_LAZY,
]
