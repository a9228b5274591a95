"""What may name a study: one safe path component, checked by the CLI's parser and by the driver.

A study's name becomes folder names (Ray Tune's run folder under trials/runs, the learned-groups
pretraining folder), so `../../x` once wrote outside trials/runs and 300 characters crashed with
OSError after the study was half made. Nothing here imports more than `re`, so the CLI checks a
name while it parses the command line.
"""

from __future__ import annotations

import re

STUDY_NAME_MAX = 128  # Ray Tune's run folder is NAME-<unix time>, trial folders go below it: far below 255
_STUDY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def study_name_problem(name: str) -> str | None:
    """Why `name` cannot name a study, or None: letters, digits, '.', '_' and '-', starting with a
    letter or digit (no `/`, no `..`, no leading dot or dash), at most `STUDY_NAME_MAX` characters."""
    if not _STUDY_NAME.fullmatch(name):
        return (f"study name {name!r} may hold only letters, digits, '.', '_' and '-', starting with a letter "
                f"or digit (it names folders under trials/runs); e.g. tiny-run-1")
    if len(name) > STUDY_NAME_MAX:
        return f"study name of {len(name)} characters is too long; give at most {STUDY_NAME_MAX}"
    return None
