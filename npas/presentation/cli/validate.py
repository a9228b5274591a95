"""`npas validate NAME`: the fidelity certificate of a study (see npas.service.certify.retrain)."""

from __future__ import annotations

import argparse
import json
import sys

from npas.errors import StudyError
from npas.presentation.cli.train import lr_factor_arg

STORAGE_HELP = "SQLAlchemy URL (default: $NPAS_STORAGE, else sqlite:///trials/npas.db)"
DESCRIPTION = """\
Retrain the study's K best front points, the picked point and M other completed trials (spread
over the proxy-loss range, baselines always included) on S fresh seeds with a longer recipe, score
them on the held-out test split, and report how well the proxy's ranking holds: Kendall tau and
Spearman rho with 95% bootstrap intervals (all trials and front points alone), rank flips among
front points, seed noise, signal-to-noise (about 1 = noise), what FLOPs and size alone explain, and
what the pick buys over dense untied models at equal memory and at about equal compute.

Defaults (--top 4 --sample 4 --seeds 2 --recipe long --workers 2 --threads 1) retrain about 12
allocations (the front points, the study's 3-4 baselines, 4 sampled trials and a FLOPs-matched dense
model) x 2 seeds, two at a time; at the proxy's ~0.5M-parameter scale on 2 CPU cores a long run
takes ~9 minutes on one core, so about 2 hours in all. Stop it at any time: rerun the same
command and completed retrainings are not run again. Results are in the linked Optuna study
NAME:validate and in the study's user attr fidelity_certificate."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="retrain the front and a sample longer on fresh seeds: the fidelity "
                                        "certificate", description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", help="study name")
    p.add_argument("--pick", default="knee", help="the point matched baselines are compared with: knee | "
                                                   "min-loss | max-memory=BYTES | trial=N (default knee)")
    p.add_argument("--top", type=int, default=4, help="front points with the lowest loss to retrain (default 4)")
    p.add_argument("--sample", type=int, default=4,
                   help="other completed trials, spread over the proxy-loss range; the baselines are always "
                        "retrained on top of these (default 4)")
    p.add_argument("--recipe", default="long", help="training recipe: trials/NAME.yaml or a name (default long)")
    p.add_argument("--seeds", type=int, default=2, help="fresh seeds per allocation, >= 2 (default 2)")
    p.add_argument("--workers", type=int, default=2,
                   help="concurrent retrainings on Ray (default 2); 0 runs them one by one without Ray")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads per retraining (default 1: two one-thread runs on 2 cores beat one "
                        "two-thread run)")
    p.add_argument("--lr-factor", type=lr_factor_arg, default=None, metavar="X|located",
                   help="retrain at X times the recipe's fair learning rate; default: each trial's located factor "
                        "when --recipe has the rate of the study's recipe (under which it was located), else 1; "
                        "`located`: the located factors whatever the recipe")
    p.add_argument("--ray-address", help="join a Ray cluster: auto, host:port or ray://host:port (default: local)")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--storage", help=STORAGE_HELP)
    p.set_defaults(func=run_validate)


def _progress(done: int, total: int) -> None:
    print(f"[npas validate] {done}/{total} retrainings done", file=sys.stderr, flush=True)


def _note(text: str) -> None:
    print(f"npas validate: note: {text}", file=sys.stderr, flush=True)


def run_validate(args: argparse.Namespace) -> int:
    from npas.service.certify.retrain import Options, certify
    from npas.service.study.urls import check_url
    from npas.training.recipe import load_recipe

    opts = Options(pick=args.pick, top=args.top, sample=args.sample, recipe=args.recipe, seeds=args.seeds,
                   workers=args.workers, threads=args.threads, ray_address=args.ray_address,
                   lr_factor=getattr(args, "lr_factor", None), on_progress=_progress, on_note=_note)
    problems = opts.problems()
    if problems:  # all of them, before the database or Ray is touched
        raise StudyError("; ".join(problems))
    load_recipe(args.recipe)  # a missing or invalid recipe names itself here
    check_url(args.storage)  # a malformed storage URL fails here, without connecting
    if args.ray_address:
        from npas.service.execution.session import check_address_reachable

        check_address_reachable(args.ray_address)
    import optuna

    if not args.verbose:
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "study created" line for the linked study
    cert = certify(args.name, opts, storage=args.storage)
    print(json.dumps(cert, indent=2) if args.format == "json" else format_table(cert))
    return 0


def _iv(d: dict | None, fmt: str = "{:+.3f}") -> str:
    if not d or d.get("value") is None:
        return "-"
    if d.get("low") is None:
        return fmt.format(d["value"]) + " [no interval]"
    return f"{fmt.format(d['value'])} [{fmt.format(d['low'])}, {fmt.format(d['high'])}]"


def _num(x: float | None, fmt: str = "{:.3f}") -> str:
    return "-" if x is None else fmt.format(x)


def format_table(c: dict) -> str:
    """The certificate as a few lines of text: what was retrained, then each statistic in one line."""
    seeds = ", ".join(str(s) for s in c["seeds"])
    out = [f"fidelity certificate of study {c['study']}: recipe {c['recipe']} ({c['recipe_steps']} steps), "
           f"seeds {seeds}, scored on the {c['split']} split",
           f"{c['complete']}/{c['planned']} allocations complete, {c['retrainings']} retrainings in "
           f"{c['linked_study']}"]
    if c["split"] != "test":
        out.append("  note: this build has no test split yet; scores are on the validation split the search saw")
    out.append("")
    out.append(f"{'trial':>5}  {'roles':<34} {'proxy':>7} {'test mean':>9} {'± std':>7}  allocation")
    for r in c["allocations"]:
        trial = "-" if r["trial"] is None else str(r["trial"])
        roles = ",".join(r["roles"]) + (f" ({r['label']})" if r["label"] else "")
        out.append(f"{trial:>5}  {roles[:34]:<34} {_num(r['proxy_loss'], '{:.4f}'):>7} "
                   f"{_num(r['test_mean'], '{:.4f}'):>9} {_num(r['test_std'], '{:.4f}'):>7}  {r['summary']}")
    if c.get("bits_per_byte_per_nat"):
        bpb = c["bits_per_byte_per_nat"]
        pick = next((r for r in c["allocations"] if r["trial"] == c["pick"]["trial"]), None)
        shown = "" if pick is None or pick.get("test_mean") is None else \
            f"; picked trial {pick['trial']}: {pick['test_mean'] * bpb:.4f} bits per byte"
        out.append(f"bits per byte = test loss (nats) x {bpb:.4f} on these test windows{shown}")
    out.append("")
    for label, key in (("all validated trials", "all"), ("front points", "front")):
        g = c[key]
        out.append(f"{label:<22} n={g['n']:<3} Kendall tau {_iv(g['kendall_tau'], '{:.2f}')}   "
                   f"Spearman rho {_iv(g['spearman_rho'], '{:.2f}')}")
    f = c["rank_flips"]
    out.append(f"rank flips among front points: {f['flips']} of {f['pairs']} pairs")
    out.append(f"seed noise: {_num(c['seed_std'], '{:.4f}')} nats per run, paired std {_num(c['paired_std'], '{:.4f}')}")
    out.append(f"signal-to-noise: {_num(c['snr'], '{:.2f}')} (about 1 = the differences are seed noise)")
    sc = c["size_and_compute"]
    out.append(f"loss explained by size and compute alone (R²): FLOPs/token {_num(sc['r2_flops'], '{:.2f}')}, "
               f"materialised non-embedding params {_num(sc['r2_materialised'], '{:.2f}')}, "
               f"both {_num(sc['r2_both'], '{:.2f}')}")
    m = c["matched"]
    out.append(f"picked trial {c['pick']['trial']} ({c['pick']['summary']}) minus matched dense untied, "
               f"test loss (negative = the allocation is better):")
    out.append(f"  equal stored params (narrow_untied): {_iv(m['memory']['delta'])}")
    ratio = m["compute"]["flops_ratio"]
    out.append(f"  about equal FLOPs/token ({m['compute']['label'] or '-'}, FLOPs ratio "
               f"{_num(ratio, '{:.4f}')}): {_iv(m['compute']['delta'])}")
    return "\n".join(out)
