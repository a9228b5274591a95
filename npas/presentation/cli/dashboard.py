"""`npas dashboard NAME`: write a study's HTML report; `--live` also serves optuna-dashboard on it."""

from __future__ import annotations

import argparse
from pathlib import Path

from npas.errors import NpasError
from npas.presentation.cli.args import int_in


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dashboard", help="write a study's HTML report (Pareto front, allocations, curves)")
    p.add_argument("name", help="study name (as given to `npas search --study`)")
    p.add_argument("--out", default=None, help="output folder (default: dashboards/NAME)")
    p.add_argument("--storage", default=None, help="storage URL (default: $NPAS_STORAGE or sqlite:///trials/npas.db)")
    p.add_argument("--live", action="store_true",
                   help="then serve optuna-dashboard on the same storage until Ctrl-C (pip install npas[dashboard])")
    p.add_argument("--port", type=int_in(1, 65535, 8080), default=8080, help="port for --live (default: 8080)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from npas.presentation.dashboard import write_report
    from npas.service.study.storage import open_storage
    from npas.service.study.studies import load

    serve = _server() if args.live else None  # fail before the report if the extra is missing
    handle = open_storage(args.storage, read_only=True)
    study = load(args.name, handle)
    path = write_report(study, Path(args.out) if args.out else Path("dashboards") / args.name)
    print(f"wrote {path}")
    if serve is not None:
        print(f"optuna-dashboard serving study {args.name!r} at http://127.0.0.1:{args.port} (Ctrl-C stops it)",
              flush=True)
        try:
            serve(handle.storage, host="127.0.0.1", port=args.port)
        except KeyboardInterrupt:  # the normal way to stop a foreground server, not an error
            print("optuna-dashboard stopped")
        except OSError as e:  # port taken, no permission
            raise NpasError(f"optuna-dashboard cannot listen on 127.0.0.1:{args.port}: {e.strerror or e}; "
                            f"pick another --port") from None
    return 0


def _server():
    try:
        from optuna_dashboard import run_server
    except ImportError:
        raise NpasError("--live needs optuna-dashboard, an optional extra: pip install 'npas[dashboard]'") from None
    return run_server
