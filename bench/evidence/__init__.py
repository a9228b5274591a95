"""Evidence for docs/RESULTS.md: one script per experiment, shared plumbing in common.py (run them as scripts)."""
