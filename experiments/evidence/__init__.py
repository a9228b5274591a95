"""Evidence for docs/RESULTS.md: one script per experiment, run as scripts.

Shared plumbing, one concept a module: common.py (the setting: chassis, recipe, command line,
budget fitting), runs.py (the training pool and its per-run cache), stats.py (paired intervals and
verdicts), report.py (tables, JSON, figures) and searches.py (the search experiments' studies).
"""
