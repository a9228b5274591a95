"""docs/errors.md's examples: mistaken commands a user meets, each run in-process in a scratch folder as
written, with the one line npas answers. Rendering the page runs them, so the page shows what npas says
today, and a command that stops being refused stops the rendering instead of starting a search."""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from npas.presentation import cli
from npas.presentation.cli import search as search_cli

# the files some examples read, written into the scratch folder first
FILES = {
    "space.yaml": "name: tiny\nchassis: {vocab_size: 68, context: 64, d_model: 64, n_layers: 4, n_heads: 4, d_ff: 256}\n"
                  "budget: 0.5x\nknobs:\n  taper: {shedule: [uniform, cosine]}\n  tying: {mode: [none, cycel]}\n",
    "mine.yaml": "steps: 100\nwarmup_steps: 10\nlr_max: 1.0e-3\nschedule: wsd\nrungs: [5, 50]\n",
    "corpus.jsonl": '{"body": "To be, or not to be"}\n',
}


@dataclass(frozen=True)
class Group:
    title: str
    commands: tuple[str, ...]
    files: tuple[str, ...] = field(default=())  # shown above the commands


GROUPS = (
    Group("Search spaces and budgets", (
        "npas search fulll",
        "npas search space.yaml",
        "npas search full --budget 3k",
    ), ("space.yaml",)),
    Group("Recipes", (
        "npas search full --recipe nosuch",
        "npas search full --recipe mine.yaml",
        "npas search full --locate-lr --recipe smoke",
        "npas search full --locate-lr --recipe smoke-wsd --no-early-stop",
    ), ("mine.yaml",)),
    Group("Data and tokenizers", (
        "npas search full --data missing.txt",
        "npas search full --data corpus.jsonl",
        "npas search full --data corpus.jsonl --text-field body",
        "npas search full --tokenizer bpe:abc",
    ), ("corpus.jsonl",)),
    Group("Numbers and choices on the command line", (
        "npas search full --trials 0",
        "npas search full --repeats 0",
        "npas search full --gpus-per-trial 1.5",
        "npas search full --sampler bayes",
        "npas search full --study a/b",
        "npas train best.yaml --lr-factor -1",
        "npas export mine --pick best --out best.yaml",
    )),
    Group("Studies, storage and clusters", (
        "npas front mine",
        "npas export mine --out best.yaml",
        "npas search full --checkpoint-storage ftp://host/x",
    )),
    Group("Training, sampling and conversion", (
        "npas train best.yaml",
        "npas sample my_model",
        "npas convert dense/ --to best.yaml --out small/",
        "npas count missing.yaml",
    )),
)


def _refuse_to_search(*_: object, **__: object) -> None:
    raise RuntimeError("an errors.md example passed every check and would start Ray; it is no longer an error")


def run(command: str, cwd: Path) -> tuple[int, str]:
    """Exit status and stderr of one `npas ...` command, run in-process in `cwd` with no storage set."""
    argv = shlex.split(command)[1:]
    err = io.StringIO()
    old_cwd, old_env = Path.cwd(), {k: os.environ.pop(k) for k in ("NPAS_STORAGE",) if k in os.environ}
    start, search_cli._start_ray = search_cli._start_ray, _refuse_to_search
    try:
        os.chdir(cwd)
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = cli.main(argv)
    finally:
        os.chdir(old_cwd)
        os.environ.update(old_env)
        search_cli._start_ray = start
    return code, err.getvalue().replace(str(cwd.resolve()) + "/", "").strip()


def render() -> str:
    out = []
    with tempfile.TemporaryDirectory(prefix="npas-errors-") as tmp:
        scratch = Path(tmp)
        for name, text in FILES.items():
            (scratch / name).write_text(text)
        for group in GROUPS:
            out += [f"### {group.title}", ""]
            for name in group.files:
                out += [f"With this `{name}`:", "", "```" + ("yaml" if name.endswith(".yaml") else "json"),
                        FILES[name].rstrip("\n"), "```", ""]
            out.append("```console")
            for command in group.commands:
                code, said = run(command, scratch)
                if code != 2:
                    raise RuntimeError(f"errors.md: `{command}` exited {code}, not 2 (a refusal): {said[-500:]}")
                out += [f"$ {command}", said]
            out += ["```", ""]
    return "\n".join(out)
