"""A numerics fingerprint for the benches' run caches: keep a cache's code version while the numbers
its runs would produce are unchanged.

Every cached bench run is keyed by a *legacy* code version, ``bench/device.py: files_version``: a
hash of the CONTENT of the npas files that decide a loss plus the bench's shared settings. Any edit
of those files re-keys every cached run, even one that leaves every existing configuration
bit-for-bit identical (a rule table, a new chassis family, a new schedule beside the old one). So
each bench's ``code_version`` asks ``keyed`` instead:

1. compute the legacy version as before;
2. compute the experiment's **probe** (below), a hash of what the training code does to this
   experiment's own configurations;
3. look the probe up in the experiment's committed table, ``bench/results/numerics/<experiment>.json``
   (``{probe: legacy version}``): found, the recorded version is returned and every cached key stays
   put; not found, the legacy version is returned (a genuinely new version, as before) and one line
   says the numerics changed.

Who asks: ``bench/proxy_fidelity.py``, ``bench/lr_transfer.py`` and the evidence pool
(``bench/evidence/runs.py: run_jobs``, one probe per experiment's jobs, one shared table
``evidence.json``). Not ``bench/evidence/taper_scale.py`` (GPU-only runs at d_model 256: its probe
costs minutes on CPU, and its cache was made at e984e29, whose npas cannot run today's bench code to
be probed) nor ``conversion.py``'s ``runs.code_version()`` calls without jobs: those keep the file hash.

The probe, on 1 CPU thread, for every distinct (mechanisms, recipe without seed and learning rate,
reference chassis) of the experiment's runs, where ``mechanisms`` is an allocation's parameter names
and config with sizes abstracted (one allocation per signature, the smallest: every mechanism the
experiment uses is trained, not every size of it; proxy_fidelity's 12 candidates are 12 signatures):
build the model with a fixed seed, train ``K_STEPS`` real steps through
``npas.training.proxy.train_model`` (the function every bench run goes through) under the recipe cut
to ``K_STEPS`` steps of at most ``PROBE_BATCH`` windows (the recipe's batch size changes no code
path, only the cost) with one evaluation batch, and hash every parameter and buffer after the steps
(bytes) with the train and validation losses. Only outputs are hashed (sorted), never a config's
JSON, so adding a config field whose default changes nothing keeps the probe. For every distinct full recipe it also
hashes the learning-rate schedule at EVERY step (``Recipe.lr_at``: cheap, and sees a schedule edit
that acts late) and the recipe's fields (a field added later and left at its default is ignored, so
adding an option does not move old experiments). ``NUMERICS_EPOCH`` and ``K_STEPS`` are in the hash.

Two fingerprints, two tables. The exact probe (a hash of the bytes) is equal only on one kind of
machine: other CPUs' kernels round differently (moving from an Intel to an AMD host on 2026-12-02
re-keyed every cache). So each training also yields *values* (its losses and three positive moments
of every tensor, float64), recorded beside the hash in ``<experiment>.values.json``; a probe whose
hash is unknown still resolves to the version whose values it matches (``close``). Matching is
outlier-tolerant, because Adam's first steps amplify rounding where a gradient is near zero (the
update ``m/sqrt(v)`` flips sign): measured on proxy_fidelity's 4,732 values between an AMD EPYC and
an Intel Xeon host, the median relative difference is 1.9e-8, the 99th percentile 1.9e-6, but 4 values
move by 1.0e-5 to 4.1e-5. A changed rule moves most values: the first group's learning-rate
multiplier times 1.001 puts 41% of them beyond 1e-5 and its largest at 2.2e-3. So values match when
at most ``OUTLIER_FRACTION`` (1%) of them differ by more than ``RTOL`` (1e-5) and none by more than
``RTOL_MAX`` (1e-3).

What the probe cannot see (bump ``NUMERICS_EPOCH`` by hand, or do not record the new probe, when an
edit does one of these):
- a change acting only after ``K_STEPS`` steps, other than the learning-rate schedule (e.g. a
  clipping or optimizer-state rule that only bites late, a data-order change past the first batch);
- an evaluation change beyond the first validation batch, or in the test split's scoring;
- a change that depends on the learning rate itself other than through the schedule (one training
  per signature runs at the first learning rate the experiment lists), or one that acts only on a
  size of a mechanism the probe's smallest allocation of that signature does not have;
- GPU-only paths (autocast dtypes, fused kernels): the probe runs on CPU in float32;
- ``init_state`` (weights a conversion run starts from) and anything a job passes beside
  (allocation, recipe, reference).

``record`` adds ``{probe: legacy version}`` to a table; run it (``NPAS_RECORD_PROBE=1`` with any bench,
or ``python bench/numerics.py record EXPERIMENT``) only with the code the runs cached under that
version were made with, so the table states a fact: "these numerics are those of version V". To
migrate a cache made at an older commit: check that commit out (``git worktree add``), put a
directory holding only its ``npas`` first on PYTHONPATH (this checkout's bench after it), check that
its ``files_version`` gives the cached runs' version V, and record with ``--as V`` (or
``NPAS_RECORD_PROBE=V``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import struct
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, fields, is_dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness.jobs import corpus  # noqa: E402  (the benches' one corpus cache)

NUMERICS_EPOCH = 1  # bump by hand for a numerics change the probe cannot see (module docstring)
K_STEPS = 2  # real training steps per probed allocation
PROBE_SEED = 0  # init and batch order of every probe run, whatever seeds the experiment uses
PROBE_BATCH = 4  # training windows per probe step (at most): the same code path as the recipe's batch, cheaper
# Another machine's kernels round differently: its probe values differ from the recording machine's by
# ~1e-8 relative (median) after K_STEPS steps, a few by up to ~4e-5 (Adam's sign flips where a gradient
# is near zero), while a numerics change (an init, an update rule, a schedule) moves most values by far
# more (module docstring: the measured figures).
RTOL = 1e-5  # a value within this is equal
OUTLIER_FRACTION = 0.01  # at most this share of values may lie beyond RTOL ...
RTOL_MAX = 1e-3  # ... and none beyond this
ATOL = 1e-9
TABLES = ROOT / "bench" / "results" / "numerics"
# Recipe fields when the probe was written: these are hashed as they are; a field added later is
# hashed only when it is set away from its default (a new option must not move old experiments).
RECIPE_FIELDS_V1 = ("name", "seq_len", "batch_size", "steps", "lr", "min_lr", "weight_decay", "warmup_steps",
                    "betas", "grad_clip", "eval_every", "eval_batches", "seed", "dtype", "threads",
                    "val_fraction", "test_fraction", "parameterization", "data", "version")
NOT_NUMERICS = ("name", "seed")  # the probe fixes the seed; a recipe's name is only a label

Run = tuple[Any, Any, Any]  # (ArchConfig, Recipe, reference Chassis or None)
_MEMO: dict[tuple[str, str, str], str] = {}


# ------------------------------------------------------------------------------------------ probe
def recipe_fields(recipe: Any) -> dict[str, Any]:
    """The recipe's fields that decide numbers: today's fields as they are, later ones only when set
    away from their default; name and seed dropped."""
    defaults = {f.name: f.default for f in fields(type(recipe))}
    out = {}
    for k, v in recipe.to_dict().items():
        if k in NOT_NUMERICS or (k not in RECIPE_FIELDS_V1 and k in defaults and v == defaults[k]):
            continue
        out[k] = v
    return out


def _ref_dict(reference: Any) -> dict[str, Any] | None:
    if reference is None:
        return None
    if isinstance(reference, dict):
        return dict(reference)
    return asdict(reference) if is_dataclass(reference) else dict(reference.__dict__)


def _short(recipe: Any) -> Any:
    """The recipe cut to K_STEPS steps of at most PROBE_BATCH windows, one evaluation batch at the end,
    on the probe seed."""
    from npas import Recipe

    return Recipe.from_dict({**recipe.to_dict(), "steps": K_STEPS, "warmup_steps": min(recipe.warmup_steps, K_STEPS),
                             "eval_every": K_STEPS, "eval_batches": 1, "seed": PROBE_SEED,
                             "batch_size": min(recipe.batch_size, PROBE_BATCH)})


def _train(cfg: Any, recipe: Any, reference: Any) -> tuple[bytes, list[float]]:
    """One probe training: (its bitwise digest, its values). The digest is exact but belongs to one
    machine (another CPU's kernels round differently); the values (losses and three positive moments
    of every tensor, float64) match across machines within ``RTOL``."""
    import torch

    from npas import Chassis, train_model

    ref = _ref_dict(reference)
    short = _short(recipe)
    model, res = train_model(cfg, short, corpus(short), device="cpu",
                             reference=None if ref is None else Chassis(**ref))
    h = hashlib.sha256()
    values: list[float] = [float(res.steps_done), float(res.status == "ok"), float(res.train_loss),
                           float(res.val_loss)]
    for name, t in sorted(model.state_dict().items()):
        t32 = t.detach().to("cpu", torch.float32).contiguous()
        h.update(name.encode() + b"\0" + t32.numpy().tobytes())
        x = t32.to(torch.float64).flatten()
        # positive terms only (no cancellation, so a relative tolerance means something); the fixed
        # weights see a permutation
        w = 1.0 + 0.5 * torch.cos(torch.arange(x.numel(), dtype=torch.float64))
        values += [float(x.abs().sum()), float((x * x).sum()), float((x.abs() * w).sum())]
    h.update(json.dumps([res.status, res.steps_done, res.train_loss, res.val_loss]).encode())
    return h.digest(), values


_SIG: dict[str, tuple[list[Any], int, str]] = {}


def _shape(v: Any) -> Any:
    """A config value with its sizes abstracted: a number is '#', a list of integers says only whether
    its entries are all equal, all distinct or repeat (uniform/tapered widths, untied/tied/cycled
    blocks), other lists become the set of their items' shapes."""
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, int | float):
        return "#"
    if isinstance(v, dict):
        return {k: _shape(x) for k, x in sorted(v.items())}
    if isinstance(v, list | tuple):
        if v and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            return "equal" if len(set(v)) == 1 else "distinct" if len(set(v)) == len(v) else "repeats"
        return sorted({json.dumps(_shape(x), sort_keys=True) for x in v})
    return repr(type(v))


def _signature(cfg: Any) -> tuple[list[str], int, str]:
    from npas import build_model

    key = cfg.to_json()
    if key not in _SIG:
        model = build_model(cfg)
        names = sorted({re.sub(r"\d+", "#", n) for n in model.state_dict()})
        _SIG[key] = ([names, _shape(json.loads(key))], sum(t.numel() for t in model.state_dict().values()), getattr(cfg, "hash", key))
    return _SIG[key]


def mechanisms(cfg: Any) -> list[Any]:
    """What an allocation is made of, sizes aside: its parameter and buffer names with every index
    replaced by '#' (banks and their generators, LoRA, atoms, experts, gates...) and its config with
    sizes abstracted (``_shape``: tied or untied blocks, uniform or tapered widths...). The probe
    trains one allocation per distinct signature (the smallest), so every mechanism an experiment uses
    is trained, not every size of it."""
    return _signature(cfg)[0]


def _size(cfg: Any) -> tuple[int, str]:
    return _signature(cfg)[1], _signature(cfg)[2]


def _schedule_bytes(recipe: Any) -> bytes:
    return struct.pack(f"<{recipe.steps}d", *(recipe.lr_at(s) for s in range(recipe.steps)))


def _schedule_values(recipe: Any) -> list[float]:
    lr = [recipe.lr_at(s) for s in range(recipe.steps)]
    return [float(len(lr)), math.fsum(lr), math.fsum(x * x for x in lr), math.fsum(i * x for i, x in enumerate(lr)),
            *(lr[int(q * (len(lr) - 1))] for q in (0.0, 0.1, 0.5, 0.8, 0.9, 1.0))]


def measure(runs: Iterable[Run]) -> tuple[str, dict[str, Any]]:
    """The numerics fingerprint of an experiment's runs (module docstring): the exact probe (16 hex
    digits, one machine's) and its values (every machine's, compared within ``RTOL``)."""
    import torch

    runs = list(runs)
    trained: dict[str, tuple[Any, Any, Any]] = {}  # one training per (allocation, recipe sans lr, reference)
    recipes: dict[str, Any] = {}
    for cfg, recipe, ref in runs:
        r = recipe_fields(recipe)
        recipes.setdefault(json.dumps(r, sort_keys=True), recipe)
        short = {k: v for k, v in recipe_fields(_short(recipe)).items() if k not in ("lr", "min_lr")}
        key = json.dumps([mechanisms(cfg), short, _ref_dict(ref)], sort_keys=True)
        if key not in trained or _size(cfg) < _size(trained[key][0]):
            trained[key] = (cfg, recipe, ref)
    h = hashlib.sha256(f"npas-numerics epoch {NUMERICS_EPOCH} k {K_STEPS} seed {PROBE_SEED} batch {PROBE_BATCH}\n"
                       .encode())
    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        done = {key: _train(*run) for key, run in trained.items()}
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(det)
    # only outputs are hashed, in their own order: a config field added later (at a default that
    # changes nothing) must not move the probe
    for digest in sorted(d for d, _ in done.values()):
        h.update(digest)
    for key in sorted(recipes):
        h.update(key.encode() + b"\0" + _schedule_bytes(recipes[key]))
    values = {"epoch": NUMERICS_EPOCH, "k": K_STEPS, "seed": PROBE_SEED, "batch": PROBE_BATCH,
              "trainings": sorted(v for _, v in done.values()),
              "schedules": sorted(_schedule_values(recipes[k]) for k in recipes)}
    return h.hexdigest()[:16], values


def probe(runs: Iterable[Run]) -> str:
    """The exact probe alone (16 hex digits; equal only on one machine)."""
    return measure(runs)[0]


def _relative(a: Any, b: Any, out: list[float]) -> bool:
    """Append the relative difference of every pair of numbers of `a` and `b` to `out` (relative to the
    larger magnitude, with a floor of ``ATOL``); False when their structures or non-numbers differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_relative(a[k], b[k], out) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_relative(x, y, out) for x, y in zip(a, b, strict=True))
    if isinstance(a, int | float) and isinstance(b, int | float):
        d = abs(a - b)
        out.append(0.0 if d <= ATOL else d / max(abs(a), abs(b)))
        return True
    return a == b


def close(a: Any, b: Any, rtol: float | None = None) -> bool:
    """Two probes' values are one machine's rounding of the other's: the same structure, at most
    ``OUTLIER_FRACTION`` of the numbers (rounded up) beyond ``rtol`` (default ``RTOL``) and none beyond
    ``RTOL_MAX`` (module docstring: what another CPU and what a changed rule do to them)."""
    rtol = RTOL if rtol is None else rtol
    rel: list[float] = []
    if not _relative(a, b, rel):
        return False
    beyond = sum(r > rtol for r in rel)
    return beyond <= math.ceil(OUTLIER_FRACTION * len(rel)) and max(rel, default=0.0) <= RTOL_MAX


# ------------------------------------------------------------------------------------------ table
def table_path(experiment: str) -> Path:
    return TABLES / f"{experiment}.json"


def values_path(experiment: str) -> Path:
    return TABLES / f"{experiment}.values.json"


def read_table(experiment: str) -> dict[str, str]:
    p = table_path(experiment)
    return json.loads(p.read_text()) if p.exists() else {}


def read_values(experiment: str) -> list[dict[str, Any]]:
    p = values_path(experiment)
    return json.loads(p.read_text()) if p.exists() else []


def record(experiment: str, probe_hash: str, legacy: str, values: dict[str, Any] | None = None) -> None:
    """Add {probe: legacy version} to the experiment's table, and the probe's values to its values
    table (only with the code the cached runs of `legacy` were made with, or code whose probe equals
    that code's)."""
    table = read_table(experiment)
    if table.get(probe_hash) not in (None, legacy):
        print(f"[numerics] {experiment}: probe {probe_hash} already stands for version {table[probe_hash]}; "
              f"not re-recorded as {legacy}", flush=True)
        return
    table[probe_hash] = legacy
    p = table_path(experiment)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(dict(sorted(table.items())), indent=1) + "\n")
    if values is not None:
        rows = read_values(experiment)
        if not any(r["version"] == legacy and close(r["values"], values) for r in rows):
            rows.append({"version": legacy, "values": values})
            values_path(experiment).write_text(json.dumps(rows, indent=1) + "\n")
    print(f"[numerics] {experiment}: recorded probe {probe_hash} -> version {legacy} in {p.relative_to(ROOT)}",
          flush=True)


def resolve(experiment: str, legacy: str, probe_hash: str, values: dict[str, Any] | None = None) -> str:
    """The code version to key runs by: the table's version for this probe (exact, this machine's
    kind), else the version whose recorded values this probe's values match within ``RTOL`` (any
    machine), else ``legacy``."""
    rec = os.environ.get("NPAS_RECORD_PROBE")
    if rec:  # "1": the current legacy version; else the version to record (migrating from older code)
        record(experiment, probe_hash, legacy if rec == "1" else rec, values)
    known = read_table(experiment).get(probe_hash)
    if known is not None:
        return known
    if values is not None:
        matches = sorted({r["version"] for r in read_values(experiment) if close(r["values"], values)})
        if len(matches) == 1:
            return matches[0]
        if matches:
            print(f"[numerics] {experiment}: probe values match versions {matches}; code version {legacy}",
                  flush=True)
            return legacy
    print(f"[numerics] {experiment}: numerics changed (probe {probe_hash} not in "
          f"{table_path(experiment).relative_to(ROOT)}, values in none of {values_path(experiment).name}); "
          f"code version {legacy}", flush=True)
    return legacy


def keyed(experiment: str, legacy: str, runs: Callable[[], Sequence[Run]] | Sequence[Run]) -> str:
    """What a bench's ``code_version`` returns: ``legacy`` unless the probe of ``runs`` (a list, or a
    function giving it, so a bench can build its runs lazily) is in the experiment's table."""
    runs = list(runs() if callable(runs) else runs)
    if not runs:
        return legacy
    memo = (experiment, legacy, hashlib.sha256(json.dumps(
        [[c.to_json(), r.to_dict(), _ref_dict(x)] for c, r, x in runs], sort_keys=True).encode()).hexdigest())
    if memo not in _MEMO:
        _MEMO[memo] = resolve(experiment, legacy, *measure(runs))
    return _MEMO[memo]


# ------------------------------------------------------------------------------------------ experiments
def proxy_fidelity_runs(mod: Any, setup: Any) -> list[Run]:
    """Every candidate of the original table (the first ``n_full``: the horizon rows' added candidates
    train under the same code and would only move the fingerprint) under both parameterizations at the
    proxy recipe; the mid and long recipes' schedules (their only difference) ride along as extra
    recipes of the same trainings."""
    from npas import PARAMETERIZATIONS, Recipe

    _, cands = mod.load_candidates(setup)
    cands = cands[:getattr(setup, "n_full", len(cands))]  # the original table's candidates: what its version keys
    ref = mod.REFERENCE[0]
    out = []
    for base in (setup.proxy, setup.mid, setup.long):
        for par in PARAMETERIZATIONS:
            r = Recipe.from_dict({**base.to_dict(), "parameterization": par})
            out += [(c.config, r, ref) for c in cands]
    return out


def lr_transfer_runs(mod: Any, setup: Any) -> list[Run]:
    """Every arm under both parameterizations; the grid's learning rates as schedules."""
    from npas import PARAMETERIZATIONS

    cfgs = mod.arms(setup.reference, setup.lora_ranks)
    return [(cfgs[a], mod.recipe_for(setup, mod.Job(a, lr, setup.seeds[0], par)), setup.reference)
            for a in cfgs for par in PARAMETERIZATIONS for lr in setup.grid]


def evidence_runs(jobs: Sequence[dict[str, Any]]) -> list[Run]:
    """The evidence pool's jobs (bench/evidence/runs.py) as (allocation, recipe, reference)."""
    from npas import ArchConfig, Recipe

    return [(ArchConfig.from_dict(j["config"]), Recipe.from_dict(j["recipe"]), j.get("reference")) for j in jobs]


def _cli_runs(experiment: str) -> tuple[str, list[Run]]:
    """(legacy version, runs) of a bench experiment at this checkout's code, as its code_version sees them."""
    sys.path.insert(0, str(ROOT / "bench" / "evidence"))
    from bench.device import load_module
    from bench.harness.version import files_version

    if experiment == "proxy_fidelity":
        mod = load_module("bench/proxy_fidelity.py")
        setup = mod.make_setup(False, None, None, None, 1)
        return files_version(mod.VERSIONED, mod.version_settings(setup)), proxy_fidelity_runs(mod, setup)
    if experiment == "lr_transfer":
        mod = load_module("bench/lr_transfer.py")
        setup = mod.Setup(mod.REFERENCE, mod.RECIPE, mod.GRID, mod.SEEDS, mod.LORA_RANKS, mod.RESULTS, 1)
        return files_version(mod.VERSIONED, mod.version_settings(setup)), lr_transfer_runs(mod, setup)
    raise SystemExit(f"unknown experiment {experiment!r}: one of proxy_fidelity, lr_transfer "
                     "(evidence experiments: run the script with --plan and NPAS_RECORD_PROBE=1)")


def main(argv: list[str] | None = None) -> int:
    import time

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=("show", "record"), help="show: probe, legacy and resolved version; "
                   "record: add {probe: legacy} to the table (only at the code the cached runs were made with)")
    p.add_argument("experiment", help="proxy_fidelity | lr_transfer")
    p.add_argument("--as", dest="as_version", default=None,
                   help="record: the version to record (default: this checkout's legacy version); for migrating, "
                        "with an older npas first on PYTHONPATH whose files_version gave that version")
    a = p.parse_args(argv)
    legacy, runs = _cli_runs(a.experiment)
    t0 = time.perf_counter()
    ph, values = measure(runs)
    import npas

    print(f"{a.experiment}: legacy version {legacy} (of this checkout's files), probe {ph} "
          f"({time.perf_counter() - t0:.1f} s, {len(runs)} runs; npas from {Path(npas.__file__).parent})", flush=True)
    if a.action == "record":
        record(a.experiment, ph, a.as_version or legacy, values)
    print(f"{a.experiment}: code version {resolve(a.experiment, legacy, ph, values)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
