"""Every block a reader may run or copy from README.md and docs/ is run by a test (`blocks.RUNS` says
which), and the blocks that take under a second run here."""

from __future__ import annotations

import ast
import contextlib
import functools
import io

import pytest
import yaml

from tests.conftest import ROOT
from tests.docs import blocks as b


def _test_exists(node: str) -> bool:
    path, _, name = node.partition("::")
    tree = ast.parse((ROOT / path).read_text())
    return any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body)


def test_every_block_is_run_by_a_named_test_and_every_named_test_exists():
    found = {blk.key for blk in b.all_blocks() if blk.language in b.LANGUAGES and not blk.generated}
    unclaimed = sorted(found - set(b.RUNS))
    assert not unclaimed, f"blocks no test runs (add each to tests/docs/blocks.py RUNS with its test): {unclaimed}"
    gone = sorted(set(b.RUNS) - found)
    assert not gone, f"RUNS names blocks that no longer exist (renamed heading?): {gone}"
    missing = sorted({node for nodes in b.RUNS.values() for node in nodes if not _test_exists(node)})
    assert not missing, f"RUNS names tests that do not exist: {missing}"


def test_the_block_finder_sees_a_new_unclaimed_block(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n```bash\nnpas count full\n```\n\n<!-- generated:x (cmd) -->\n```python\nx\n```\n"
                    "<!-- end generated:x -->\n")
    monkeypatch.setattr(b, "ROOT", tmp_path)
    found = b.blocks(page)
    assert [(f.key, f.generated) for f in found] == [("page.md > Title > bash", False),
                                                      ("page.md > Title > python", True)]
    assert found[0].key not in b.RUNS


def test_the_readme_space_loads_and_counts(tmp_path, monkeypatch, capsys):
    from npas.presentation.cli import main

    (tmp_path / "my_space.yaml").write_text(b.block(b.SPACE_YAML))
    monkeypatch.chdir(tmp_path)
    for line in b.commands(b.block(b.SPACE_COUNT)):
        argv = line.split("#")[0].split()
        assert argv[0] == "npas", line
        assert main(argv[1:]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "reference model of space 'mine'" in out and out.count("baseline ") == 3, out
    import npas

    space = npas.load_space(tmp_path / "my_space.yaml")
    sections = yaml.safe_load(b.block(b.SPACE_YAML))["knobs"]
    assert set(sections) == {"taper", "tying", "relaxation", "pools", "kv_sharing", "atoms", "experts"}
    assert space.recipe == "smoke-wsd" and space.budget_spec == "0.25x"


def test_the_recipe_example_loads_with_the_rungs_it_states():
    from npas.training.recipe import Recipe

    text = b.block(b.RECIPE_YAML)
    recipe = Recipe.from_dict({"name": "mine", **yaml.safe_load(text)})
    assert recipe.fork_rungs() == (500, 2000) and "500 and 2,000" in text  # what its comment says


def test_sampling_snippet_runs_even_when_the_first_sample_is_infeasible(monkeypatch, capsys):
    # about 4% of full.yaml's samples cannot fit its budget; the snippet must not count such a candidate
    import optuna

    import npas

    space = npas.load_space(ROOT / "search_spaces" / "full.yaml")
    seed = next(s for s in range(500) if not space.sample(
        optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=s)).ask()).feasible)
    create = optuna.create_study
    monkeypatch.setattr(optuna, "create_study",
                        lambda **kw: create(sampler=optuna.samplers.RandomSampler(seed=seed), **kw))
    monkeypatch.chdir(ROOT)
    scope: dict = {}
    with contextlib.redirect_stderr(io.StringIO()):
        exec(compile(b.block(b.SAMPLING), "docs/python-api.md", "exec"), scope)  # noqa: S102 - our own docs
    assert scope["cand"].feasible and "infeasible:" in capsys.readouterr().out
    assert scope["acc"].stored_params == sum(p.numel() for p in scope["model"].parameters())


@functools.cache
def _parser():
    from npas.presentation.cli import build_parser

    return build_parser()


@pytest.mark.parametrize("key", sorted(k for k in b.RUNS if k.split(" > ")[-1].split(" #")[0] == "bash"))
def test_each_shell_command_parses_with_todays_flags(key):
    """Every `npas` line of a block parses with the real parser (a renamed flag fails here, in the fast
    tier, before its slow story test runs)."""
    import shlex

    parser = _parser()
    for line in b.commands(b.block(key)):
        for part in line.split("&&"):
            words = shlex.split(part, comments=True)
            while words and "=" in words[0] and words[0].split("=")[0].isupper():
                words.pop(0)  # VAR=value before the command
            if words[:1] == ["npas"]:
                parser.parse_args(words[1:])  # exits 2 with the reason on a flag npas no longer takes
