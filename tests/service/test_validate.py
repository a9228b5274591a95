"""`npas validate` through its own path: the CLI, the study read back, the linked study, the
certificate attr. Retrainings are planted (the injectable `train_and_test`) except in the one
end-to-end test, which trains for real on a real small study."""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import numpy as np
import optuna
import pytest
import torch
from optuna.trial import TrialState

import npas
from npas.allocation.budget import count
from npas.presentation.cli import main
from npas.service.certify import retrain as V
from npas.service.certify.certificate import CERTIFICATE_ATTR
from npas.service.certify.targets import SEED_BASE
from npas.service.study.record import Constraint, RetrainAttr, StudyRecord, TrialAttr
from npas.training.recipe import Recipe, load_recipe
from tests.conftest import ROOT

TINY = ROOT / "tests" / "data" / "tiny.yaml"
FAST = str(ROOT / "tests" / "data" / "fast.yaml")


def synthetic_study(url: str, n: int = 16, seed: int = 0) -> tuple[str, dict[str, float]]:
    """An npas-shaped study of ``n`` real, distinct allocations of the tiny space (baselines first),
    with planted proxy losses 2.0, 2.05, ... in a shuffled order. Returns (name, hash -> proxy loss)."""
    space = npas.load_space(TINY)
    chassis = {k: kn.default for k, kn in space.chassis.items()}
    cfgs = {}
    for bname, vals in space.baselines().items():
        cfgs[bname] = space.candidate({**chassis, **vals}).config
    scratch = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed), directions=["minimize"] * 2)
    while len(cfgs) < n:
        cand = space.sample(scratch.ask())
        if cand.feasible and cand.config.hash not in {c.hash for c in cfgs.values()}:
            cfgs[f"t{len(cfgs)}"] = cand.config
    name = f"v-{uuid.uuid4().hex[:8]}"
    st = optuna.create_study(study_name=name, storage=url, directions=["minimize"] * 2)
    st.set_metric_names(["val_loss", "train_memory_bytes"])
    recipe = load_recipe(FAST)
    record = StudyRecord(version=npas.__version__, space_text=space.text, space_hash=space.hash,
                         space_name=space.name, space_source=space.source, budget_params=space.budget_params,
                         budget_spec=space.budget_spec, reference_params=space.reference_params,
                         recipe=recipe.to_dict(), data_source=None, data_fingerprint="synthetic",
                         vocab_size=space.reference_chassis.vocab_size,
                         objectives=("val_loss", "train_memory_bytes"))
    for k, v in record.to_attrs().items():  # the record a real search writes, read back by validate
        st.set_user_attr(k, v)
    order = np.random.default_rng(seed).permutation(n)
    proxy = {}
    for i, (label, cfg) in enumerate(cfgs.items()):
        loss = 2.0 + 0.05 * int(order[i])
        proxy[cfg.hash] = loss
        acc = count(cfg, seq_len=recipe.seq_len)
        attrs = {TrialAttr.ALLOC: cfg.to_dict(), TrialAttr.HASH: cfg.hash, TrialAttr.ACCOUNTING: acc.to_dict()}
        if not label.startswith("t"):
            attrs[TrialAttr.BASELINE] = label
        st.add_trial(optuna.trial.create_trial(values=[loss, float(acc.train_memory_bytes)], user_attrs=attrs,
                                               constraints={Constraint.BUDGET: -1.0, Constraint.FIDELITY: 0.0}))
    return name, proxy


def _noise(key: str, seed: int, scale: float) -> float:
    h = int(hashlib.sha256(f"{key}:{seed}".encode()).hexdigest()[:12], 16)
    return float(np.random.default_rng(h).normal(0.0, scale))


def _run_cli(capsys, name: str, url: str, *extra: str) -> dict:
    rc = main(["validate", name, "--storage", url, "--recipe", FAST, "--workers", "0", "--format", "json", *extra])
    out = capsys.readouterr().out
    assert rc == 0
    return json.loads(out)


def test_pure_noise_gives_snr_near_one_and_a_tau_interval_covering_zero(tmp_path, monkeypatch, capsys):
    url = f"sqlite:///{tmp_path}/v.db"
    name, proxy = synthetic_study(url, n=24)
    # the noise is keyed on each allocation's place in the study, not on its hash: which allocations the
    # space's fit makes is not what this test is about, and keying on the hash re-draws the noise (one
    # draw of pure noise has a 5% chance of an interval that misses zero) whenever the fit changes
    place = {h: f"c{i}" for i, h in enumerate(proxy)}
    monkeypatch.setattr(V, "train_and_test",
                        lambda cfg, recipe, **kw: 2.0 + _noise(place[cfg.hash], recipe.seed, 0.05))
    cert = _run_cli(capsys, name, url, "--top", "4", "--sample", "20", "--seeds", "4")
    assert cert["all"]["n"] >= 20
    assert 0.6 < cert["snr"] < 1.6, cert["snr"]
    tau = cert["all"]["kendall_tau"]
    assert tau["low"] < 0.0 < tau["high"], tau
    assert abs(cert["seed_std"] - 0.05) < 0.015


def test_planted_ordering_gives_tau_near_one_and_a_large_snr(tmp_path, monkeypatch, capsys):
    url = f"sqlite:///{tmp_path}/v.db"
    name, proxy = synthetic_study(url, n=16)

    def planted(cfg, recipe, **kw):  # the proxy's order, shifted, plus small seed noise
        return proxy.get(cfg.hash, 2.5) - 0.3 + _noise(cfg.hash, recipe.seed, 0.003)

    monkeypatch.setattr(V, "train_and_test", planted)
    cert = _run_cli(capsys, name, url, "--top", "4", "--sample", "8", "--seeds", "3")
    assert cert["all"]["kendall_tau"]["value"] > 0.9
    assert cert["all"]["kendall_tau"]["low"] > 0.7
    assert cert["front"]["n"] >= 2 and cert["rank_flips"]["flips"] == 0
    assert cert["snr"] > 10
    seeds = cert["seeds"]
    assert len(seeds) == 3 and load_recipe(FAST).seed not in seeds  # fresh seeds, never the proxy's
    # the certificate is in the source study, readable by plain Optuna
    plain = optuna.load_study(study_name=name, storage=url)
    assert plain.user_attrs[CERTIFICATE_ATTR]["all"] == cert["all"]


def test_matched_baselines_are_trained_on_the_same_seeds_and_reported(tmp_path, monkeypatch, capsys):
    url = f"sqlite:///{tmp_path}/v.db"
    name, proxy = synthetic_study(url, n=8)
    monkeypatch.setattr(V, "train_and_test", lambda cfg, recipe, **kw: proxy.get(cfg.hash, 3.0)
                        + _noise(cfg.hash, recipe.seed, 0.01))
    cert = _run_cli(capsys, name, url, "--top", "2", "--sample", "3", "--seeds", "3", "--pick", "min-loss")
    rows = {r["hash"]: r for r in cert["allocations"]}
    mem, comp = cert["matched"]["memory"], cert["matched"]["compute"]
    assert "narrow_untied" in rows[mem["hash"]]["label"] and "memory_matched" in rows[mem["hash"]]["roles"]
    assert "flops_matched" in rows[comp["hash"]]["roles"] and rows[comp["hash"]]["trial"] is None
    assert 0.9 < comp["flops_ratio"] < 1.1
    pick = rows[cert["pick"]["hash"]]
    expected = np.mean(np.array(pick["test_losses"]) - np.array(rows[mem["hash"]]["test_losses"]))
    assert mem["delta"]["value"] == pytest.approx(expected)
    assert mem["delta"]["low"] < mem["delta"]["value"] < mem["delta"]["high"]
    assert comp["delta"]["value"] == pytest.approx(proxy[pick["hash"]] - 3.0, abs=0.05)


KILLED = """
import sys, time
from npas.service.certify import retrain as V
def slow(cfg, recipe, **kw):
    time.sleep(0.3)
    return 2.0 + (recipe.seed % 7) * 0.01
V.train_and_test = slow
from npas.presentation.cli import main
sys.exit(main(["validate", {name!r}, "--storage", {url!r}, "--recipe", {fast!r}, "--workers", "0",
               "--top", "3", "--sample", "3", "--seeds", "2"]))
"""


@pytest.mark.slow  # fault tolerance: a validate subprocess killed mid-run and resumed
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_killed_mid_run_resumes_without_rerunning_completed_retrainings(sig, tmp_path, monkeypatch, capsys):
    url = f"sqlite:///{tmp_path}/v.db"
    name, _ = synthetic_study(url, n=10)
    script = textwrap.dedent(KILLED.format(name=name, url=url, fast=FAST))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, cwd=tmp_path, stderr=subprocess.PIPE,
                            text=True)
    linked = V.linked_name(name)
    deadline = time.time() + 120
    done_before: list = []
    while time.time() < deadline:
        time.sleep(0.2)
        try:
            lst = optuna.load_study(study_name=linked, storage=url)
        except KeyError:
            continue
        done_before = lst.get_trials(states=(TrialState.COMPLETE,))
        if len(done_before) >= 3:
            break
    proc.send_signal(sig)  # SIGKILL: no chance to clean up, a RUNNING trial is left behind
    err = proc.communicate()[1]
    if sig == signal.SIGTERM:  # stopped like Ctrl-C: says how to continue, exit 130
        assert proc.returncode == 130 and "npas validate: error: validation interrupted" in err, err
    lst = optuna.load_study(study_name=linked, storage=url)
    done_before = lst.get_trials(states=(TrialState.COMPLETE,))
    assert len(done_before) >= 3
    keys_before = {t.user_attrs[RetrainAttr.KEY] for t in done_before}

    calls = []

    def counting(cfg, recipe, **kw):
        calls.append((cfg.hash, recipe.seed))
        return 2.0 + (recipe.seed % 7) * 0.01

    monkeypatch.setattr(V, "train_and_test", counting)
    cert = _run_cli(capsys, name, url, "--top", "3", "--sample", "3", "--seeds", "2")
    total = cert["planned"] * 2
    assert len(calls) == total - len(keys_before)  # nothing completed ran again
    plain = optuna.load_study(study_name=linked, storage=url)  # plain Optuna reads every number
    complete = plain.get_trials(states=(TrialState.COMPLETE,))
    keys = [t.user_attrs[RetrainAttr.KEY] for t in complete]
    assert len(keys) == len(set(keys)) == total
    assert all(t.values[0] == t.user_attrs[RetrainAttr.TEST_LOSS] for t in complete)
    assert not plain.get_trials(states=(TrialState.RUNNING,))  # the killed run's trial was failed
    assert cert["retrainings"] == total and cert["complete"] == cert["planned"]
    # a second run has nothing left to do
    calls.clear()
    _run_cli(capsys, name, url, "--top", "3", "--sample", "3", "--seeds", "2")
    assert calls == []


@pytest.mark.parametrize("args, fragment", [
    (["--seeds", "1"], "--seeds must be >= 2"),
    (["--top", "0"], "--top must be >= 1"),
    (["--threads", "0"], "--threads must be >= 1"),
    (["--pick", "best"], "--pick 'best' is not one of"),
    (["--recipe", "nosuch"], "recipe 'nosuch' not found"),
    (["--storage", "nosuch://x"], "unknown storage backend"),
])
def test_bad_input_is_one_line_exit_2_and_touches_nothing(args, fragment, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from npas.service.execution import session as runner

    started = []  # npas starts Ray only through these; a session's Ray may already be up, so spy on them
    for fn in ("start_ray_early", "check_address_reachable", "init_ray"):
        monkeypatch.setattr(runner, fn, lambda *a, _fn=fn, **k: started.append(_fn))
    argv = ["validate", "some-study", *args]
    if "--storage" not in args:
        argv += ["--storage", f"sqlite:///{tmp_path}/never.db"]
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2
    assert fragment in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "never.db").exists()
    assert not started, started


def test_table_format_reports_every_statistic(tmp_path, monkeypatch, capsys):
    url = f"sqlite:///{tmp_path}/v.db"
    name, proxy = synthetic_study(url, n=8)
    monkeypatch.setattr(V, "train_and_test", lambda cfg, recipe, **kw: proxy.get(cfg.hash, 3.0)
                        + _noise(cfg.hash, recipe.seed, 0.01))
    assert main(["validate", name, "--storage", url, "--recipe", FAST, "--workers", "0", "--top", "2",
                 "--sample", "3"]) == 0
    out = capsys.readouterr().out
    for needle in ("Kendall tau", "Spearman rho", "rank flips among front points", "signal-to-noise",
                   "seed noise", "R²", "equal stored params", "FLOPs ratio", f"seeds {SEED_BASE}"):
        assert needle in out, needle


def test_dashboard_fidelity_panel_info(tmp_path, monkeypatch, capsys):
    from npas.presentation.dashboard.info import fidelity_info
    from npas.presentation.dashboard.render import render_fidelity

    url = f"sqlite:///{tmp_path}/v.db"
    name, proxy = synthetic_study(url, n=8)
    before = fidelity_info(optuna.load_study(study_name=name, storage=url))
    assert not before.points and f"npas validate {name}" in before.note and render_fidelity(before) is None
    monkeypatch.setattr(V, "train_and_test", lambda cfg, recipe, **kw: proxy.get(cfg.hash, 3.0)
                        + _noise(cfg.hash, recipe.seed, 0.02))
    cert = _run_cli(capsys, name, url, "--top", "2", "--sample", "4", "--seeds", "3")
    info = fidelity_info(optuna.load_study(study_name=name, storage=url))
    ranked = [r for r in cert["allocations"] if r["trial"] is not None]
    assert len(info.points) == len(ranked)
    for trial, _, p, mean, lo, hi, front in info.points:
        row = next(r for r in ranked if r["trial"] == trial)
        assert p == row["proxy_loss"] and mean == pytest.approx(row["test_mean"])
        assert lo < mean < hi and front == ("front" in row["roles"])
    assert info.tau_all == cert["all"]["kendall_tau"]
    assert render_fidelity(info) is not None


def test_scores_on_the_held_out_test_split():
    """Retrainings are scored on the test split's fixed windows, which the search never read."""
    from npas.training.data import load_corpus
    from npas.training.proxy import eval_batches

    corpus = load_corpus()
    recipe = Recipe(name="score", seq_len=32, batch_size=4, eval_batches=2)
    x, _ = V.score_batches(corpus, recipe)
    tx, _ = eval_batches(corpus, recipe, split="test")
    vx, _ = eval_batches(corpus, recipe, split="val")
    assert torch.equal(x, tx) and not torch.equal(x, vx)


@pytest.mark.slow
def test_end_to_end_real_training_on_a_real_study(ray_local, tmp_path, capsys):
    """A real tiny search, then `npas validate` with real training on Ray (smoke-sized recipe)."""
    from npas.service.search.driver import Launch, search

    url = f"sqlite:///{tmp_path}/npas.db"
    search(npas.load_space(TINY), trials=5, study="e2e", storage=url, recipe=FAST, seed=1,
           launch=Launch(workers=2, early_stop=False))
    rc = main(["validate", "e2e", "--storage", url, "--recipe", FAST, "--top", "2", "--sample", "3",
               "--seeds", "2", "--workers", "2", "--format", "json"])
    assert rc == 0
    cert = json.loads(capsys.readouterr().out)
    assert cert["complete"] == cert["planned"] >= 4
    plain = optuna.load_study(study_name="e2e:validate", storage=url)
    losses = [t.values[0] for t in plain.get_trials(states=(TrialState.COMPLETE,))]
    assert len(losses) == cert["retrainings"] == 2 * cert["planned"]
    assert all(1.0 < v < 4.3 for v in losses)  # trained: below ln(68) = 4.22 nats of a uniform guess
    assert cert["snr"] is not None and cert["all"]["kendall_tau"]["value"] is not None
    # fresh seeds: the same allocation on two seeds gives two different test losses
    row = next(r for r in cert["allocations"] if r["complete"])
    assert row["test_losses"][0] != row["test_losses"][1]
    # every test loss also in bits per byte: a char model on the (ASCII) bundled text has bpb = nats / ln 2
    assert cert["bits_per_byte_per_nat"] == pytest.approx(1 / math.log(2), rel=1e-9)
    assert row["test_mean_bpb"] == pytest.approx(row["test_mean"] / math.log(2))


def _study_names(url: str) -> list[str]:
    return [s.study_name for s in optuna.get_all_study_summaries(storage=url)]


def test_every_retraining_diverging_leaves_no_linked_study(tmp_path, capsys):
    """"nothing was stored" is true: the NAME:validate study of failures alone is deleted, so the
    storage holds what it held before the run (and a rerun starts from scratch, as it would anyway)."""
    from npas.errors import StudyError
    from npas.service.certify.targets import Options

    url = f"sqlite:///{tmp_path / 'v.db'}"
    name, _ = synthetic_study(url, n=6)
    before = _study_names(url)
    with pytest.raises(StudyError, match="nothing was stored") as info:
        V.certify(name, Options(top=2, sample=1, seeds=2, workers=0, recipe=FAST), storage=url,
                  retrain=lambda cfg, recipe: float("nan"))
    assert "\n" not in str(info.value)
    assert _study_names(url) == before  # no "NAME:validate" with FAIL trials
    assert CERTIFICATE_ATTR not in optuna.load_study(study_name=name, storage=url).user_attrs


def test_completed_retrainings_of_an_uncertified_run_are_kept_and_said_so(tmp_path):
    """Each allocation's first seed completes, its second diverges: no allocation is scored, so no
    certificate, but the completed retrainings stay for the rerun, and the message says so instead of
    "nothing was stored"."""
    from npas.errors import StudyError
    from npas.service.certify.targets import Options

    url = f"sqlite:///{tmp_path / 'v.db'}"
    name, _ = synthetic_study(url, n=6)
    seen: set[str] = set()

    def first_seed_only(cfg, recipe) -> float:
        if cfg.hash in seen:
            return float("nan")
        seen.add(cfg.hash)
        return 2.0

    with pytest.raises(StudyError) as info:
        V.certify(name, Options(top=2, sample=1, seeds=2, workers=0, recipe=FAST), storage=url,
                  retrain=first_seed_only)
    msg = str(info.value)
    assert "nothing was stored" not in msg and "kept in study" in msg, msg
    linked = optuna.load_study(study_name=V.linked_name(name), storage=url)
    done = linked.get_trials(states=(TrialState.COMPLETE,))
    assert len(done) == len(seen) >= 2 and f"the {len(done)} completed" in msg
