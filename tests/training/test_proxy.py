"""The proxy run on the real corpus: it learns, it is reproducible, it fails cleanly, it stops early."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

import npas
from npas.allocation.config import ArchConfig, Bank, Chassis, reference_config
from npas.errors import ConfigError, DataError
from npas.training.data import load_corpus
from npas.training.forks import run_proxy
from npas.training.proxy import ProxyResult, eval_batches, param_groups
from npas.training.recipe import Recipe, load_recipe

CHASSIS = Chassis(vocab_size=68, context=64, d_model=64, n_layers=2, n_heads=4, d_ff=256)
REF = reference_config(CHASSIS)
TIED = ArchConfig(chassis=CHASSIS, mlp_widths=(256, 256), block_of_layer=(0, 0))
POOLED = ArchConfig(chassis=CHASSIS, mlp_widths=(256, 256), block_of_layer=(0, 1),
                    banks=(Bank(members=((0, "mlp_up"), (1, "mlp_up")), generator="tie", size=256 * 64),))
QUICK = Recipe(name="quick", seq_len=32, batch_size=8, steps=30, lr=1e-2, min_lr=1e-3, warmup_steps=5,
               eval_every=10, eval_batches=2, threads=1)


@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


def test_smoke_recipe_learns_the_real_corpus(corpus):
    recipe = load_recipe("smoke")
    res = run_proxy(REF, recipe, corpus)
    assert res.status == "ok" and res.failure_reason is None
    assert res.steps_done == recipe.steps
    assert res.val_loss < math.log(corpus.vocab_size) - 1.0  # ln 68 = 4.22: well below uniform guessing
    assert res.val_bpc == pytest.approx(res.val_loss / math.log(2))
    assert res.curve[-1] == (recipe.steps, res.val_loss)
    assert [s for s, _ in res.curve] == list(range(recipe.eval_every, recipe.steps + 1, recipe.eval_every))
    assert res.curve[-1][1] < res.curve[0][1]  # it improves over the run
    assert res.stored_params == npas.count(REF).stored_params
    acc = npas.count(REF, batch_size=recipe.batch_size, seq_len=recipe.seq_len)
    assert res.peak_memory_bytes == acc.train_memory_bytes and res.memory_source == "analytic"
    assert res.flops_per_token == acc.flops_per_token and res.param_bytes == acc.param_bytes
    assert res.tokens_per_s > 0 and res.wall_s > 0 and res.train_loss < 3.5
    assert res.config_hash == REF.hash


def test_same_seed_same_losses_other_seed_differs(corpus):
    a = run_proxy(REF, QUICK, corpus)
    b = run_proxy(REF, QUICK, corpus)
    assert a.curve == b.curve and a.train_loss == b.train_loss
    c = run_proxy(REF, Recipe.from_dict({**QUICK.to_dict(), "seed": 1}), corpus)
    assert c.curve != a.curve


def test_diverging_run_fails_cleanly_and_process_stays_healthy(corpus):
    wild = Recipe.from_dict({**QUICK.to_dict(), "lr": 1e6, "min_lr": 1e6, "grad_clip": 0.0, "warmup_steps": 0})
    res = run_proxy(REF, wild, corpus)
    assert res.status == "failed"
    assert res.failure_reason.startswith("non-finite loss at step ")
    assert 1 <= res.steps_done < wild.steps
    assert res.val_loss is None and res.val_bpc is None
    json.dumps(res.to_dict(), allow_nan=False)  # failed results stay JSON-safe
    ok = run_proxy(REF, QUICK, corpus)  # the next trial in this process is unaffected
    assert ok.status == "ok" and math.isfinite(ok.val_loss)


def test_report_sees_every_eval_and_can_stop_early(corpus):
    seen: list[tuple[int, float]] = []

    def report(step: int, val_loss: float) -> bool:
        seen.append((step, val_loss))
        return step >= 20

    res = run_proxy(REF, QUICK, corpus, report=report)
    assert res.status == "stopped" and res.steps_done == 20 < QUICK.steps
    assert [s for s, _ in seen] == [10, 20]
    assert res.curve == tuple(seen) and res.val_loss == seen[-1][1]
    full = run_proxy(REF, QUICK, corpus, report=lambda s, v: False)
    assert full.status == "ok" and full.steps_done == QUICK.steps
    assert full.curve[:2] == res.curve  # stopping early changes nothing before the stop


def test_progress_hook_and_result_round_trip(corpus):
    calls: list[tuple[int, float, float]] = []
    res = run_proxy(REF, QUICK, corpus, progress=lambda s, loss, tps: calls.append((s, loss, tps)))
    assert [s for s, _, _ in calls] == [10, 20, 30]
    assert calls[-1][1] == res.train_loss and all(t > 0 for _, _, t in calls)
    d = res.to_dict()
    assert json.loads(json.dumps(d, allow_nan=False)) == d
    assert ProxyResult.from_dict(d) == res


@pytest.mark.parametrize("cfg", [TIED, POOLED], ids=["tied", "pooled"])
def test_shared_allocations_train(corpus, cfg):
    res = run_proxy(cfg, QUICK, corpus)
    assert res.status == "ok"
    assert res.stored_params == npas.count(cfg).stored_params < npas.count(REF).stored_params
    assert res.val_loss < math.log(68)


def test_mismatches_refused_before_training(corpus, tmp_path):
    wide = reference_config(Chassis(vocab_size=70, context=64, d_model=32, n_layers=1, n_heads=2, d_ff=64))
    with pytest.raises(ConfigError, match="chassis vocab_size=70 but corpus .* under tokenizer char has 68 tokens"):
        run_proxy(wide, QUICK, corpus)
    with pytest.raises(ConfigError, match="seq_len=128 but the chassis context is 64"):
        run_proxy(REF, Recipe.from_dict({**QUICK.to_dict(), "seq_len": 128}), corpus)
    small = tmp_path / "small.txt"
    small.write_text("".join(sorted(corpus.tokenizer.chars)) * 3)
    with pytest.raises(DataError, match="too small for seq_len=32"):
        run_proxy(REF, QUICK, load_corpus(small))


def test_eval_batches_fixed_by_seed(corpus):
    x1, y1 = eval_batches(corpus, QUICK)
    x2, _ = eval_batches(corpus, QUICK)
    assert x1.shape == (QUICK.eval_batches, QUICK.batch_size, QUICK.seq_len)
    assert torch.equal(x1, x2) and torch.equal(x1[..., 1:], y1[..., :-1])


def test_param_groups_fallback_decays_only_matrices():
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and [p.dim() for p in decay["params"]] == [2]
    assert no_decay["weight_decay"] == 0.0 and all(p.dim() == 1 for p in no_decay["params"])
    assert len(no_decay["params"]) == 3  # linear bias, norm weight and bias
