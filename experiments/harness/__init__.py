"""The bench harness: what every experiment shares, so an experiment script only declares its jobs
and its report.

- ``version``: the code version a cache is keyed by (``code_version``: the declared training numerics,
  ``npas.conversion.numerics.NUMERICS_VERSION``, and the experiment's settings) and the stamp every
  cached record carries (commit, numerics version, full recipe and allocation);
- ``store``: the run cache (legacy one-JSON-per-run files and the compacted ``runs-<version>.jsonl``,
  both read; ``python -m experiments.harness compact [EXPERIMENT]`` folds the first into the second);
- ``jobs``: what an experiment declares (``Runs``: its jobs, their run files, what each trains, its
  record's label) and what the harness does with it (``run_missing``, ``cost``, ``cached``,
  ``device_specs``); ``run_spec``, the one training function;
- ``pool``: the CPU training pool (``run_pool``: spawned 1-thread workers, each record saved the moment
  it arrives, an optional time box);
- ``cli``: the shared command line of the cached benches (``bench_parser``, ``version_to_read``);
- ``report``: what the benches print alike (``format_table``, ``Columns``, a plan's ``cost_table``);
- ``experiments/device.py``: the device runner: ``export`` every GPU-ready job (each bench registers them with
  a ``device_specs()`` hook, listed in its ``GROUPS``), ``run`` them on a lent GPU, ``collect`` (which
  compacts what it unpacked).

Experiments import npas's public API only (``import npas``; ``npas.__init__`` lists the entry points).
"""
