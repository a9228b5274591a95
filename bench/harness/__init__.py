"""The bench harness: what every experiment shares, so an experiment script only declares its jobs
and its report.

- ``version``: the code version a cache is keyed by (``files_version``; ``bench/numerics.py`` keeps a
  recorded version while the probed numerics are unchanged);
- ``store``: the run cache (legacy one-JSON-per-run files and the compacted ``runs-<version>.jsonl``,
  both read; ``python -m bench.harness compact [EXPERIMENT]`` folds the first into the second);
- ``bench/device.py``: the device runner (export GPU-ready jobs, run them on a lent GPU, collect), the
  CPU training pool (``run_pool``), the shared command line (``bench_parser``).

Experiments import npas's public API only (``import npas``; ``npas.__init__`` lists the entry points).
"""
