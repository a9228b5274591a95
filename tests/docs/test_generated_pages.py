"""Each generated page of docs/ is what `python -m npas.presentation.docs` renders from today's code
(the CLI's parsers, the knob table, the recipe schema, `npas.__all__`, the refusals npas prints). A
failure here means the code changed under the page: run that command and commit the pages."""

from __future__ import annotations

import shutil

import pytest

from npas.presentation import docs
from tests.conftest import ROOT


@pytest.mark.parametrize("page", docs.PAGES)
def test_the_committed_page_is_what_the_code_renders(page):
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    fresh = docs.render_page(page, text)
    assert fresh == text, f"docs/{page} is stale: run `{docs.COMMAND}` and commit it"


def test_a_stale_page_is_found_and_rewritten(tmp_path, capsys):
    """A row dropped from a generated section (as a new flag would be missing from it) is stale; the
    command reports it, rewrites it, and then finds nothing stale."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    page = tmp_path / "docs" / "cli.md"
    text = page.read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| `--locate-lr`"))
    page.write_text(text.replace(row + "\n", ""), encoding="utf-8")
    folder = str(tmp_path / "docs")
    assert docs.main(["cli.md", "--check", "--docs", folder]) == 1
    assert "docs/cli.md is stale" in capsys.readouterr().err
    assert docs.main(["cli.md", "--docs", folder]) == 0 and "rewrote docs/cli.md" in capsys.readouterr().out
    assert page.read_text(encoding="utf-8") == text and docs.stale_pages(tmp_path / "docs", ("cli.md",)) == []


def test_a_page_without_its_markers_is_refused():
    with pytest.raises(ValueError, match="no markers for generated section"):
        docs.render_page("recipes.md", "# Recipes\n")
