"""Shared fixtures. Tests run against the real libraries: torch, optuna, the shipped spaces."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPACES = sorted((ROOT / "search_spaces").glob("*.yaml"))

os.environ.setdefault("OMP_NUM_THREADS", "2")


@pytest.fixture(autouse=True)
def _quiet_optuna():
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    yield


@pytest.fixture
def root() -> Path:
    return ROOT


def needs(available: bool, reason: str) -> pytest.MarkDecorator:
    """Skip a test whose service (PostgreSQL ...) is missing on a developer machine; in CI (CI=true)
    run it anyway, so a service that failed to start fails the run instead of skipping it."""
    return pytest.mark.skipif(not available and os.environ.get("CI") != "true", reason=reason)
