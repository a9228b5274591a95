"""Tokens a search spends: the promotion ladder against ASHA and against every trial trained to T, on
the same candidates (issue #34 item 6).

    python experiments/ladder_tokens.py             # tests/data/tiny.yaml, 16 trials, T = 160 steps, 2 workers (~4 min)
    python experiments/ladder_tokens.py --quick     # 8 trials, T = 80

Three real searches (real Ray, real training, SQLite) of the same space with the same random sampler
and seed, so the same candidates in the same order (checked: their allocation hashes are printed
equal or the run says they are not):

- ``ladder``: a ``schedule: wsd`` recipe of T steps, rungs T/16, T/4, T (a recipe's when it names none),
  early stopping on: every trial climbs, and the k-th rung sends on at most floor(N / 4**k) trials,
  each while in the best quarter of its rung so far (``npas/service/study/ladder.py``); the rest stop
  where they are. ``experiments/results/ladder_tokens/`` was measured under the rule before that cap
  (baselines never paused, a noise tie promoted one more);
- ``asha``: the same recipe with ``schedule: cosine``: npas's ASHA (reduction 3, grace one evaluation,
  stops at evaluation points; the baselines run to T under both);
- ``all-to-T``: the wsd recipe with ``--no-early-stop``.

Tokens = optimizer steps actually trained x the recipe's tokens per step: a trial's recorded
``trained_steps`` (the top rung reached plus its cooldown forks) under wsd, its ``fidelity`` (steps
trained) under cosine. Printed per search with the trials that reached T and the wall time; the
ratios ladder / all-to-T and ladder / asha. The ladder's target in issue #34 (<= 0.5 x N x T) is
measured on 24 candidates by experiments/proxy_fidelity.py's ladder row; this bench says what each
mechanism spends at a small scale, where the 3 baselines (always run to T) weigh heavily.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import optuna  # noqa: E402

from npas import Launch, TrialAttr, load_recipe, load_space, search  # noqa: E402

SPACE = ROOT / "tests" / "data" / "tiny.yaml"
FAST = ROOT / "tests" / "data" / "fast.yaml"


def recipe_file(d: Path, schedule: str, steps: int) -> str:
    base = load_recipe(FAST).to_dict()
    r = {**base, "name": f"tokens-{schedule}", "steps": steps, "eval_every": max(1, steps // 16),
         "schedule": schedule}
    if schedule == "wsd":
        r.update(horizon=steps, rungs=[steps // 16, steps // 4, steps])
    path = d / f"{schedule}.yaml"
    path.write_text(json.dumps(r))  # JSON is YAML
    return str(path)


def spent(study: optuna.Study, tokens_per_step: int) -> dict:
    trials = [t for t in study.get_trials(deepcopy=False) if TrialAttr.FIDELITY in t.user_attrs]
    steps = sum(int(t.user_attrs.get(TrialAttr.TRAINED_STEPS, t.user_attrs[TrialAttr.FIDELITY])) for t in trials)
    top = int(study.user_attrs.get("recipe", {}).get("steps", 0)) or max(t.user_attrs[TrialAttr.FIDELITY] for t in trials)
    return {"trials": len(trials), "at_t": sum(t.user_attrs[TrialAttr.FIDELITY] >= top for t in trials),
            "steps": steps, "tokens": steps * tokens_per_step, "top": top,
            "hashes": [t.user_attrs.get(TrialAttr.HASH) for t in sorted(trials, key=lambda t: t.number)]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="8 trials, T = 80 steps")
    ap.add_argument("--trials", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None, help="T (default 160, quick 80)")
    args = ap.parse_args(argv)
    n = args.trials or (8 if args.quick else 16)
    steps = args.steps or (80 if args.quick else 160)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = load_space(SPACE)
    print(f"npas bench: tokens spent, {SPACE.relative_to(ROOT)}, {n} trials, T = {steps} steps, random sampler "
          f"seed 0, 2 workers")
    out = {}
    with tempfile.TemporaryDirectory(prefix="npas-lt-") as d:
        d = Path(d)
        arms = {"ladder": ("wsd", None), "asha": ("cosine", None), "all-to-T": ("wsd", False)}
        for arm, (schedule, early) in arms.items():
            path = recipe_file(d, schedule, steps)
            rec = load_recipe(path)
            t0 = time.perf_counter()
            study = search(space, trials=n, study=arm, storage=f"sqlite:///{d}/{arm}.db", recipe=path,
                           sampler="random", seed=0, launch=Launch(workers=2, early_stop=early))
            out[arm] = {**spent(study, rec.batch_size * rec.seq_len), "wall": time.perf_counter() - t0}
    same = len({tuple(o["hashes"]) for o in out.values()}) == 1
    print(f"candidates: {'the same ' + str(n) + ' in the same order in all three' if same else 'NOT the same'}")
    print(f"{'arm':<10}{'trials':>7}{'at T':>6}{'steps':>9}{'tokens':>12}{'x N x T':>9}{'wall s':>8}")
    for arm, o in out.items():
        print(f"{arm:<10}{o['trials']:>7}{o['at_t']:>6}{o['steps']:>9,}{o['tokens']:>12,}"
              f"{o['steps'] / (o['trials'] * steps):>9.3f}{o['wall']:>8.1f}")
    lad, full, asha = out["ladder"], out["all-to-T"], out["asha"]
    print(f"ladder / all-to-T tokens = {lad['tokens'] / full['tokens']:.3f}; ladder / asha = "
          f"{lad['tokens'] / asha['tokens']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
