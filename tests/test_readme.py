"""The README's set-up commands and CI must agree: CI runs exactly the README's test command."""

from __future__ import annotations

from .conftest import ROOT


def first_code_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("```", 2)[1]
    return [line for line in block.splitlines()[1:] if line.strip()]


def test_readme_opens_with_exactly_two_commands():
    lines = first_code_block()
    assert len(lines) == 2
    assert "npas " in lines[0] and "pytest" in lines[1]


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert first_code_block()[1] in ci


def python_snippet() -> str:
    text = (ROOT / "README.md").read_text()
    return text.split("```python", 1)[1].split("```", 1)[0]


def test_python_snippet_runs_even_when_the_first_sample_is_infeasible(monkeypatch, capsys):
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
    exec(compile(python_snippet(), "README.md", "exec"), scope)  # noqa: S102 - the project's own README
    assert scope["cand"].feasible and "infeasible:" in capsys.readouterr().out
    assert scope["acc"].stored_params == sum(p.numel() for p in scope["model"].parameters())
