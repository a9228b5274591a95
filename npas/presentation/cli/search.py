"""`npas search | resume | studies | front | export`: the search service's commands."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from npas.builtin import shipped, space_path
from npas.errors import NpasError
from npas.files import read_text
from npas.presentation.cli.args import (
    REPEATS,
    SEED,
    SEED_MAX,
    TRIALS,
    WORKERS,
    add_data_args,
    fraction_of_devices,
    text_arg,
    tokenizer_arg,
)
from npas.presentation.cli.front import print_front
from npas.service.search.samplers import SAMPLERS

STORAGE_HELP = "SQLAlchemy URL (default: $NPAS_STORAGE, else sqlite:///trials/npas.db)"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("search", help="run a multi-objective search on a space")
    p.add_argument("space", help=f"search space: a YAML path or a shipped name ({', '.join(shipped('spaces'))})")
    p.add_argument("--budget", help="override the space's budget: 0.25x, 1.5M, 250k")
    p.add_argument("--trials", type=TRIALS, help="the study's target of proxy runs, baselines included (default: 20 "
                   "for a new study, the stored target when joining one)")
    p.add_argument("--study", type=text_arg("--study"), help="study name (default: SPACE-DATE-TIME)")
    _launch_args(p)
    p.add_argument("--recipe", help="proxy recipe: a YAML path or a name, ./trials/NAME.yaml or shipped "
                   f"({', '.join(shipped('recipes'))}) (default: the space's)")
    add_data_args(p)
    p.add_argument("--budget-scope", choices=("all", "non_embedding"), default=None,
                   help="what the budget caps: all stored parameters, or all but the token and position "
                        "embeddings (default: the space's budget_scope, else all)")
    p.add_argument("--sampler", choices=SAMPLERS,
                   help="tpe (default for a new study; joining: the study's), nsga2, gp (Gaussian process) or random")
    p.add_argument("--seed", type=SEED, help=f"sampler seed, 0 to {SEED_MAX} (default: 0; joining: the study's)")
    p.add_argument("--repeats", type=REPEATS, metavar="R", help="train each trial on R seeds and rank it by their "
                   "mean; the front then shows mean ± std (default: 1 for a new study; joining: the study's)")
    p.add_argument("--locate-lr", action="store_true", default=None,
                   help="wsd recipes: choose each trial's learning rate at the ladder's highest rung below the top at or "
                        "below T/4 (else its first: T/16 on the shipped ladder recipes) from a x2 grid around its fair rate "
                        "(x0.5..x4, extended at an edge), and climb on at the best (default: off, every trial at its fair rate)")
    p.add_argument("--init-from", metavar="DENSE_DIR", help="start every trial from this `npas train` model, "
                   "converted into the candidate (npas convert), instead of a fresh init; the study reads text "
                   "with the model's tokenizer.json (another --tokenizer is refused)")
    p.set_defaults(func=run_search)

    p = sub.add_parser("resume", help="continue a study from its database after any stop")
    p.add_argument("name")
    p.add_argument("--trials", type=TRIALS, help="new target total (default: the study's)")
    p.add_argument("--space", help="the space file, checked against the one the study was created with")
    p.add_argument("--allow-space-change", action="store_true", help="continue with a changed --space")
    p.add_argument("--data", help="the corpus, if not the bundled one (must match the study's fingerprint)")
    p.add_argument("--repeats", type=REPEATS, metavar="R",
                   help="seeds per trial; must equal the study's, which resume always keeps")
    p.add_argument("--init-from", metavar="DENSE_DIR", help="where the study's starting model is now, if it "
                   "moved (its weights must be the ones the study started from)")
    p.add_argument("--tokenizer", type=tokenizer_arg, default=None,
                   help="checked against the study's stored tokenizer (default: use the study's)")
    _launch_args(p)
    p.set_defaults(func=run_resume)

    p = sub.add_parser("studies", help="list the studies in a storage")
    p.add_argument("--storage", help=STORAGE_HELP)
    p.set_defaults(func=run_studies)

    p = sub.add_parser("front", help="print a study's Pareto front")
    p.add_argument("name")
    p.add_argument("--storage", help=STORAGE_HELP)
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p.set_defaults(func=run_front)

    p = sub.add_parser("export", help="write the chosen allocation as YAML")
    p.add_argument("name")
    p.add_argument("--storage", help=STORAGE_HELP)
    p.add_argument("--pick", type=pick_arg, default="knee", help="knee | min-loss | max-memory=BYTES | trial=N")
    p.add_argument("--out", required=True, help="where to write the allocation YAML")
    p.set_defaults(func=run_export)


def pick_arg(text: str) -> str:
    from npas.service.export.picks import check_pick

    try:
        return check_pick(text)
    except NpasError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--pick ")) from None


def _launch_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage", help=STORAGE_HELP)
    p.add_argument("--ray-address", help="join a Ray cluster: auto, host:port or ray://host:port (default: local)")
    p.add_argument("--workers", type=WORKERS, default=2, help="concurrent trials")
    p.add_argument("--gpus-per-trial", type=fraction_of_devices, default=0.0,
                   help="0, a fraction below 1, or a whole number")
    p.add_argument("--no-early-stop", action="store_true", help="run every trial to full fidelity (no promotion "
                   "ladder for a wsd recipe, no ASHA for a cosine one)")
    p.add_argument("--checkpoint-storage", metavar="PATH_OR_URI",
                   help="where trials' checkpoints go (the promotion ladder resumes paused trials from them): a "
                        "absolute path or an s3:// / gs:// URI every Ray node can reach, checked before the study "
                        "is written (default: trials/runs/ray here)")
    p.add_argument("--dashboard", nargs="?", const="", default=None, metavar="DIR",
                   help="refresh the HTML report as trials complete (default DIR: dashboards/STUDY)")


def _launch(args: argparse.Namespace):
    from npas.service.search.launch import Launch

    return Launch(ray_address=args.ray_address, workers=args.workers, gpus_per_trial=args.gpus_per_trial,
                  checkpoint_storage=args.checkpoint_storage,
                  early_stop=False if args.no_early_stop else None, on_progress=_progress_printer(),
                  on_trial_done=_report_writer(args.dashboard))


def _report_dir(study, where: str) -> Path:
    return Path(where) if where else Path("dashboards") / study.study_name


def _report_writer(where: str | None):
    """After every finished trial, the HTML report rewritten when --dashboard asks for one (the
    searcher has refreshed the study's rung-to-rung agreement by then). Imported when a trial is done,
    not here: this runs before Ray is started in the background."""
    if where is None:
        return None

    def done(study) -> None:
        from npas.presentation.dashboard import write_report

        write_report(study, _report_dir(study, where))

    return done


def _final_report(study, args: argparse.Namespace) -> None:
    if args.dashboard is not None:
        from npas.presentation.dashboard import write_report

        print(f"report: {write_report(study, _report_dir(study, args.dashboard))}")


def _progress_printer():
    tty = sys.stderr.isatty()
    last = {"line": ""}

    def show(p) -> None:
        eta = p.eta()
        best = f"{p.best_loss:.4f}" if math.isfinite(p.best_loss) else "-"
        paused = f" paused {p.paused}" if p.paused else ""  # the ladder: waiting at a rung, holding no worker
        line = (f"[npas] {p.study_counted}/{p.target} trials | done {p.done} running {p.running - p.paused}{paused} "
                f"stopped {p.stopped} failed {p.failed} infeasible {p.infeasible} | best loss {best} | "
                f"front {p.front_size} | {p.elapsed:.0f}s" + (f" ETA {eta:.0f}s" if eta is not None else ""))
        if line == last["line"]:
            return
        last["line"] = line
        print(("\r" + line + "\033[K") if tty else line, end="" if tty else "\n", file=sys.stderr, flush=True)

    return show


def _start_ray(address: str | None) -> None:
    """Boot Ray's daemons in the background now, before the driver's imports (ray.tune, torch) and
    the database: they overlap, so the first trial starts seconds sooner.
    The address was checked with the rest of the input, before this."""
    from npas.service.execution.session import start_ray_early

    start_ray_early(address)


def _read_space_text(arg: str) -> str:
    return read_text(space_path(arg), "space file")


def _sampler_note(space, sampler: str) -> None:
    """GP and NSGA-II model only the knobs every candidate has; say which others they sample at random."""
    from npas.service.search.samplers import STARTUP_TRIALS, modelled_knobs

    if sampler not in ("gp", "nsga2"):
        return
    always, sometimes = modelled_knobs(space)
    if not always:
        print(f"npas search: note: --sampler {sampler} has no knob that every candidate has in this space, so it "
              f"samples every knob independently at random; use --sampler tpe to model them", file=sys.stderr)
    elif sometimes:
        print(f"npas search: note: --sampler {sampler} models {', '.join(always)} after {STARTUP_TRIALS[sampler]} "
              f"trials; {', '.join(sometimes)} exist only for some candidates and are sampled independently "
              f"(--sampler tpe models them in groups)", file=sys.stderr)


def run_search(args: argparse.Namespace) -> int:
    """Plan (every check of the input, once: one line and exit 2 on a mistake, nothing written),
    then start Ray, then run the plan."""
    from npas.allocation.space_parser import parse_space
    from npas.service.search.plan import plan_search

    space = parse_space(_read_space_text(args.space), str(space_path(args.space)))
    plan = plan_search(space, trials=args.trials, study=args.study, storage=args.storage, recipe=args.recipe,
                       data=args.data, budget=args.budget, sampler=args.sampler, seed=args.seed,
                       launch=_launch(args), repeats=args.repeats, init_from=args.init_from,
                       tokenizer=args.tokenizer, data_glob=args.data_glob, text_field=args.text_field,
                       budget_scope=args.budget_scope, locate_lr=args.locate_lr)
    from npas.service.search.join import check_join

    check_join(plan)  # a --study that exists with other settings: one line, before Ray and the notes
    _sampler_note(plan.space, plan.sampler)
    if plan.fidelity == "ladder":
        from npas.service.study.ladder import DEFAULT_ETA

        here = ""
        if plan.trials is not None:  # else a joined study's stored target, not known before it is opened
            caps = [f"{plan.trials // DEFAULT_ETA ** (k + 1)} past rung {r}" for k, r in enumerate(plan.rungs[:-1])]
            here = f" (N = {plan.trials}: {', '.join(caps)})"
        print(f"npas search: promotion ladder at rungs {', '.join(map(str, plan.rungs))} steps (eta {DEFAULT_ETA}): "
              f"every trial climbs to the first; the k-th rung sends on at most N/{DEFAULT_ETA}^k of the search's N "
              f"trials{here}, each while in the best 1/{DEFAULT_ETA} of its rung so far; a rung that sent none sends "
              f"its best once nothing else can reach it", file=sys.stderr)
        if plan.locate_lr:
            from npas.training.located_rate import DEFAULT_GRID, locate_rung

            print(f"npas search: --locate-lr: a trial promoted to rung {locate_rung(plan.recipe)} first trains "
                  f"x{', x'.join(f'{f:g}' for f in DEFAULT_GRID)} of its fair rate to it and climbs on at the best",
                  file=sys.stderr)
    _start_ray(plan.launch.ray_address)
    from npas.service.search.driver import search
    from npas.service.study.urls import redact, resolve_url

    study = search(plan)
    print(file=sys.stderr)
    print_front(study)
    _final_report(study, args)
    print(f"study {study.study_name} in {redact(resolve_url(args.storage))}; "
          f"export with: npas export {study.study_name} --out best.yaml")
    return 0


def run_resume(args: argparse.Namespace) -> int:
    from npas.service.search.plan import check_launch

    launch = check_launch(args.trials, _launch(args), args.storage, args.repeats)
    text = None
    if args.space is not None:  # read and parse it before Ray starts: a typo costs one line
        from npas.allocation.space_parser import parse_space

        text = _read_space_text(args.space)
        parse_space(text, str(space_path(args.space)))
    if args.data is not None:
        from npas.training.corpora import check_source

        check_source(args.data)  # it exists; the driver reads it with the study's glob and text field
    study = _load(args)  # read-only, before Ray: a study that is not there is one line, nothing created
    if text is not None:  # a changed space is checked against the study's record, before Ray
        from npas.service.search.plan import check_space_change
        from npas.service.study.studies import read_record

        check_space_change(args.name, read_record(study), text, args.allow_space_change)
    _start_ray(launch.ray_address)
    from npas.service.search.driver import resume_checked

    study = resume_checked(args.name, trials=args.trials, storage=args.storage, space_text=text,
                           allow_space_change=args.allow_space_change, data=args.data, launch=launch,
                           repeats=args.repeats, init_from=args.init_from, tokenizer=args.tokenizer)
    print(file=sys.stderr)
    print_front(study)
    _final_report(study, args)
    return 0


def run_studies(args: argparse.Namespace) -> int:
    from npas.service.study.optuna_adapter import study_id
    from npas.service.study.storage import open_storage
    from npas.service.study.studies import status

    handle = open_storage(args.storage, read_only=True)
    st = handle.storage
    summaries = st.get_all_studies()
    if not summaries:
        print(f"no studies in {handle.redacted}")
        return 0
    print(f"studies in {handle.redacted}:")
    for fs in summaries:
        trials = st.get_all_trials(study_id(fs), deepcopy=False)
        by: dict[str, int] = {}
        for t in trials:
            by[status(t)] = by.get(status(t), 0) + 1
        states = ", ".join(f"{k} {v}" for k, v in sorted(by.items())) or "empty"
        space = fs.user_attrs.get("space_name", "?")
        print(f"  {fs.study_name:<32} space {space:<16} {len(trials):>4} trials ({states})")
    return 0


def _load(args: argparse.Namespace):
    from npas.service.study.storage import open_storage
    from npas.service.study.studies import load

    return load(args.name, open_storage(args.storage, read_only=True))


def run_front(args: argparse.Namespace) -> int:
    print_front(_load(args), args.format)
    return 0


def run_export(args: argparse.Namespace) -> int:
    from npas.service.export.exporter import write_export
    from npas.service.export.picks import noise_note

    study = _load(args)
    doc = write_export(study, args.out, args.pick)
    vals = ", ".join(f"{k}={v:.4g}" for k, v in doc["values"].items())
    rate = f", lr_factor {doc['lr_factor']:g}" if "lr_factor" in doc else ""
    print(f"wrote {args.out}: trial {doc['trial']} ({doc['summary']}), {vals}{rate}, hash {doc['hash']}")
    note = noise_note(study, args.pick, doc["trial"])
    if note:
        print(note)
    return 0
