"""An adversarial corpus of malformed inputs, each through the real CLI (`npas.presentation.cli.main`).

Every case must end the same way: exit code 2, exactly one line on stderr that names the problem,
no traceback, nothing written (no database, no directory, no file), and Ray never started (the
runner's start functions are replaced by ones that fail the test). Inputs cover search spaces,
recipes, allocation configs, corpora (`--data`), vocabularies and command-line flags; encodings
(Latin-1, UTF-16 with a byte-order mark, NUL bytes), YAML features (anchors and aliases, a
"billion laughs" alias bomb, `!!python/...` tags), absurd sizes, wrong types, and negative or zero
counts. A case that fails because of a defect in another part of npas is marked `xfail(strict=True)`
with the owner of that part, so it turns into a failure the moment it is fixed and the mark can go.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from npas.presentation.cli import main
from tests.conftest import ROOT

TINY = (ROOT / "tests" / "data" / "tiny.yaml").read_text()
FAST = (ROOT / "tests" / "data" / "fast.yaml").read_text()
CONFIG = """chassis: {vocab_size: 68, context: 64, d_model: 32, n_layers: 4, n_heads: 4, d_ff: 96, activation: gelu}
mlp_widths: [96, 96, 96, 96]
block_of_layer: [0, 1, 2, 3]
banks: []
lora_attn: [0, 0, 0, 0]
lora_mlp: [0, 0, 0, 0]
untied_norms: true
dtype: float32
version: 1
"""
# "billion laughs": nine levels of nine aliases, 9**9 leaves if anything expanded it, under one unknown key
BOMB = "bomb: [&l0 [lol], " + ", ".join(f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, 10)) + "]\n"


def with_key(text: str, key: str, value: str) -> str:
    """`text` with the top-level `key:` line replaced by `key: value` (or appended)."""
    lines = [ln for ln in text.splitlines() if not ln.startswith(f"{key}:")]
    return "\n".join([*lines, f"{key}: {value}"]) + "\n"


def chassis(**kw) -> str:
    base = {"vocab_size": 68, "context": 64, "d_model": 32, "n_layers": 4, "n_heads": 4, "d_ff": 96,
            "activation": "gelu"}
    base.update(kw)
    return with_key(TINY, "chassis", "{" + ", ".join(f"{k}: {v}" for k, v in base.items()) + "}")


@dataclass
class Case:
    argv: list[str]  # "{in}" is replaced by the inputs' folder
    files: dict[str, str | bytes]  # name -> content, written under the inputs' folder
    fragment: str  # must appear in the error line


def space_case(text: str | bytes, fragment: str, *extra: str) -> Case:
    return Case(["search", "{in}/space.yaml", *extra], {"space.yaml": text}, fragment)


def recipe_case(text: str | bytes, fragment: str) -> Case:
    return Case(["search", "{in}/space.yaml", "--recipe", "{in}/recipe.yaml"],
                {"space.yaml": TINY, "recipe.yaml": text}, fragment)


def config_case(text: str | bytes, fragment: str, command: str = "count") -> Case:
    return Case([command, "{in}/alloc.yaml"], {"alloc.yaml": text}, fragment)


def data_case(files: dict[str, str | bytes], target: str, fragment: str) -> Case:
    return Case(["search", "{in}/space.yaml", "--recipe", "{in}/recipe.yaml", "--data", f"{{in}}/{target}"],
                {"space.yaml": TINY, "recipe.yaml": FAST, **files}, fragment)


def flag_case(fragment: str, *flags: str) -> Case:
    return Case(["search", "{in}/space.yaml", *flags], {"space.yaml": TINY}, fragment)


def model_dir(vocab: str | bytes) -> dict[str, str | bytes]:
    return {"model/config.yaml": CONFIG, "model/vocab.json": vocab, "model/model.safetensors": b"\0" * 16}


def owner(who: str, why: str):
    return pytest.mark.xfail(strict=True, reason=f"owner {who}: {why}")


CASES: dict[str, Case | tuple[Case, Callable]] = {
    # ---- search spaces ----------------------------------------------------------------------
    "space-latin1": space_case(("# caf\xe9\n" + TINY).encode("latin-1"), "not UTF-8"),
    "space-utf16-bom": space_case(TINY.encode("utf-16"), "UTF-16"),
    "space-nul-bytes": space_case(TINY.encode() + b"\0\0", "NUL bytes"),
    "space-python-tag": space_case("!!python/object/apply:os.system ['touch pwned']\n", "YAML does not parse"),
    "space-python-name-tag": space_case(with_key(TINY, "name", "!!python/name:os.system"), "YAML does not parse"),
    "space-billion-laughs": space_case(BOMB + TINY, "unknown key"),
    "space-undefined-alias": space_case(with_key(TINY, "name", "*nowhere"), "YAML does not parse"),
    "space-merge-of-a-list": space_case(TINY.replace("chassis: {", "chassis: {<<: [1, 2], "), "YAML does not parse"),
    "space-top-level-list": space_case("- 1\n- 2\n", "top level must be a mapping"),
    "space-empty-file": space_case("", "top level must be a mapping"),
    "space-missing-file": Case(["search", "{in}/nope.yaml"], {}, "no such file"),
    "space-unknown-name": Case(["search", "ful"], {}, "did you mean 'full'"),
    "space-is-a-directory": Case(["search", "{in}/dir.yaml"], {"dir.yaml/x": ""}, "directory"),
    "space-budget-1e400": space_case(with_key(TINY, "budget", "1e400"), "budget"),
    "space-budget-negative": space_case(with_key(TINY, "budget", "-0.5x"), "budget"),
    "space-budget-bool": space_case(with_key(TINY, "budget", "true"), "budget"),
    "space-budget-text": space_case(with_key(TINY, "budget", "lots"), "budget"),
    "space-layers-1e30": space_case(chassis(n_layers=10**30), "n_layers"),
    "space-heads-zero": space_case(chassis(n_heads=0), "n_heads"),
    "space-d-model-negative": space_case(chassis(d_model=-32), "d_model"),
    "space-d-model-string": space_case(chassis(d_model="wide"), "d_model"),
    "space-dtype-list": space_case(with_key(TINY, "dtype", "[float32]"), "dtype"),
    "space-objectives-empty": space_case(with_key(TINY, "objectives", "[]"), "objectives"),
    "space-objective-typo": space_case(with_key(TINY, "objectives", "[val_loss, memroy]"), "memroy"),
    # ---- recipes ------------------------------------------------------------------------------
    "recipe-steps-zero": recipe_case(with_key(with_key(FAST, "steps", "0"), "warmup_steps", "0"),
                                     "steps: must be >= 1"),
    "recipe-lr-inf": recipe_case(with_key(FAST, "lr", ".inf"), "lr: expected a finite number"),
    "recipe-lr-nan": recipe_case(with_key(FAST, "lr", ".nan"), "lr: expected a finite number"),
    "recipe-batch-float": recipe_case(with_key(FAST, "batch_size", "1.0e+30"), "batch_size: expected an integer"),
    "recipe-seq-len-1e30": recipe_case(with_key(FAST, "seq_len", str(10**30)), "seq_len"),
    "recipe-seq-len-over-context": recipe_case(with_key(FAST, "seq_len", "128"), "chassis.context"),
    "recipe-latin1": recipe_case(("# \xe9t\xe9\n" + FAST).encode("latin-1"), "recipe"),
    "recipe-python-tag": recipe_case("!!python/object/apply:os.system ['true']\n", "not valid YAML"),
    "recipe-list": recipe_case("- steps\n- 3\n", "must be a mapping"),
    "recipe-unknown-key": recipe_case(FAST + "stepz: 4\n", "did you mean 'steps'"),
    "recipe-unknown-name": Case(["search", "{in}/space.yaml", "--recipe", "smok"], {"space.yaml": TINY},
                                "recipe 'smok' not found"),
    "recipe-eval-every-negative": recipe_case(with_key(FAST, "eval_every", "-5"), "eval_every: must be >= 1"),
    # ---- allocation configs ---------------------------------------------------------------------
    "config-untied-norms-string": config_case(with_key(CONFIG, "untied_norms", '"false"'), "untied_norms"),
    "config-utf16": config_case(CONFIG.encode("utf-16"), "UTF-16"),
    "config-latin1": config_case(("# \xe9\n" + CONFIG).encode("latin-1"), "not UTF-8", command="train"),
    "config-wrong-length": config_case(with_key(CONFIG, "block_of_layer", "[0, 1, 2]"), "block_of_layer"),
    "config-negative-width": config_case(with_key(CONFIG, "mlp_widths", "[96, -96, 96, 96]"), "mlp_widths"),
    "config-python-tag": config_case("!!python/object/new:dict {}\n", "YAML"),
    "config-scalar": config_case("42\n", "mapping"),
    "config-missing-train": Case(["train", "{in}/nope.yaml"], {}, "does not exist"),
    # ---- corpora (--data) -----------------------------------------------------------------------
    "data-latin1": data_case({"c.txt": ("caf\xe9 " * 5000).encode("latin-1")}, "c.txt", "not UTF-8"),
    "data-utf16-bom": data_case({"c.txt": ("hello " * 5000).encode("utf-16")}, "c.txt", "c.txt"),
    "data-nul-bytes": data_case({"c.bin": b"abc\0def" * 1000}, "c.bin", "NUL byte"),
    "data-empty": data_case({"c.txt": "   \n"}, "c.txt", "empty"),
    "data-dir-without-txt": data_case({"corp/readme.md": "hi"}, "corp", "holds no files matching '**/*.txt'"),
    "data-missing": data_case({}, "nope.txt", "does not exist"),
    "data-too-small": data_case({"c.txt": "abc"}, "c.txt", "c.txt"),
    # ---- vocabularies (npas sample) -------------------------------------------------------------
    "vocab-not-json": Case(["sample", "{in}/model"], model_dir("{not json"), "not valid JSON"),
    "vocab-wrong-type": Case(["sample", "{in}/model"], model_dir("42"), "vocab"),
    "vocab-utf16": Case(["sample", "{in}/model"], model_dir('{"chars": ["a"]}'.encode("utf-16")), "vocab"),
    "model-dir-missing": Case(["sample", "{in}/nomodel"], {}, "does not exist"),
    # ---- command-line flags ---------------------------------------------------------------------
    "trials-zero": flag_case("--trials: 0 is out of range", "--trials", "0"),
    "trials-negative": flag_case("--trials: -3 is out of range", "--trials", "-3"),
    "trials-float": flag_case("not a whole number", "--trials", "1e3"),
    "trials-1e30": flag_case("out of range", "--trials", str(10**30)),
    "workers-zero": flag_case("--workers: 0 is out of range", "--workers", "0"),
    "workers-text": flag_case("'two' is not a whole number", "--workers", "two"),
    "gpus-negative": flag_case("--gpus-per-trial", "--gpus-per-trial", "-1"),
    "gpus-nan": flag_case("--gpus-per-trial", "--gpus-per-trial", "nan"),
    "gpus-fractional-above-one": flag_case("Ray shares a GPU only as a fraction", "--gpus-per-trial", "1.5"),
    "seed-negative": flag_case("--seed: -1 is out of range", "--seed", "-1"),
    "seed-2**32": flag_case("--seed", "--seed", str(2**32)),
    "budget-flag-1e400": flag_case("budget", "--budget", "1e400"),
    "budget-flag-zero": flag_case("budget", "--budget", "0x"),
    "budget-flag-text": flag_case("budget", "--budget", "half"),
    "study-empty": flag_case("--study is empty", "--study", ""),
    "study-nul": flag_case("NUL byte", "--study", "a\0b"),
    "sampler-unknown": flag_case("invalid choice: 'cmaes'", "--sampler", "cmaes"),
    "storage-unknown-backend": flag_case("unknown storage backend", "--storage", "mongodb://h/db"),
    "resume-space-missing": Case(["resume", "x", "--space", "{in}/missing.yaml"], {}, "no such file"),
    "resume-trials-zero": Case(["resume", "x", "--trials", "0"], {}, "--trials: 0 is out of range"),
    "resume-data-missing": Case(["resume", "x", "--data", "{in}/nope.txt"], {}, "does not exist"),
    "count-batch-zero": Case(["count", "{in}/space.yaml", "--batch-size", "0"], {"space.yaml": TINY},
                             "--batch-size: 0 is out of range"),
    "train-steps-negative": Case(["train", "{in}/alloc.yaml", "--steps", "-1"], {"alloc.yaml": CONFIG},
                                 "--steps: -1 is out of range"),
    "sample-tokens-negative": Case(["sample", "{in}/model", "--tokens", "-1"], {}, "--tokens: -1 is out of range"),
    "sample-temperature-nan": Case(["sample", "{in}/model", "--temperature", "nan"], {},
                                   "--temperature: 'nan' is out of range"),
    "sample-temperature-negative": Case(["sample", "{in}/model", "--temperature", "-0.5"], {},
                                        "--temperature: '-0.5' is out of range"),
    "count-seq-len-over-context": Case(["count", "{in}/alloc.yaml", "--seq-len", "65"], {"alloc.yaml": CONFIG},
                                       "--seq-len 65 is longer than the chassis context 64"),
    "dashboard-port": Case(["dashboard", "x", "--port", "70000"], {}, "--port: 70000 is out of range"),
    "front-storage-typo-dir": Case(["front", "x", "--storage", "sqlite:///{in}/typo/x.db"], {}, "typo"),
    "export-pick-unknown": Case(["export", "x", "--storage", "sqlite:///{in}/db/x.db", "--pick", "best",
                                 "--out", "{in}/o.yaml"], {}, "--pick: 'best' is not one of knee"),
    "export-pick-bad-size": Case(["export", "x", "--storage", "sqlite:///{in}/db/x.db", "--pick",
                                  "max-memory=-1e400", "--out", "{in}/o.yaml"], {}, "not a positive size"),
    "export-pick-trial-text": Case(["export", "x", "--storage", "sqlite:///{in}/db/x.db", "--pick", "trial=one",
                                    "--out", "{in}/o.yaml"], {}, "trial=N needs an integer"),
}


def _params() -> list:
    """One param per case, as a list: pytest 9 deprecates parametrizing over a generator."""
    return [pytest.param(case[0], id=name, marks=case[1]) if isinstance(case, tuple) else pytest.param(case, id=name)
            for name, case in CASES.items()]


def test_the_corpus_is_large_enough():
    assert len(CASES) >= 40


@pytest.fixture
def guarded(monkeypatch, tmp_path):
    """No Ray, ever; the working directory is an empty folder whose contents are compared afterwards."""
    import npas.service.execution.session as runner

    def ray_started(*_a, **_k):
        raise AssertionError("Ray was started for a malformed input")

    for fn in ("start_ray_early", "check_address_reachable", "init_ray"):
        monkeypatch.setattr(runner, fn, ray_started)
    monkeypatch.delenv("NPAS_STORAGE", raising=False)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return tmp_path


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("case", _params())
def test_malformed_input_is_one_line_exit_2_nothing_written(case: Case, guarded: Path, capsys):
    inputs = guarded / "in"
    inputs.mkdir()
    for name, content in case.files.items():
        path = inputs / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    before = _tree(guarded)
    argv = [a.replace("{in}", str(inputs)) for a in case.argv]
    assert_refused_in_one_line(argv, case.fragment, capsys, guarded, before)


def assert_refused_in_one_line(argv: list[str], fragment: str, capsys, guarded, before) -> None:
    """`npas ARGV` exits 2 with one `error:` line naming `fragment`, no traceback, nothing written."""
    try:
        code = main(argv)
    except SystemExit as e:  # argparse refuses a flag by exiting
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "error:" in lines[0] and fragment in lines[0], lines[0]
    assert _tree(guarded) == before, f"files written: {sorted(_tree(guarded) - before)}"
