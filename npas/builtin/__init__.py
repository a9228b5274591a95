"""What ships inside the package: the Shakespeare corpus, the search spaces and the proxy recipes.

The YAML files live here, in the package, so a non-editable `pip install` carries them and `npas search
full --recipe smoke` works from any directory. The checkout's `search_spaces/` (a link to `spaces/`) and
`trials/*.yaml` (links to `recipes/*.yaml`) are the same files under the paths the README uses, never
copies; `tests/stories/test_packaging.py` fails if they drift apart.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Literal

from npas.errors import SpaceError, closest

Kind = Literal["spaces", "recipes"]


def shipped_dir(kind: Kind) -> Path:
    """The directory of shipped `kind` files. npas installs as plain files (Ray workers and the CLI
    read them by path), so the package resource is a real directory."""
    return Path(str(resources.files(__name__).joinpath(kind)))


def shipped(kind: Kind) -> dict[str, Path]:
    """Name (file stem) -> path of every shipped `kind` file, sorted by name."""
    d = shipped_dir(kind)
    return {p.stem: p for p in sorted(d.glob("*.yaml"))} if d.is_dir() else {}


def looks_like_path(text: str) -> bool:
    """A YAML file name or anything with a directory part is a path; a bare word is a shipped name."""
    return text.endswith((".yaml", ".yml")) or "/" in text or "\\" in text


def find_named(kind: Kind, name: str, local_dir: str) -> Path | None:
    """A bare `name` as `<cwd>/<local_dir>/<name>.yaml` (a project's own files win), else the shipped
    file of that name, else None."""
    for ext in (".yaml", ".yml"):
        local = Path.cwd() / local_dir / f"{name}{ext}"
        if local.is_file():
            return local
    return shipped(kind).get(name)


def space_path(arg: str) -> Path:
    """The search-space file a user named: an existing path, or a bare name such as `full` (see
    `find_named`). Raises SpaceError naming the shipped spaces when neither exists."""
    p = Path(arg).expanduser()
    if p.is_file():
        return p
    if p.is_dir():
        raise SpaceError(arg, ["is a directory; give a search-space YAML file or a shipped name"])
    names = sorted(shipped("spaces"))
    found = None if looks_like_path(arg) else find_named("spaces", arg, "search_spaces")
    if found is None:
        raise SpaceError(arg, [f"no such file, and no shipped space of that name{closest(p.stem, names)}; pass a "
                               f"YAML path or one of the shipped names: {', '.join(names)}"])
    return found
