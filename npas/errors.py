"""One root error for everything npas refuses, so the CLI can turn any of them into one line and exit 2."""

from __future__ import annotations

import difflib


def format_problems(source: str, problems: list[str]) -> str:
    """One problem on one line (`source: problem`); several as a count, then one indented line each,
    so a user fixes a file in one pass."""
    if len(problems) == 1:
        return f"{source}: {problems[0]}"
    return f"{source}: {len(problems)} problems" + "".join(f"\n  - {p}" for p in problems)


def closest(word: str, allowed: list[str] | tuple[str, ...]) -> str:
    """'; did you mean X?' when a close match exists, else '': the fix a message names for a mistyped key."""
    match = difflib.get_close_matches(str(word), [str(a) for a in allowed], n=1, cutoff=0.6)
    return f"; did you mean {match[0]!r}?" if match else ""


class NpasError(Exception):
    """Root of every error npas raises on purpose. The CLI prints ``str(err)`` and exits `exit_code`."""

    exit_code = 2  # a user mistake; distinct from a crash (1)


class ArgumentError(NpasError, TypeError):
    """A Python API argument of the wrong type (`npas.search(space, trials="3")`, an unknown keyword):
    an NpasError in one line, as the CLI gives for the same mistake, and a TypeError, as Python callers
    expect of a wrong type."""


class ConfigError(NpasError):
    """An allocation (ArchConfig) or recipe that is malformed or internally inconsistent."""


class SpaceError(NpasError):
    """A search-space file with one or more problems; ``problems`` lists each, one line per problem."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = list(problems)
        super().__init__(format_problems(source, self.problems))


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


class RayError(NpasError):
    """Ray could not be started, reached (address, authentication), or lacks the resources asked for."""


class Interrupted(StudyError):
    """A search (running trials recorded and re-enqueued) or a certificate's retrainings (completed
    ones kept) stopped by SIGINT/SIGTERM; rerunning the same command continues."""

    exit_code = 130  # the shell's convention for a run stopped by Ctrl-C


class TrialError(NpasError):
    """A proxy run that failed for a recorded reason (non-finite loss, dead worker...)."""
