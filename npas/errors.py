"""One root error for everything npas refuses, so the CLI can turn any of them into one line and exit 2."""

from __future__ import annotations


class NpasError(Exception):
    """Root of every error npas raises on purpose. The CLI prints ``str(err)`` and exits `exit_code`."""

    exit_code = 2  # a user mistake; distinct from a crash (1)


class ConfigError(NpasError):
    """An allocation (ArchConfig) or recipe that is malformed or internally inconsistent."""


class SpaceError(NpasError):
    """A search-space file with one or more problems; ``problems`` lists each, one line per problem."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = list(problems)
        n = len(self.problems)
        if n == 1:  # one problem reads best on one line
            super().__init__(f"{source}: {self.problems[0]}")
        else:
            super().__init__(f"{source}: {n} problems" + "".join(f"\n  - {p}" for p in self.problems))


class SampleError(NpasError):
    """Sampling one trial failed for a reason `load_space` could not foresee: that trial is FAILed
    with this reason (never left RUNNING, never re-enqueued); the space and the study carry on."""


class BudgetError(NpasError):
    """A budget that cannot be parsed or can never be met."""


class DataError(NpasError):
    """A corpus that is missing, empty, binary, unreadable or too small for the recipe."""


class StorageError(NpasError):
    """A storage URL that is unknown, unreachable or refuses the requested operation."""


class StudyError(NpasError):
    """A study that does not exist, does not match, or cannot be continued."""


class TrialError(NpasError):
    """A proxy run that failed for a recorded reason (non-finite loss, dead worker...)."""
