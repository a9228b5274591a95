"""The fenced blocks of README.md and docs/*.md, and which test runs each one.

A block is named by its file, the heading it sits under and its language (plus its rank under that
heading when there are several). Blocks inside a generated section (`python -m
npas.presentation.docs`) are rendered from the code, and the error examples run, by
tests/docs/test_generated_pages.py; every other block must be listed in `RUNS` with the test that runs
or loads it, which tests/docs/test_doc_blocks.py enforces in both directions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import ROOT

LANGUAGES = ("bash", "sh", "console", "python", "yaml", "json")  # what a reader runs or writes to a file
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
_FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass(frozen=True)
class Block:
    file: str  # relative to the repository root
    heading: str  # the nearest heading above it, without its #s
    language: str
    rank: int  # 0 for the first block of this language under this heading
    text: str
    generated: bool

    @property
    def key(self) -> str:
        return f"{self.file} > {self.heading} > {self.language}" + (f" #{self.rank + 1}" if self.rank else "")


def blocks(path: Path) -> list[Block]:
    out: list[Block] = []
    heading, generated, fence, body = "", False, None, []
    for line in path.read_text(encoding="utf-8").splitlines():
        if fence is not None:
            if line.startswith("```"):
                rank = sum(b.heading == heading and b.language == fence for b in out)
                out.append(Block(str(path.relative_to(ROOT)), heading, fence, rank, "\n".join(body) + "\n",
                                 generated))
                fence, body = None, []
            else:
                body.append(line)
        elif m := _FENCE.match(line):
            fence = m.group(1) or "text"
        elif line.startswith("#"):
            heading = line.lstrip("#").strip()
        elif line.startswith("<!-- generated:"):
            generated = True
        elif line.startswith("<!-- end generated:"):
            generated = False
    return out


def all_blocks() -> list[Block]:
    return [b for page in PAGES for b in blocks(page)]


def block(key: str) -> str:
    """The text of the block named `key`; a renamed heading or a moved block fails here, by name."""
    found = [b.text for b in all_blocks() if b.key == key]
    assert found, f"no block {key!r}; blocks: {[b.key for b in all_blocks()]}"
    return found[0]


def commands(text: str) -> list[str]:
    """A shell block's commands: continuation lines joined, comments and blank lines dropped."""
    import shlex

    joined = text.replace("\\\n", " ")
    return [line for line in joined.splitlines() if shlex.split(line, comments=True)]


FIRST = "README.md > npas — Neural Parameter Allocation Search > bash"
SPACE_YAML = "README.md > A search space > yaml"
SPACE_COUNT = "README.md > A search space > bash"
OWN_DATA = "README.md > Search your own data > bash"
GPU = "README.md > On a GPU box > bash"
CLUSTER = "README.md > On a Ray cluster > bash"
README_API = "README.md > The Python API > python"
SAMPLING = "docs/python-api.md > The Python API > python"
RECIPE_YAML = "docs/recipes.md > Recipes > yaml"
COMPRESS = "docs/models.md > Compress a model you trained > bash"
HF = "docs/models.md > Compress a Hugging Face model > bash"

# block -> the tests that run it (slow ones run searches or training; the fast ones take under a second)
RUNS: dict[str, tuple[str, ...]] = {
    FIRST: ("tests/stories/test_readme_first_search.py::test_the_first_command_prints_what_the_readme_shows",
            "tests/stories/test_readme.py::test_ci_runs_the_readme_test_command"),
    SPACE_YAML: ("tests/docs/test_doc_blocks.py::test_the_readme_space_loads_and_counts",),
    SPACE_COUNT: ("tests/docs/test_doc_blocks.py::test_the_readme_space_loads_and_counts",),
    OWN_DATA: ("tests/stories/test_readme_own_data.py::test_the_readme_searches_a_users_jsonl_with_bpe",),
    GPU: ("tests/stories/test_readme_gpu.py::test_the_gpu_block_runs_or_is_refused_for_want_of_a_gpu",),
    CLUSTER: ("tests/stories/test_readme_cluster.py::test_the_readme_cluster_block_runs_a_search",),
    README_API: ("tests/stories/test_readme_api.py::test_the_readme_python_api_searches_exports_and_builds",),
    SAMPLING: ("tests/docs/test_doc_blocks.py::test_sampling_snippet_runs_even_when_the_first_sample_is_infeasible",),
    RECIPE_YAML: ("tests/docs/test_doc_blocks.py::test_the_recipe_example_loads_with_the_rungs_it_states",),
    COMPRESS: ("tests/stories/test_docs_models.py::test_compress_a_model_you_trained",),
    HF: ("tests/stories/test_readme_hf.py::test_readme_hf_story_runs_offline",),
}
