"""The `npas` command line. Each command lives in its own module with `register(subparsers)`.

Only this package prints. Any `NpasError` becomes one line on stderr and exit code 2, so scripts
and CI can tell a user mistake (2) from a crash (1) and from an interrupted search (130).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from importlib import import_module

from npas.errors import NpasError
from npas.presentation.cli.args import Parser, harden

# A closed registry: command modules are named here, never loaded from strings in user files.
COMMAND_MODULES = ("count", "train", "search", "dashboard", "validate", "convert")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="npas", description="Neural Parameter Allocation Search")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        import_module(f"npas.presentation.cli.{name}").register(sub)
    harden(parser)  # the same check for a flag of one meaning in every command (args.CHECKS)
    return parser


def _exit_without_ray_shutdown(code: int) -> None:
    """Exit now if this command began starting Ray in the background (`npas search/resume`), after
    a finished run or a user error.

    Whatever the study holds is already committed by then (a finished run's trials, or, for an
    error, whatever came before it: most come before any trial ran), so nothing depends on Ray, and
    its graceful shutdown at exit would add seconds to a one-line error and to every search. The embedded daemons are fate-shared with this process and die with
    it; a cluster the command only connected to is left as it was. Interrupts (exit 130) still
    shut Ray down gracefully."""
    runner = sys.modules.get("npas.service.execution.session")  # not imported: this command never started Ray
    if runner is None or not runner.ray_start_begun():
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# commands that tokenize a corpus, here or in their workers, and so may write the token cache
TOKENIZING = ("search", "resume", "train", "validate", "convert")


def _check_environment(command: str) -> None:
    """Environment variables that can never work (NPAS_CACHE naming a file), refused before a command
    touches a database or starts Ray: otherwise a worker would find out, trial after trial."""
    if command in TOKENIZING:
        from npas.training.token_cache import check_cache_dir

        check_cache_dir()


def one_line(message: str) -> str:
    """`message` as one line, unless it is a list of problems (`errors.format_problems`: a count, then
    one `  - ` line each). A YAML parser's or a library's error spans lines (a caret under a column, a
    traceback-like dump); a user gets the whole of it, with its line breaks folded into spaces."""
    lines = message.splitlines()
    if len(lines) <= 1 or all(ln.startswith("  - ") for ln in lines[1:]):
        return message
    return " ".join(message.split())


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # a refused argument (exit 2, its one line already printed) or --help (0):
        return e.code if isinstance(e.code, int) else 2  # returned, so in-process callers get a code as for any error
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        _check_environment(args.command)
        code = int(args.func(args) or 0)
    except NpasError as e:
        print(f"npas {args.command}: error: {one_line(str(e))}", file=sys.stderr)
        if argv is None and e.exit_code == 2:  # the `npas` process itself, on an error (not an interrupt)
            _exit_without_ray_shutdown(e.exit_code)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"npas {args.command}: interrupted", file=sys.stderr)
        return 130
    if argv is None and code == 0:  # the `npas` process itself, after a finished run
        _exit_without_ray_shutdown(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
