"""A study in SQL storage: where it lives (`storage`, `urls`), what it records (`record`), reading its
trials back (`studies`, `tally`, `noise`), its name (`names`), and Optuna's private APIs (`optuna_adapter`)."""
