"""The study dashboard: each figure's info against the study's own trials, the page in a real
headless Chromium, empty and all-failed studies, and the `npas dashboard` command (with --live)."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState, create_trial

import npas
from npas.allocation.budget import count
from npas.allocation.config import reference_config
from npas.errors import NpasError
from npas.presentation.cli import main
from npas.presentation.dashboard import (
    ReferenceMark,
    allocation_info,
    curves_info,
    hypervolume_info,
    importance_info,
    pareto_info,
    summary_info,
    taper_info,
    trials_frame,
    write_report,
)
from npas.service.study.record import Constraint, StudyAttr, TrialAttr
from npas.service.study.studies import front_trials, is_full_fidelity, status
from tests.conftest import ROOT

TINY = ROOT / "tests" / "data" / "tiny.yaml"
FAST = str(ROOT / "tests" / "data" / "fast.yaml")
CHROMIUM = Path("/usr/bin/chromium")
# outside CI a missing browser skips; in CI (CI=true) the test runs and fails, so a page test never goes missing
needs_chromium = pytest.mark.skipif(not CHROMIUM.exists() and os.environ.get("CI") != "true",
                                    reason="/usr/bin/chromium is absent: apt-get install -y chromium")


@pytest.fixture(scope="module")
def smoke(smoke_study):
    """One small real search (real Ray, real SQLite): (study, storage url); the session's shared one."""
    return smoke_study


def npas_attrs(study: optuna.Study) -> None:
    """The study attributes `npas search` writes, enough for the dashboard and `npas.service.study.studies.load`."""
    space = npas.load_space(TINY)
    study.set_metric_names(list(space.objectives))
    for k, v in {StudyAttr.SPACE_TEXT: space.text, StudyAttr.SPACE_NAME: space.name, StudyAttr.BUDGET: space.budget_params,
                 StudyAttr.BUDGET_SPEC: space.budget_spec, StudyAttr.REFERENCE: space.reference_params,
                 StudyAttr.OBJECTIVES: list(space.objectives), StudyAttr.VOCAB: 68}.items():
        study.set_user_attr(k, v)


def failed_only(storage=None, name: str = "failed-only", n: int = 3) -> optuna.Study:
    st = optuna.create_study(study_name=name, storage=storage, directions=["minimize", "minimize"])
    npas_attrs(st)
    for i in range(n):
        t = st.ask()
        t.set_user_attr(TrialAttr.STATUS, "infeasible" if i == 0 else "failed")
        t.set_user_attr(TrialAttr.REASON, "does not fit the budget" if i == 0 else "non-finite validation loss at step 20")
        st.tell(t, state=TrialState.FAIL)
    return st


@pytest.fixture(scope="module")
def mixed(smoke):
    """The smoke trials plus the cases a small search rarely makes: stopped early, over budget,
    infeasible and failed, the first two with values that would dominate everything else."""
    real, _ = smoke
    st = optuna.create_study(directions=real.directions)
    st.set_metric_names(real.metric_names)
    for k, v in real.user_attrs.items():
        st.set_user_attr(k, v)
    st.add_trials(real.get_trials(deepcopy=False))
    donor = front_trials(real)[0].user_attrs
    best = [0.5, 1000.0]
    st.add_trial(create_trial(values=best, user_attrs={**donor, TrialAttr.STATUS: "stopped", TrialAttr.FIDELITY: 20},
                              constraints={Constraint.BUDGET: -1.0, Constraint.FIDELITY: 0.5}))
    st.add_trial(create_trial(values=best, user_attrs={**donor, TrialAttr.STATUS: "ok"},
                              constraints={Constraint.BUDGET: 500.0, Constraint.FIDELITY: 0.0}))
    for name in ("infeasible", "failed"):
        st.add_trial(create_trial(state=TrialState.FAIL, user_attrs={TrialAttr.STATUS: name, TrialAttr.REASON: name}))
    return st


# ---- info functions against the study's own trials -------------------------------------------
def test_pareto_info_points_are_the_trials_and_the_front_is_optunas(smoke):
    st, _ = smoke
    info = pareto_info(st)
    complete = [t for t in st.trials if t.state == TrialState.COMPLETE]
    assert info.names == ["val_loss", "train_memory_bytes"]
    assert {p.number: p.values for p in info.points} == {t.number: tuple(t.values) for t in complete}
    assert sorted(p.values for p in info.points if p.on_front) == sorted(tuple(t.values) for t in st.best_trials)
    assert info.front == [t.number for t in front_trials(st)]
    baselines = {t.number: t.user_attrs[TrialAttr.BASELINE] for t in complete if t.user_attrs.get(TrialAttr.BASELINE)}
    assert {p.number: p.baseline for p in info.points if p.baseline} == baselines
    assert info.budget_params == st.user_attrs[StudyAttr.BUDGET]
    space, rec = npas.load_space(TINY), st.user_attrs[StudyAttr.RECIPE]
    ref = count(reference_config(space.reference_chassis), batch_size=rec["batch_size"], seq_len=rec["seq_len"])
    assert info.reference == ReferenceMark("train_memory_bytes", ref.train_memory_bytes, st.user_attrs[StudyAttr.REFERENCE])


def test_pareto_info_keeps_stopped_and_over_budget_trials_off_the_front(smoke, mixed):
    info = pareto_info(mixed)
    assert info.front == pareto_info(smoke[0]).front  # the dominating two are not on it
    by_number = {p.number: p for p in info.points}
    stopped, over = (by_number[t.number] for t in mixed.trials[-4:-2])
    assert not stopped.full_fidelity and stopped.within_budget and not stopped.on_front
    assert over.full_fidelity and not over.within_budget and not over.on_front
    assert info.no_values == {"infeasible": 1, "failed": 1}


def test_hypervolume_info_agrees_with_optunas_history(smoke, mixed):
    from optuna.visualization._hypervolume_history import _get_hypervolume_history_info

    for st in (smoke[0], mixed):
        info = hypervolume_info(st)
        full = [t for t in st.trials if is_full_fidelity(t)]
        worst = np.max([t.values for t in full], axis=0)
        best = np.min([t.values for t in full], axis=0)
        assert info.reference_point == pytest.approx(list(worst * 1.1))
        assert info.trial_numbers == [t.number for t in st.trials if t.state == TrialState.COMPLETE]
        raw = _get_hypervolume_history_info(st, np.asarray(info.reference_point))
        assert info.values == pytest.approx([v / np.prod(worst * 1.1 - best) for v in raw.values])
        assert all(0.0 <= v <= 1.0 for v in info.values) and info.values == sorted(info.values)


def test_allocation_info_has_a_row_per_front_trial_and_a_column_per_layer(smoke):
    st, _ = smoke
    info = allocation_info(st)
    front = front_trials(st)
    assert info.n_layers == 4
    assert [r.number for r in info.rows] == [t.number for t in front]
    for row, t in zip(info.rows, front, strict=True):
        alloc, acc = t.user_attrs[TrialAttr.ALLOC], t.user_attrs[TrialAttr.ACCOUNTING]
        assert len(row.cells) == info.n_layers
        assert [c.stored for c in row.cells] == acc["layer_stored"]
        assert [c.block for c in row.cells] == alloc["block_of_layer"]
        assert [c.width for c in row.cells] == alloc["mlp_widths"]
        assert [(c.lora_attn, c.lora_mlp) for c in row.cells] == list(zip(alloc["lora_attn"], alloc["lora_mlp"],
                                                                          strict=True))
        in_bank = {(b, s) for bank in alloc["banks"] for b, s in bank["members"]}
        assert {(c.block, s) for c in row.cells for _, slots in c.banks for s in slots} == in_bank


def _map_text(cfg) -> tuple[list, list[str]]:
    """The allocation map of one trial holding `cfg`: its cells and the text drawn in each cell."""
    from npas.presentation.dashboard.allocations import AllocationInfo, allocation_row
    from npas.presentation.dashboard.render import render_allocation

    t = create_trial(values=[1.0, 2.0], user_attrs={TrialAttr.ALLOC: cfg.to_dict(),
                                                    TrialAttr.ACCOUNTING: count(cfg).to_dict()})
    row = allocation_row(t)
    fig = render_allocation(AllocationInfo(cfg.chassis.n_layers, [row]))
    return row.cells, [x.get_text() for x in fig.axes[0].texts]


def test_allocation_map_marks_atom_projections_and_kv_sharing_groups():
    from npas.allocation.config import ArchConfig, AtomSpec, Chassis

    ch = Chassis(vocab_size=68, context=32, d_model=32, n_layers=6, n_heads=4, d_ff=64)
    # cycle-tied blocks (ABCABC), atoms on q/k/v/o with K=2, KV groups {0,1,2} {3,4} {5}
    cfg = ArchConfig(chassis=ch, mlp_widths=(64,) * 6, block_of_layer=(0, 1, 2, 0, 1, 2), kv_source=(0, 0, 0, 3, 3, 5),
                     atoms=tuple(AtomSpec(f"attn_{c}", 2) for c in "qkvo"))
    cells, text = _map_text(cfg)
    assert [c.kv_source for c in cells] == [None, 0, 0, None, 3, None]
    assert [c.kv_consumers for c in cells] == [(1, 2), (), (), (4,), (), ()]
    # a consumer computes no keys or values, so only its q/o come from atoms
    assert [len(c.atoms) for c in cells] == [4, 2, 2, 4, 2, 4]
    assert text[0].splitlines()[-2:] == ["atoms qkvo K=2", "KV source → 1,2"]
    assert text[1].splitlines()[-2:] == ["atoms qo K=2", "KV ← layer 0"]
    assert text[4].splitlines()[-2:] == ["atoms qo K=2", "KV ← layer 3"]
    assert text[5].splitlines()[-1] == "atoms qkvo K=2"  # a group of one: no KV marker
    assert all(line.startswith("block ") for t in text for line in t.splitlines()[1:2])  # tying info kept beside

    # values-only sharing: consumers keep their own keys (and key atoms)
    _, text = _map_text(ArchConfig(chassis=ch, mlp_widths=(64,) * 6, block_of_layer=tuple(range(6)),
                                   kv_source=(0, 0, 2, 2, 4, 4), kv_mode="v", atoms=(AtomSpec("attn_k", 3),)))
    assert text[0].splitlines()[-2:] == ["atoms k K=3", "V source → 1"]
    assert text[1].splitlines()[-2:] == ["atoms k K=3", "V ← layer 0"]

    # the untied reference: no atom or KV marker anywhere
    _, text = _map_text(reference_config(ch))
    assert not [line for t in text for line in t.splitlines() if "atoms" in line or "←" in line or "→" in line]


def test_allocation_map_marks_the_expert_pool_each_layer_reads():
    import optuna

    from npas.allocation.space_parser import load_space

    space = load_space(ROOT / "search_spaces" / "expert_pool.yaml")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=2))
    cfg = next(c.config for c in (space.sample(study.ask()) for _ in range(100)) if c.feasible and c.config.experts)
    e = cfg.experts
    cells, text = _map_text(cfg)
    assert [c.experts[0] for c in cells] == list(e.pool_of_layer)
    for i, t in enumerate(text):
        q = e.pool_of_layer[i]
        assert f"pool {q}: top-{e.top_k} of {e.pool_sizes[q]} x ff {e.d_expert}" in t.splitlines()
        assert not any(line.startswith("ff ") for line in t.splitlines())  # no dense MLP width
    _, dense = _map_text(reference_config(cfg.chassis))
    assert all("pool " not in t for t in dense)


def test_taper_and_curves_info_follow_the_front(smoke):
    st, _ = smoke
    front = front_trials(st)
    taper = taper_info(st)
    assert taper.reference_width == 96  # tiny.yaml's chassis d_ff
    assert [(n, w) for n, _, w in taper.lines] == [(t.number, t.user_attrs[TrialAttr.ALLOC]["mlp_widths"]) for t in front]
    curves = curves_info(st)
    assert curves.max_fidelity == 40
    assert [(n, [[s, v] for s, v in zip(steps, vals, strict=True)]) for n, _, steps, vals in curves.curves] == \
        [(t.number, t.user_attrs[TrialAttr.CURVE]) for t in front]


def test_importance_info_needs_enough_trials_and_survives_conditional_params(smoke):
    st, _ = smoke
    few = importance_info(st)  # 6 trials, 3 of them baselines: below the default minimum
    assert all(not imp for _, imp in few.per_objective) and set(few.notes) == {"val_loss", "train_memory_bytes"}
    some = importance_info(st, min_trials=2)  # conditional knobs (generator only with pools) included
    searched = [t for t in st.trials if t.params and is_full_fidelity(t)]
    assert some.n_trials == len(searched)
    params = set().union(*(t.params for t in searched))
    for _, imp in some.per_objective:
        assert imp and set(imp) <= params and sum(imp.values()) == pytest.approx(1.0, abs=1e-6)


def test_trials_frame_has_one_row_per_trial(mixed):
    frame = trials_frame(mixed)
    assert list(frame["trial"]) == [t.number for t in mixed.trials]
    assert list(frame["status"]) == [status(t) for t in mixed.trials]
    over = frame[frame["budget_margin"] < 0]
    assert list(over["trial"]) == [mixed.trials[-3].number]


# ---- the page in a real browser -------------------------------------------------------------
def chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp / "chromium-profile"
    cmd = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
           f"--user-data-dir={profile}", *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def selfcheck(tmp: Path, page: Path, hash_: str = "") -> dict[str, str]:
    """Load the page, let its inline self-check run, and read back what it wrote into the DOM."""
    dom = chromium(tmp, "--virtual-time-budget=5000", "--dump-dom", page.as_uri() + hash_).stdout
    m = re.search(r'<div id="npas-selfcheck"([^>]*)>', dom)
    assert m, f"no self-check element in the dumped DOM: {dom[:300]!r}"
    return {k: html.unescape(v) for k, v in re.findall(r'data-([\w-]+)="([^"]*)"', m.group(1))}


@pytest.fixture(scope="module")
def smoke_page(smoke, tmp_path_factory) -> Path:
    t0 = time.perf_counter()
    page = write_report(smoke[0], tmp_path_factory.mktemp("report"))
    took = time.perf_counter() - t0
    assert took < 15, f"write_report took {took:.1f}s; it runs after every trial"
    return page


def test_report_is_one_self_contained_file(smoke_page):
    text = smoke_page.read_text(encoding="utf-8")
    assert "http://" not in text and "https://" not in text  # offline: no CDN, no remote fonts
    assert text.count('src="data:image/png;base64,') >= 5 and "<img src=\"" not in text.replace(
        '<img src="data:', "")
    assert 'id="trials-table"' in text and [p.name for p in smoke_page.parent.iterdir()] == ["index.html"]


@pytest.mark.slow  # a real browser or server process
@needs_chromium
def test_report_loads_in_chromium_with_every_image_and_sorts(smoke, smoke_page, tmp_path):
    st, page = smoke[0], smoke_page
    check = selfcheck(tmp_path, page, "#selfcheck-sort")
    assert check.get("done") == "1"
    assert json.loads(check["errors"]) == []
    assert int(check["images"]) >= 5 and check["images-ok"] == check["images"]
    by_loss = sorted((t for t in st.trials if t.values), key=lambda t: t.values[0])
    assert check["sorted"].split(",")[:len(by_loss)] == [str(t.number) for t in by_loss]
    shot = tmp_path / "dashboard.png"
    chromium(tmp_path, f"--screenshot={shot}", "--window-size=1400,3000", page.as_uri())
    assert shot.stat().st_size > 10_000 and int.from_bytes(shot.read_bytes()[16:20], "big") == 1400
    print(f"dashboard screenshot: {shot}")


@pytest.mark.slow  # a real browser or server process
@needs_chromium
@pytest.mark.parametrize("kind", ["empty", "failed-only"])
def test_a_study_with_nothing_complete_still_gets_a_page(kind, tmp_path):
    if kind == "empty":
        st = optuna.create_study(directions=["minimize", "minimize"])
        npas_attrs(st)
    else:
        st = failed_only()
    assert summary_info(st).empty_note
    assert pareto_info(st).points == [] and allocation_info(st).rows == [] and curves_info(st).curves == []
    assert hypervolume_info(st).note and importance_info(st).notes
    page = write_report(st, tmp_path)
    text = page.read_text(encoding="utf-8")
    if kind == "empty":
        assert "This study has no trials yet." in text
    else:
        assert "None of the 3 trial(s) has completed yet" in text and "non-finite validation loss" in text
    check = selfcheck(tmp_path, page)
    assert json.loads(check["errors"]) == [] and check["images"] == "0"


# ---- the command ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def failed_db(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('failed')}/npas.db"
    failed_only(url, name="broken")
    return url


def test_cli_writes_the_report_and_names_unknown_studies(failed_db, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["dashboard", "broken", "--storage", failed_db, "--out", str(out)]) == 0
    assert (out / "index.html").is_file() and str(out / "index.html") in capsys.readouterr().out
    assert main(["dashboard", "nope", "--storage", failed_db, "--out", str(out)]) == 2
    assert "no study 'nope'" in capsys.readouterr().err


def test_live_without_the_extra_says_how_to_install_it(failed_db, tmp_path, monkeypatch):
    from npas.presentation.cli import dashboard

    monkeypatch.setitem(sys.modules, "optuna_dashboard", None)  # import fails as if not installed
    with pytest.raises(NpasError, match=r"pip install 'npas\[dashboard\]'"):
        dashboard._server()


@pytest.mark.slow  # a real browser or server process
def test_live_serves_optuna_dashboard_on_the_same_storage(failed_db, tmp_path):
    pytest.importorskip("optuna_dashboard")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "npas", "dashboard", "broken", "--storage", failed_db,
                             "--out", str(tmp_path / "out"), "--live", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline, body = time.monotonic() + 20, None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=2) as r:
                    if r.status == 200:
                        body = r.read().decode()
                        break
            except OSError:
                time.sleep(0.3)
        assert body is not None, f"optuna-dashboard did not answer within 20 s (exit {proc.poll()})"
        assert "broken" in body
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:  # redirects to the SPA
            assert r.status == 200 and "<html" in r.read().decode().lower()
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    assert f"http://127.0.0.1:{port}" in out



def test_allocation_map_shows_how_many_tokens_run_each_layer_of_a_recursion():
    from npas.allocation.config import Chassis
    from npas.allocation.recursion import RecursionSpec
    from npas.allocation.recursion_allocation import recursion_config
    from npas.presentation.dashboard.allocations import AllocationInfo, allocation_row
    from npas.presentation.dashboard.render import render_allocation
    from npas.service.study.record import TrialAttr

    ch = Chassis(vocab_size=68, context=32, d_model=32, n_layers=6, n_heads=4, d_ff=64)
    cfg = recursion_config(ch, RecursionSpec(steps=2, stack=2, first=1, last=1, capacities=(1.0, 0.5)))
    cells, text = _map_text(cfg)  # no realised depth stored: the capacities
    assert [c.depth_share for c in cells] == [1.0, 1.0, 1.0, 0.5, 0.5, 1.0]
    assert text[3].splitlines()[-1] == "runs 50% of tokens"
    proxy = {"recursion": {"step_share": [1.0, 0.25]}}  # what the causal rule realised on the validation windows
    t = create_trial(values=[1.0, 2.0], user_attrs={TrialAttr.ALLOC: cfg.to_dict(), TrialAttr.PROXY: proxy,
                                                    TrialAttr.ACCOUNTING: count(cfg).to_dict()})
    row = allocation_row(t)
    assert [c.depth_share for c in row.cells] == [1.0, 1.0, 1.0, 0.25, 0.25, 1.0]
    render_allocation(AllocationInfo(6, [row]))
    assert all(c.depth_share is None for c in _map_text(reference_config(ch))[0])
