"""Reference pages of docs/ rendered from the code they describe, so the docs cannot drift from it.

A page mixes prose written by hand with generated sections, each between two markers::

    <!-- generated:KEY (python -m npas.presentation.docs) -->
    ...
    <!-- end generated:KEY -->

`render_page` replaces what lies between each pair with a fresh rendering and leaves the prose as it
is; `python -m npas.presentation.docs` rewrites the pages in place and `--check` only reports the stale
ones (exit 1), which is what the docs tests do. A page's generated sections come from:

- cli.md: the argparse parsers of `npas` (every command, argument, choice and default);
- search-spaces.md: the knob table (`npas.allocation.knob_table`), the space file's top-level keys and
  the shipped spaces with their hand-crafted baselines as `npas count` fits them;
- recipes.md: the `Recipe` dataclass (each field's type, default and the comment beside it) and the
  shipped recipes;
- python-api.md: the names in `npas.__all__` with their signatures and docstrings;
- errors.md: the one-line refusals of a list of mistaken commands, run in-process as a user would.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

from npas.presentation.docs import api_page, cli_page, errors_page, recipe_page, space_page

COMMAND = "python -m npas.presentation.docs"
DOCS = Path(__file__).resolve().parents[3] / "docs"  # a checkout's docs/; pass --docs elsewhere
_MARK = re.compile(r"(<!-- generated:(?P<key>[\w-]+) \(" + re.escape(COMMAND) + r"\) -->\n)(?P<body>.*?)"
                   r"(<!-- end generated:(?P=key) -->)", re.S)


def _sections() -> dict[str, dict[str, Callable[[], str]]]:
    """page -> {section key -> renderer}."""
    return {
        "cli.md": {"commands": cli_page.render},
        "search-spaces.md": {"example": space_page.render_example, "file-keys": space_page.render_file_keys, "knobs": space_page.render_knobs,
                             "settings": space_page.render_settings, "shipped-spaces": space_page.render_shipped},
        "recipes.md": {"recipe-keys": recipe_page.render_keys, "shipped-recipes": recipe_page.render_shipped},
        "python-api.md": {"api": api_page.render},
        "errors.md": {"errors": errors_page.render},
    }


PAGES = ("cli.md", "search-spaces.md", "recipes.md", "python-api.md", "errors.md")


def render_page(page: str, text: str) -> str:
    """`text` (the page as committed) with every generated section rendered afresh.

    A section the page lacks, or a marker naming no known section, is an error: a page that silently
    kept an old section, or dropped one, is exactly the drift this module exists to prevent."""
    renderers = _sections()[page]
    found: list[str] = []

    def fresh(m: re.Match) -> str:
        key = m.group("key")
        if key not in renderers:
            raise ValueError(f"docs/{page}: unknown generated section {key!r}; known: {', '.join(renderers)}")
        found.append(key)
        body = renderers[key]().rstrip("\n") + "\n"
        return m.group(1) + body + m.group(4)

    out = _MARK.sub(fresh, text)
    missing = [k for k in renderers if k not in found]
    if missing:
        raise ValueError(f"docs/{page}: no markers for generated section(s) {', '.join(missing)}")
    return out


def stale_pages(docs: Path = DOCS, pages: tuple[str, ...] = PAGES) -> list[str]:
    """The pages whose committed text differs from a fresh rendering."""
    stale = []
    for page in pages:
        text = (docs / page).read_text(encoding="utf-8")
        if render_page(page, text) != text:
            stale.append(page)
    return stale


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=COMMAND, description="Regenerate the generated sections of docs/.")
    p.add_argument("pages", nargs="*", metavar="PAGE", help=f"some of {', '.join(PAGES)} (default: all)")
    p.add_argument("--check", action="store_true", help="only report stale pages (exit 1 if any)")
    p.add_argument("--docs", type=Path, default=DOCS, help=f"the docs folder (default: {DOCS})")
    args = p.parse_args(argv)
    if unknown := [page for page in args.pages if page not in PAGES]:
        p.error(f"unknown page(s) {', '.join(unknown)}; the generated pages are {', '.join(PAGES)}")
    stale = stale_pages(args.docs, tuple(args.pages) or PAGES)
    if args.check:
        for page in stale:
            print(f"docs/{page} is stale: run `{COMMAND}`", file=sys.stderr)
        return 1 if stale else 0
    for page in stale:
        path = args.docs / page
        path.write_text(render_page(page, path.read_text(encoding="utf-8")), encoding="utf-8")
        print(f"rewrote docs/{page}")
    if not stale:
        print("docs/ is up to date")
    return 0
