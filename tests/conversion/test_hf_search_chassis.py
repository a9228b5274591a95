"""`npas search SPACE --init-from HF_DIR` (issue 37): the checkpoint's chassis is the search's.

A Hugging Face checkpoint fixes every dimension (its weights), so the space's chassis is only a
default: the plan pins the checkpoint's (depth, widths, heads, K/V heads, vocabulary, rope scaling,
norms, tied head), checks the space's knobs against it, records it with the study's launch bindings
so a resume rebinds it, and every trial starts from the checkpoint converted to its allocation. The
checkpoint here is trained by `npas train --format hf` (a stock LlamaForCausalLM), so a warm start is
visible in the first validation loss.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import torch

pytest.importorskip("transformers")

import npas  # noqa: E402
from npas.allocation.config import ArchConfig  # noqa: E402
from npas.allocation.space_parser import parse_space  # noqa: E402
from npas.conversion.hf_source import read_hf_dir  # noqa: E402
from npas.conversion.init_from import initial_state  # noqa: E402
from npas.errors import ConfigError  # noqa: E402
from npas.presentation.cli import main  # noqa: E402
from npas.service.search.plan import plan_search  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

FAST = str(ROOT / "tests" / "data" / "fast.yaml")
V = 300
CHECKPOINT = """chassis: {vocab_size: 300, context: 64, d_model: 32, n_layers: 4, n_heads: 4, d_ff: 64, activation: swiglu,
  family: llama, n_kv_heads: 2, rope_theta: 10000.0, rms_norm_eps: 1.0e-5, tie_embeddings: false,
  rope_scaling: {rope_type: llama3, factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0,
                 original_max_position_embeddings: 16}}
mlp_widths: [64, 64, 64, 64]
block_of_layer: [0, 1, 2, 3]
"""
QUICK = """name: quick
seq_len: 32
batch_size: 8
steps: 60
lr: 1.0e-2
min_lr: 1.0e-3
warmup_steps: 4
eval_every: 60
eval_batches: 4
threads: 1
"""
# every chassis field differs from the checkpoint's: classic family, another depth, width, vocabulary
SPACE = """name: other-chassis
chassis: {vocab_size: 68, context: 128, d_model: 64, n_layers: 6, n_heads: 4, d_ff: 256, activation: gelu}
budget: 0.75x
objectives: [val_loss, train_memory_bytes]
recipe: smoke
fit: {width: mlp}
knobs:
  tying: {mode: [cycle], unique_blocks: UNIQUE}
  relaxation: {rank: [4]}
"""


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GQA, untied, llama3-rope LLaMA trained here on BPE tokens and saved as a stock checkpoint."""
    tmp = tmp_path_factory.mktemp("hfck")
    (tmp / "dense.yaml").write_text(CHECKPOINT)
    (tmp / "quick.yaml").write_text(QUICK)
    out = tmp / "ck"
    assert main(["train", str(tmp / "dense.yaml"), "--recipe", str(tmp / "quick.yaml"), "--tokenizer", f"bpe:{V}",
                 "--out", str(out), "--format", "hf", "--device", "cpu"]) == 0
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
    return out


def space_file(tmp_path: Path, unique: int = 2) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(SPACE.replace("UNIQUE", str(unique)))
    return path


def test_the_plan_pins_the_checkpoints_chassis_and_a_resume_rebinds_it(checkpoint: Path, tmp_path: Path) -> None:
    want = read_hf_dir(checkpoint).cfg.chassis
    space = npas.load_space(space_file(tmp_path))
    assert space.reference_chassis.d_model == 64  # the file's chassis, before the plan
    plan = plan_search(space, init_from=str(checkpoint), recipe=FAST, trials=1)
    ref = plan.space.reference_chassis
    assert ref == want, (ref, want)
    assert (ref.family, ref.n_layers, ref.d_model, ref.kv_heads, ref.rms_norm_eps, ref.tie_embeddings) == \
        ("llama", 4, 32, 2, 1e-5, False)
    assert ref.rope["rope_type"] == "llama3" and plan.corpus.vocab_size == V
    assert plan.space.budget_params == round(0.75 * plan.space.reference_params)
    assert plan.init_from is not None and plan.init_from["config_hash"] == read_hf_dir(checkpoint).cfg.hash
    cand = plan.space.sample(optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask())
    assert cand.config is not None and cand.config.chassis == want and cand.config.n_blocks == 2
    # a resume, the exporter and the certificate rebind the study's recorded overrides: the same space
    again = parse_space(plan.space.text, plan.space.source).rebind(plan.space.overrides)
    assert again.hash == plan.space.hash and again.reference_chassis == want
    assert again.sample(optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()).config == \
        cand.config


def test_each_trial_starts_from_the_converted_checkpoint(checkpoint: Path, tmp_path: Path) -> None:
    plan = plan_search(npas.load_space(space_file(tmp_path)), init_from=str(checkpoint), recipe=FAST, trials=1)
    cfg = plan.space.sample(optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1)).ask()).config
    assert cfg is not None and cfg.chassis.llama and cfg.n_blocks == 2
    x, y = plan.corpus.fixed_windows("val", 8, 32)

    def loss(model: torch.nn.Module) -> float:
        with torch.no_grad():
            logits = model.eval()(x)[0]
        return float(torch.nn.functional.cross_entropy(logits.reshape(-1, V), y.reshape(-1)))

    warm = npas.build_model(cfg)
    warm.load_state_dict(initial_state(dict(plan.init_from), cfg, 0, plan.corpus, 32))  # what each worker does
    cold = npas.build_model(cfg)
    # the checkpoint's validation loss after 60 steps is ~3.7 nats; a fresh model's is ln(300) = 5.7
    assert loss(warm) < math.log(V) - 1.0 < loss(cold) - 0.5, (loss(warm), loss(cold))


def test_a_space_whose_knobs_cannot_hold_the_chassis_is_refused_in_one_line(checkpoint: Path, tmp_path: Path,
                                                                            capsys) -> None:
    space = space_file(tmp_path, unique=5)  # fine on the file's 6 layers, not on the checkpoint's 4
    with pytest.raises(ConfigError, match=r"knobs.tying.unique_blocks: 5 .*\[1, 4\]"):
        plan_search(npas.load_space(space), init_from=str(checkpoint), recipe=FAST, trials=1)
    db = tmp_path / "never.db"
    capsys.readouterr()
    code = main(["search", str(space), "--init-from", str(checkpoint), "--recipe", FAST, "--trials", "1",
                 "--storage", f"sqlite:///{db}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "knobs.tying.unique_blocks" in err and "n_layers=4" in err and "change those knobs" in err
    assert not db.exists()
    ray = sys.modules.get("ray")
    assert ray is None or not ray.is_initialized()


def test_a_conflicting_tokenizer_is_refused_in_one_line(checkpoint: Path, tmp_path: Path, capsys) -> None:
    db = tmp_path / "never.db"
    capsys.readouterr()
    code = main(["search", str(space_file(tmp_path)), "--init-from", str(checkpoint), "--tokenizer", "char",
                 "--recipe", FAST, "--trials", "1", "--storage", f"sqlite:///{db}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "drop --tokenizer" in err and not db.exists()


@pytest.mark.slow
def test_a_search_from_a_checkpoint_runs_on_its_chassis_and_resumes(checkpoint: Path, tmp_path: Path) -> None:
    from npas.service.search.launch import Launch
    from npas.service.search.plan import plan_resume
    from npas.service.study import studies
    from npas.service.study.record import TrialAttr

    db = f"sqlite:///{tmp_path / 'hf.db'}"
    out = subprocess.run([sys.executable, "-m", "npas", "search", str(space_file(tmp_path)), "--init-from",
                          str(checkpoint), "--recipe", FAST, "--trials", "2", "--workers", "1", "--no-early-stop",
                          "--sampler", "random", "--study", "hf", "--storage", db],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    want = read_hf_dir(checkpoint).cfg.chassis
    study = optuna.load_study(study_name="hf", storage=db)
    ok = [t for t in study.trials if t.user_attrs.get(TrialAttr.STATUS) == "ok"]
    failed = [t.user_attrs.get(TrialAttr.REASON) for t in study.trials if t.user_attrs.get(TrialAttr.STATUS) == "failed"]
    assert ok and not failed, failed  # the baselines too: narrow_untied keeps the checkpoint's d_model
    for t in ok:
        cfg = ArchConfig.from_dict(t.user_attrs[TrialAttr.ALLOC])
        assert cfg.chassis == want
        first = t.user_attrs[TrialAttr.CURVE][0]
        # from scratch the first evaluation (step 20 of the fast recipe) is near ln(300) = 5.7
        assert first[1] < math.log(V) - 1.0, t.user_attrs[TrialAttr.CURVE]
    record = studies.read_record(study)
    assert record.overrides["chassis"]["n_layers"] == 4 and record.init_from is not None
    plan = plan_resume("hf", record, storage=db, launch=Launch())
    assert plan.space.reference_chassis == want and plan.init_from["weights"] == record.init_from["weights"]


def test_a_padded_checkpoint_is_refused_in_one_line_before_the_database(tmp_path: Path, capsys) -> None:
    from npas.training.data import bundled_text
    from npas.training.tokenizers import train_bpe
    from tests.conversion.test_hf import make_llama

    src = tmp_path / "padded"
    make_llama(src, train_bpe(bundled_text()[:100_000], V), layers=4, vocab=V + 20)  # 320 rows, 300 tokens
    db = tmp_path / "never.db"
    capsys.readouterr()
    code = main(["search", str(space_file(tmp_path)), "--init-from", str(src), "--recipe", FAST, "--trials", "1",
                 "--storage", f"sqlite:///{db}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "320 embedding rows but its tokenizer has 300 tokens" in err and "npas convert" in err
    assert not db.exists()


def test_every_baseline_and_sample_converts_though_the_space_narrows_d_model(checkpoint: Path, tmp_path: Path) -> None:
    """`fit.width: all` (the default) and the narrow_untied baseline narrow d_model, which a llama
    checkpoint cannot convert to: under its pinned chassis every candidate keeps its d_model."""
    path = tmp_path / "all.yaml"
    path.write_text(SPACE.replace("fit: {width: mlp}\n", "").replace("UNIQUE", "2"))
    space = npas.load_space(path)
    assert space.width_fit == "all"
    plan = plan_search(space, init_from=str(checkpoint), recipe=FAST, trials=1)
    cands = [plan.space.candidate({**{k: kn.default for k, kn in plan.space.chassis.items()}, **vals})
             for vals in plan.space.baselines().values()]
    cands += [plan.space.sample(optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=s)).ask())
              for s in range(3)]
    assert len(cands) == 6 and all(c.config is not None for c in cands), [c.reason for c in cands]
    for cand in cands:
        assert cand.config.chassis == plan.space.reference_chassis and cand.fill <= 1.0
        npas.build_model(cand.config).load_state_dict(initial_state(dict(plan.init_from), cand.config, 0))
