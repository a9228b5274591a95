"""Adversarial inputs aimed at round three's features: Hugging Face checkpoints, `--format hf`, the
promotion ladder's recipes, `--locate-lr`, `--checkpoint-storage`, `npas train --lr-factor`, through the CLI.

Every case ends like the first two corpora (tests/presentation/test_inputs.py, whose `guarded` fixture
this reuses): exit code 2, exactly one line on stderr that names the problem and the fix, no traceback,
nothing written under the test's folder, Ray never started and the set-up study of `round3_study.built`
left as it was. Hugging Face checkpoints are written here by hand (a config.json and safetensors in the
LLaMA layout, no transformers import, nothing downloaded), then damaged. `FAILED_BEFORE` lists the cases
that failed on the code before this corpus's fixes. The corpus's Python API cases are
test_inputs_api_round3.py's and its damaged ladder checkpoints tests/training/test_checkpoint_damaged.py's
(both counted here).
"""

from __future__ import annotations

import json
import shutil
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.presentation.round3_study import FAST, TINY, built, study_state  # noqa: F401 (built: a fixture)
from tests.presentation.test_inputs import (
    _tree,
    assert_refused_in_one_line,
    guarded,  # noqa: F401 (a fixture: no Ray, the working folder watched)
)
from tests.presentation.test_inputs_api_round3 import API_CASES, API_FAILED_BEFORE
from tests.training.test_checkpoint_damaged import CHECKPOINT_CASES, CHECKPOINT_FAILED_BEFORE

FAST_TEXT = Path(FAST).read_text()
SEARCH = ["search", TINY, "--recipe", FAST]

# ---- Hugging Face checkpoints, by hand ------------------------------------------------------------
HF = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 68, "hidden_size": 16,
      "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
      "head_dim": 8, "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "hidden_act": "silu",
      "tie_word_embeddings": False, "rope_theta": 10000.0}


def hf_state() -> dict[str, torch.Tensor]:
    """A LlamaForCausalLM state dict of `HF`'s shapes (small random weights, unit norms)."""
    g = torch.Generator().manual_seed(0)
    d, hd, ff = HF["hidden_size"], HF["head_dim"], HF["intermediate_size"]
    q, kv = HF["num_attention_heads"] * hd, HF["num_key_value_heads"] * hd

    def r(*shape: int) -> torch.Tensor:
        return 0.02 * torch.randn(*shape, generator=g)

    state = {"model.embed_tokens.weight": r(HF["vocab_size"], d), "model.norm.weight": torch.ones(d),
             "lm_head.weight": r(HF["vocab_size"], d)}
    for i in range(HF["num_hidden_layers"]):
        p = f"model.layers.{i}."
        state |= {p + "self_attn.q_proj.weight": r(q, d), p + "self_attn.k_proj.weight": r(kv, d),
                  p + "self_attn.v_proj.weight": r(kv, d), p + "self_attn.o_proj.weight": r(d, q),
                  p + "mlp.gate_proj.weight": r(ff, d), p + "mlp.up_proj.weight": r(ff, d),
                  p + "mlp.down_proj.weight": r(d, ff), p + "input_layernorm.weight": torch.ones(d),
                  p + "post_attention_layernorm.weight": torch.ones(d)}
    return state


def write_hf(d: Path, config: dict | None = None, shards: int = 1) -> None:
    """A save_pretrained-style directory: `HF` changed by `config` ("DEL" removes a key), weights of `HF`."""
    d.mkdir(parents=True, exist_ok=True)
    conf = {k: v for k, v in (HF | (config or {})).items() if v != "DEL"}
    (d / "config.json").write_text(json.dumps(conf), encoding="utf-8")
    state = hf_state()
    if shards == 1:
        save_file(state, str(d / "model.safetensors"))
        return
    keys, weight_map = sorted(state), {}
    for j in range(shards):
        name = f"model-{j + 1:05d}-of-{shards:05d}.safetensors"
        save_file({k: state[k] for k in keys[j::shards]}, str(d / name))
        weight_map |= {k: name for k in keys[j::shards]}
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def _index(change: Callable[[dict], Any]) -> Callable[[Path], None]:
    def damage(d: Path) -> None:
        path = d / "model.safetensors.index.json"
        index = json.loads(path.read_text())
        change(index["weight_map"])
        path.write_text(json.dumps(index))

    return damage


def _weights(change: Callable[[dict], Any]) -> Callable[[Path], None]:
    def damage(d: Path) -> None:
        state = load_file(str(d / "model.safetensors"))
        change(state)
        save_file(state, str(d / "model.safetensors"))

    return damage


def _big_tokenizer(d: Path) -> None:
    """A tokenizer.json of 300 tokens beside a 68-row embedding."""
    from npas.training.data import bundled_text
    from npas.training.tokenizers import train_bpe

    (d / "tokenizer.json").write_text(train_bpe(bundled_text()[:20_000], 300).to_json(), encoding="utf-8")


def _npas_hf_export(d: Path) -> None:
    """What `--format hf` writes for an allocation a stock LLaMA cannot express: npas's own model type."""
    shutil.rmtree(d)
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["NpasForCausalLM"], "model_type": "npas",
                                               "allocation": {}, "vocab_size": 68}))
    save_file({"npas.wte.weight": torch.zeros(68, 16)}, str(d / "model.safetensors"))


@dataclass
class Case:
    argv: list[str]  # "{in}": the inputs' folder
    fragment: str  # must appear in the error line
    files: dict[str, str | bytes] = field(default_factory=dict)  # name -> content, under the inputs' folder
    hf: dict | None = None  # config.json changes of a checkpoint written at {in}/m (None: no checkpoint)
    shards: int = 1
    damage: Callable[[Path], None] | None = None  # applied to {in}/m after it is written
    model: bool = False  # an `npas train`-style model directory of the tiny chassis at {in}/d
    silent_s3: bool = False  # "{s3}": a local TCP port that accepts and never answers (no network used)


def convert(fragment: str, config: dict | None = None, **kw: Any) -> Case:
    return Case(["convert", "{in}/m", "--out", "{in}/o"], fragment, hf=config or {}, **kw)


def search(fragment: str, *flags: str, **kw: Any) -> Case:
    return Case([*SEARCH, *flags], fragment, **kw)


def recipe(fragment: str, extra: str, *flags: str) -> Case:
    return Case(["search", TINY, "--recipe", "{in}/r.yaml", *flags], fragment, files={"r.yaml": FAST_TEXT + extra})


def train(fragment: str, *flags: str, files: dict | None = None) -> Case:
    return Case(["train", "{in}/a.yaml", "--recipe", FAST, "--steps", "1", "--out", "{in}/o", *flags], fragment,
                files={"a.yaml": "ALLOC", **(files or {})})


WSD_ONE_RUNG = "schedule: wsd\n"  # fast.yaml's 40 steps, horizon 4000: no default rung below steps
CASES: dict[str, Case] = {
    # ---- config.json fields of the wrong type (npas convert) -----------------------------------
    "hf-hidden-size-string": convert("hidden_size must be an integer, got '16'", {"hidden_size": "16"}),
    "hf-hidden-size-float": convert("hidden_size must be an integer, got 16.5", {"hidden_size": 16.5}),
    "hf-layers-bool": convert("num_hidden_layers must be an integer, got True", {"num_hidden_layers": True}),
    "hf-vocab-null": convert("vocab_size must be an integer, got null", {"vocab_size": None}),
    "hf-context-string-beside-a-window": convert("max_position_embeddings must be an integer",
                                                 {"max_position_embeddings": "64", "sliding_window": 32}),
    "hf-sliding-window-string": convert("sliding_window must be an integer", {"sliding_window": "full"}),
    "hf-use-sliding-window-string": convert("use_sliding_window must be true or false",
                                            {"sliding_window": 32, "use_sliding_window": "no"}),
    "hf-rope-scaling-string": convert("rope_scaling must be a JSON object", {"rope_scaling": "linear"}),
    "hf-rope-scaling-list": convert("rope_scaling must be a JSON object", {"rope_scaling": [1, 2]}),
    "hf-rope-parameters-string": convert("rope_parameters must be a JSON object", {"rope_parameters": "x"}),
    "hf-rope-theta-word": convert("rope_theta must be a number", {"rope_theta": "big"}),
    "hf-rope-type-list": convert("rope_scaling.rope_type must be a string",
                                 {"rope_scaling": {"rope_type": ["linear"], "factor": 2.0}}),
    "hf-rope-factor-string": convert("factor", {"rope_scaling": {"rope_type": "linear", "factor": "2"}}),
    "hf-rope-type-unknown": convert("'dynamic' is not supported", {"rope_scaling": {"type": "dynamic", "factor": 2.0}}),
    "hf-architectures-string": convert("architectures must be a list", {"architectures": "LlamaForCausalLM"}),
    "hf-architecture-npas-type": convert("npas's own Hugging Face model type", {"architectures": ["NpasForCausalLM"]}),
    "hf-tie-embeddings-string": convert("tie_word_embeddings must be true or false", {"tie_word_embeddings": "false"}),
    "hf-attention-bias-string": convert("attention_bias must be true or false", {"attention_bias": "false"}),
    "hf-kv-heads-string": convert("num_key_value_heads must be an integer", {"num_key_value_heads": "1"}),
    "hf-head-dim-float": convert("head_dim must be an integer", {"head_dim": 8.0}),
    "hf-rms-eps-word": convert("rms_norm_eps must be a number", {"rms_norm_eps": "tiny"}),
    "hf-hidden-act-list": convert("hidden_act", {"hidden_act": ["silu"]}),
    "hf-missing-vocab-size": convert("'vocab_size'", {"vocab_size": "DEL"}),
    # ---- index, shards, weights, tokenizer -------------------------------------------------------
    "hf-index-maps-to-numbers": convert("weight_map must map each tensor to a file name", shards=2,
                                        damage=_index(lambda m: m.update(dict.fromkeys(m, 1)))),
    "hf-index-absolute-path": convert("weight_map must map each tensor to a file name", shards=2,
                                      damage=_index(lambda m: m.update(dict.fromkeys(m, "/etc/hostname")))),
    "hf-index-climbs-out": convert("weight_map must map each tensor to a file name", shards=2,
                                   damage=_index(lambda m: m.update(dict.fromkeys(m, "../m2/model.safetensors")))),
    "hf-index-mixed-types": convert("not a safetensors index", shards=2,
                                    damage=_index(lambda m: m.update({next(iter(m)): 3}))),
    "hf-index-list": convert("not a safetensors index", shards=2,
                             damage=lambda d: (d / "model.safetensors.index.json").write_text("[1, 2]")),
    "hf-shard-missing": convert("are missing", shards=2, damage=lambda d: (d / "model-00002-of-00002.safetensors")
                                .unlink()),
    "hf-weights-truncated": convert("the file is damaged", damage=lambda d: (d / "model.safetensors").write_bytes(
        (d / "model.safetensors").read_bytes()[:200])),
    "hf-integer-weights": convert("not floating point", damage=_weights(
        lambda s: s.update({"model.norm.weight": s["model.norm.weight"].long()}))),
    "hf-weights-shape-against-config": convert("shape does not match", {"intermediate_size": 48}),
    "hf-weights-missing-a-tensor": convert("not the LLaMA layout", damage=_weights(
        lambda s: s.pop("model.layers.1.mlp.up_proj.weight"))),
    "hf-nan-weights": convert("non-finite weights", damage=_weights(
        lambda s: s["model.norm.weight"].__setitem__(0, float("nan")))),
    "hf-pickle-only": convert("pickled weights", damage=lambda d: (d / "model.safetensors").rename(
        d / "pytorch_model.bin")),
    "hf-tokenizer-larger-than-embedding": convert("has 300 tokens but the model's vocab_size is only 68",
                                                  damage=_big_tokenizer),
    "hf-tokenizer-not-json": convert("not valid JSON", damage=lambda d: (d / "tokenizer.json").write_text("{no")),
    # ---- a Hugging Face directory where npas's own is expected ------------------------------------
    "train-of-a-hf-dir": Case(["train", "{in}/m", "--recipe", FAST, "--out", "{in}/o"], "npas convert", hf={}),
    "sample-of-a-hf-dir": Case(["sample", "{in}/m"], "npas convert", hf={}),
    "train-of-npas-hf-export": Case(["train", "{in}/m", "--recipe", FAST, "--out", "{in}/o"],
                                    "only through transformers", hf={}, damage=_npas_hf_export),
    "convert-of-npas-hf-export": Case(["convert", "{in}/m", "--out", "{in}/o"], "npas's own Hugging Face model type",
                                      hf={}, damage=_npas_hf_export),
    # ---- --format hf -----------------------------------------------------------------------------
    "train-unroll-classic-chassis": train("cannot write a stock LlamaForCausalLM", "--format", "hf", "--unroll"),
    "convert-unroll-classic-chassis": Case(["convert", "{in}/d", "--to", "{in}/a.yaml", "--out", "{in}/o", "--format",
                                            "hf", "--unroll"], "cannot write a stock LlamaForCausalLM",
                                           files={"a.yaml": "ALLOC"}, model=True),
    "convert-hf-unroll-without-format": Case(["convert", "{in}/m", "--out", "{in}/o", "--unroll"],
                                             "pass it with --format hf", hf={}),
    "train-unroll-without-format": train("pass it with --format hf", "--unroll"),
    "train-recursion-format-hf": Case(["train", "{in}/a.yaml", "--recipe", FAST, "--steps", "1", "--out", "{in}/o",
                                       "--format", "hf"], "no Hugging Face architecture expresses",
                                      files={"a.yaml": "MOR"}),
    "convert-into-recursion-format-hf": Case(["convert", "{in}/d", "--to", "{in}/a.yaml", "--out", "{in}/o",
                                              "--format", "hf"], "no Hugging Face architecture expresses",
                                             files={"a.yaml": "MOR"}, model=True),
    # ---- --checkpoint-storage --------------------------------------------------------------------
    "ckpt-is-a-file": search("is a file", "--checkpoint-storage", "{in}/f", files={"f": "x"}),
    "ckpt-below-a-file": search("nothing can be created below it", "--checkpoint-storage", "{in}/f/ck",
                                files={"f": "x"}),
    "ckpt-relative": search("is a relative path", "--checkpoint-storage", "ck/runs"),
    "ckpt-dot": search("is a relative path", "--checkpoint-storage", "."),
    "ckpt-file-uri-relative": search("a file:// URI takes an absolute path", "--checkpoint-storage", "file://ck/x"),
    "ckpt-nul-byte": search("NUL byte", "--checkpoint-storage", "/tmp/a\0b"),
    "ckpt-s3-no-bucket": search("names no bucket", "--checkpoint-storage", "s3://"),
    "ckpt-hdfs-unopenable": search("cannot be opened", "--checkpoint-storage", "hdfs://127.0.0.1:9/npas"),
    "ckpt-s3-endpoint-never-answers": search("did not answer within", "--checkpoint-storage", "{s3}",
                                             silent_s3=True),
    "ckpt-unknown-scheme": search("is not a storage Ray Tune reads", "--checkpoint-storage", "ftp://h/x"),
    "ckpt-empty": search("--checkpoint-storage is empty", "--checkpoint-storage", " "),
    "resume-ckpt-is-a-file": Case(["resume", "x", "--checkpoint-storage", "{in}/f"], "is a file", files={"f": "x"}),
    "resume-study-missing-new-db": Case(["resume", "x", "--storage", "sqlite:///{in}/new/x.db"], "no database"),
    # ---- recipes ---------------------------------------------------------------------------------
    "recipe-cosine-decay-fraction": recipe("decay_fraction: only a wsd schedule", "decay_fraction: 0.1\n"),
    "recipe-cosine-decay-shape": recipe("decay_shape: only a wsd schedule", "decay_shape: linear\n"),
    "train-recipe-cosine-decay-fraction": Case(["train", "{in}/a.yaml", "--recipe", "{in}/r.yaml", "--steps", "1",
                                                "--out", "{in}/o"], "decay_fraction: only a wsd schedule",
                                               files={"a.yaml": "ALLOC",
                                                      "r.yaml": FAST_TEXT + "decay_fraction: 0.5\n"}),
    "recipe-rungs-on-cosine": recipe("only a wsd schedule is scored at rungs", "rungs: [10, 20]\n"),
    "recipe-wsd-rungs-empty": recipe("rungs: expected a list", "schedule: wsd\nrungs: []\n"),
    "recipe-wsd-rungs-bool": recipe("rungs: expected a list", "schedule: wsd\nrungs: [true]\n"),
    "recipe-wsd-rungs-past-steps": recipe("at most steps", "schedule: wsd\nrungs: [10, 80]\n"),
    "recipe-wsd-rung-inside-warmup": recipe("past the warmup", "schedule: wsd\nrungs: [2, 20]\n"),
    "recipe-wsd-decay-fraction-zero": recipe("decay_fraction: must be in (0, 1]", "schedule: wsd\ndecay_fraction: 0\n"),
    "recipe-wsd-decay-shape-typo": recipe("did you mean '1-sqrt'", "schedule: wsd\ndecay_shape: sqrt\n"),
    "recipe-horizon-float": recipe("horizon: expected an integer", "horizon: 400.5\n"),
    # ---- joining a ladder study with a changed recipe or settings ({db}: a set-up study "{study}") --
    "join-with-another-recipe": Case(["search", TINY, "--recipe", "smoke-wsd", "--study", "{study}", "--storage",
                                      "{db}"], "was created with other settings: --recipe 'smoke-wsd'"),
    "join-with-another-sampler": Case([*SEARCH, "--sampler", "random", "--study", "{study}", "--storage", "{db}"],
                                      "--sampler 'random' (the study's is 'tpe')"),
    "join-with-locate-lr": Case(["search", TINY, "--recipe", "{in}/r.yaml", "--locate-lr", "--study", "{study}",
                                 "--storage", "{db}"], "was created with other settings",
                                files={"r.yaml": FAST_TEXT + "schedule: wsd\nrungs: [10, 40]\n"}),
    "join-with-another-budget": Case([*SEARCH, "--budget", "0.5x", "--study", "{study}", "--storage", "{db}"],
                                     "with a different space, budget or data"),
    # ---- --locate-lr -----------------------------------------------------------------------------
    "locate-lr-one-rung": recipe("one rung only", WSD_ONE_RUNG, "--locate-lr"),
    "locate-lr-only-the-top-rung": recipe("one rung only", "schedule: wsd\nrungs: [40]\n", "--locate-lr"),
    "locate-lr-cosine": search("has schedule 'cosine'", "--locate-lr"),
    "locate-lr-no-early-stop": recipe("--no-early-stop trains every trial to T", "schedule: wsd\nrungs: [10, 40]\n",
                                      "--locate-lr", "--no-early-stop"),
    # ---- npas train --lr-factor ------------------------------------------------------------------
    "lr-factor-1e300": train("from 1/1024 to 1024", "--lr-factor", "1e300"),
    "lr-factor-5000": train("from 1/1024 to 1024", "--lr-factor", "5000"),
    "lr-factor-1e-300": train("from 1/1024 to 1024", "--lr-factor", "1e-300"),
    "lr-factor-zero": train("--lr-factor", "--lr-factor", "0"),
    "lr-factor-nan": train("--lr-factor", "--lr-factor", "nan"),
    "lr-factor-stored-5000": Case(["train", "{in}/best.yaml", "--recipe", FAST, "--steps", "1", "--out", "{in}/o"],
                                  "lr_factor must be", files={"best.yaml": "EXPORT 5000"}),
}

# Cases that failed on the code before this corpus's fixes (a traceback, exit 0 with a directory
# written, Ray started for an input that can never run, or a message that named the wrong problem).
FAILED_BEFORE = {
    "hf-hidden-size-string", "hf-hidden-size-float", "hf-layers-bool", "hf-vocab-null",
    "hf-context-string-beside-a-window", "hf-sliding-window-string", "hf-use-sliding-window-string",
    "hf-rope-scaling-string", "hf-rope-scaling-list", "hf-rope-parameters-string", "hf-rope-theta-word",
    "hf-rope-type-list", "hf-architectures-string", "hf-architecture-npas-type", "hf-tie-embeddings-string",
    "hf-attention-bias-string", "hf-kv-heads-string", "hf-head-dim-float", "hf-rms-eps-word",
    "hf-index-maps-to-numbers", "hf-index-absolute-path", "hf-index-climbs-out", "hf-integer-weights",
    "hf-tokenizer-larger-than-embedding", "train-of-a-hf-dir", "sample-of-a-hf-dir", "train-of-npas-hf-export",
    "convert-of-npas-hf-export", "train-unroll-classic-chassis", "convert-unroll-classic-chassis",
    "ckpt-is-a-file", "ckpt-below-a-file", "ckpt-relative", "ckpt-dot", "ckpt-file-uri-relative", "ckpt-nul-byte",
    "ckpt-s3-no-bucket", "ckpt-hdfs-unopenable", "ckpt-s3-endpoint-never-answers", "resume-ckpt-is-a-file",
    "resume-study-missing-new-db", "recipe-cosine-decay-fraction", "recipe-cosine-decay-shape",
    "train-recipe-cosine-decay-fraction", "locate-lr-one-rung", "locate-lr-only-the-top-rung", "lr-factor-1e300",
    "lr-factor-5000", "lr-factor-1e-300", "lr-factor-stored-5000", "join-with-another-recipe",
    "join-with-another-sampler", "join-with-locate-lr", "join-with-another-budget",
    "train-recursion-format-hf", "convert-into-recursion-format-hf",
}


@pytest.fixture
def silent_port():
    """A TCP port on this machine that accepts connections and never answers: an endpoint that hangs."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield s.getsockname()[1]


def test_the_round_three_corpus_is_large_enough():
    assert len(CASES) + len(API_CASES) + len(CHECKPOINT_CASES) >= 60
    assert FAILED_BEFORE <= set(CASES) and API_FAILED_BEFORE <= set(API_CASES)
    assert CHECKPOINT_FAILED_BEFORE <= set(CHECKPOINT_CASES)


@pytest.mark.parametrize("case", [pytest.param(c, id=k) for k, c in CASES.items()])
def test_round_three_input_is_one_line_exit_2_nothing_written(case: Case, built: dict, guarded: Path,  # noqa: F811
                                                              monkeypatch, capsys, request):
    inputs = guarded / "in"
    inputs.mkdir()
    for name, content in case.files.items():
        (inputs / name).write_text(built.get(content, content), encoding="utf-8")
    if case.hf is not None:
        write_hf(inputs / "m", case.hf, case.shards)
        if case.damage is not None:
            case.damage(inputs / "m")
    if case.model:
        shutil.copytree(built["model"], inputs / "d")
    s3 = ""
    if case.silent_s3:
        import npas.service.search.launch as launch

        monkeypatch.setattr(launch, "PROBE_S", 0.5)
        for k, v in {"AWS_ACCESS_KEY_ID": "npas-test", "AWS_SECRET_ACCESS_KEY": "npas-test",
                     "AWS_EC2_METADATA_DISABLED": "true"}.items():  # no credential lookup over the network
            monkeypatch.setenv(k, v)
        s3 = f"s3://npas-test/ck?endpoint_override=127.0.0.1:{request.getfixturevalue('silent_port')}&scheme=http"
    before = _tree(guarded)
    study = study_state(built["db"], built["study"])
    argv = [a.replace("{in}", str(inputs)).replace("{s3}", s3).replace("{db}", built["db"])
            .replace("{study}", built["study"]) for a in case.argv]
    assert_refused_in_one_line(argv, case.fragment, capsys, guarded, before)
    assert study_state(built["db"], built["study"]) == study  # the study is as it was
