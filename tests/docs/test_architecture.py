"""docs/architecture.md names the package as it is: every module it names exists, and every package
under npas/ has its heading."""

from __future__ import annotations

import re

from tests.conftest import ROOT

NPAS = ROOT / "npas"
_HEADING = re.compile(r"^### `(npas(?:\.\w+)*)`\s*$")
_NAME = re.compile(r"`([a-z_][a-z0-9_]*)`")


def sections() -> dict[str, list[str]]:
    """Package -> the module names (backticked identifiers) under its heading."""
    out: dict[str, list[str]] = {}
    current = None
    for line in (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8").splitlines():
        if m := _HEADING.match(line):
            current = m.group(1)
            out[current] = []
        elif line.startswith("#"):
            current = None
        elif current is not None:
            out[current] += _NAME.findall(line)
    return out


def packages() -> set[str]:
    return {".".join(p.parent.relative_to(ROOT).parts) for p in NPAS.rglob("__init__.py")}


def test_every_module_it_names_exists():
    missing = []
    for package, names in sections().items():
        folder = ROOT.joinpath(*package.split("."))
        missing += [f"{package}.{n}" for n in names
                    if not (folder / f"{n}.py").is_file() and not (folder / n / "__init__.py").is_file()]
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


def test_every_package_has_its_heading():
    assert packages() - set(sections()) == set(), "packages docs/architecture.md does not describe"
    assert set(sections()) - packages() == set(), "headings in docs/architecture.md that are not packages"
    assert sum(len(v) for v in sections().values()) > 80  # the parser did read the module lists
