"""`npas search --repeats R`: each trial trains its allocation on R seeds, ranks by their mean and
stores the per-seed losses; `front` shows mean ± std, `export` says whether its pick is beyond the
seed noise. One real search (real Ray, real SQLite, the fast recipe) plus hand-built studies whose
per-seed losses each test sets."""

from __future__ import annotations

import statistics
import uuid

import optuna
import pytest

import npas
from npas.allocation.budget import count
from npas.allocation.config import ArchConfig, reference_config
from npas.errors import StudyError
from npas.presentation.cli import main
from npas.service.execution.outcome import combine_repeats, repeat_seeds
from npas.service.search.driver import resume, search
from npas.service.search.launch import Launch
from npas.service.study.record import Constraint, StudyAttr, TrialAttr
from npas.service.study.studies import read_record
from npas.training.data import load_corpus
from npas.training.forks import run_proxy
from npas.training.recipe import Recipe, load_recipe
from tests.conftest import ROOT, record_launches

TINY = ROOT / "tests" / "data" / "tiny.yaml"
FAST = str(ROOT / "tests" / "data" / "fast.yaml")


def cli(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse refuses a malformed --repeats while parsing
        return int(e.code)


@pytest.fixture(scope="module")
def repeated(ray_local, tmp_path_factory):
    """A real search with --repeats 2: the two baselines the tiny space enqueues first, to full fidelity."""
    url = f"sqlite:///{tmp_path_factory.mktemp('rep')}/r.db"
    st = search(npas.load_space(TINY), trials=2, study="rep", storage=url, recipe=FAST, repeats=2,
                launch=Launch(workers=2, early_stop=False))
    return st, url


def test_each_trial_stores_its_seeds_losses_and_ranks_by_their_mean(repeated):
    st, _ = repeated
    assert read_record(st).repeats == 2 and st.user_attrs[StudyAttr.REPEATS] == 2
    done = [t for t in st.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 2
    recipe_seed = load_recipe(FAST).seed
    for t in done:
        losses = t.user_attrs[TrialAttr.SEED_LOSSES]
        assert t.user_attrs[TrialAttr.SEEDS] == list(repeat_seeds(recipe_seed, 2)) == [recipe_seed, recipe_seed + 2]
        assert len(losses) == 2 and losses[0] != losses[1]  # two seeds really trained two different runs
        assert t.values[0] == pytest.approx(statistics.fmean(losses), rel=1e-12)  # objective 0 is val_loss
        assert t.user_attrs[TrialAttr.LOSS_STD] == pytest.approx(statistics.stdev(losses))
        assert t.user_attrs[TrialAttr.PROXY]["val_loss"] == pytest.approx(t.values[0])
        assert t.user_attrs[TrialAttr.CURVE][-1][1] == pytest.approx(t.values[0])  # the curve is the mean too


def test_the_per_seed_losses_are_those_seeds_own_runs(repeated):
    """Seed index 0 is the recipe's own seed (what a study without repeats trains) and index 1 a
    different one: retraining here, in this process, on each seed gives the stored losses."""
    st, _ = repeated
    t = next(t for t in st.trials if t.state == optuna.trial.TrialState.COMPLETE)
    rec = Recipe.from_dict(dict(read_record(st).recipe))
    corpus = load_corpus(rec.data, val_fraction=rec.val_fraction, test_fraction=rec.test_fraction)
    cfg = ArchConfig.from_dict(t.user_attrs[TrialAttr.ALLOC])
    reference = npas.load_space(TINY).bind(vocab_size=corpus.vocab_size).reference_chassis
    for seed, stored in zip(t.user_attrs[TrialAttr.SEEDS], t.user_attrs[TrialAttr.SEED_LOSSES], strict=True):
        again = run_proxy(cfg, Recipe.from_dict({**rec.to_dict(), "seed": seed}), corpus, reference=reference)
        assert again.val_loss == pytest.approx(stored, rel=1e-5)


def test_front_shows_mean_plus_minus_std(repeated, capsys):
    st, url = repeated
    assert main(["front", "rep", "--storage", url]) == 0
    out = capsys.readouterr().out
    t = st.best_trials[0]
    assert f"{t.values[0]:.4f} ± {t.user_attrs[TrialAttr.LOSS_STD]:.4f}" in out
    assert "mean ± std over 2 seeds per trial" in out
    assert main(["front", "rep", "--storage", url, "--format", "csv"]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.startswith("trial,val_loss,train_memory_bytes,loss_std,seeds,")
    assert all(row.split(",")[4] == "2" for row in rows)


def test_dashboard_front_carries_each_trials_seed_std_as_error_bars(repeated):
    from npas.presentation.dashboard.info import pareto_info
    from npas.presentation.dashboard.render import render_pareto

    st, _ = repeated
    st = optuna.load_study(study_name="rep", storage=repeated[1])
    info = pareto_info(st)
    by_number = {p.number: p for p in info.points}
    for t in st.trials:
        if t.state == optuna.trial.TrialState.COMPLETE:
            assert by_number[t.number].loss_std == pytest.approx(t.user_attrs[TrialAttr.LOSS_STD])
            assert by_number[t.number].n_seeds == 2
    fig = render_pareto(info)
    ax = fig.axes[0]
    bars = [c for c in ax.containers if type(c).__name__ == "ErrorbarContainer"]
    assert len(bars) == 1
    segments = bars[0].lines[2][0].get_segments()  # one vertical segment per trial: mean ± std
    spans = sorted(round(float(seg[1][1] - seg[0][1]), 6) for seg in segments)
    assert spans == sorted(round(2 * p.loss_std, 6) for p in info.points if p.loss_std is not None)
    assert any("± std over each trial's 2 seeds" in t.get_text() for t in ax.get_legend().get_texts())


def test_resume_and_joiners_keep_the_stored_repeats(repeated, monkeypatch, capsys):
    st, url = repeated
    seen = record_launches(monkeypatch)
    resume("rep", storage=url, launch=Launch(workers=1))
    assert seen["worker"].repeats == 2  # what every trainable receives
    with pytest.raises(StudyError, match=r"trains each trial on 2 seed\(s\) \(--repeats 2\), not 3"):
        resume("rep", storage=url, repeats=3, launch=Launch(workers=1))
    with pytest.raises(StudyError, match=r"--repeats 1 \(the study's is 2\)"):
        search(npas.load_space(TINY), study="rep", storage=url, repeats=1, launch=Launch(workers=1))
    assert cli(["resume", "rep", "--storage", url, "--repeats", "3"]) == 2
    err = capsys.readouterr().err
    assert "not 3" in err and len(err.strip().splitlines()) == 1
    assert optuna.load_study(study_name="rep", storage=url).user_attrs[StudyAttr.REPEATS] == 2


def test_resume_with_a_changed_space_needs_allow_space_change(repeated, tmp_path, monkeypatch, capsys):
    """`npas resume --space F` with another space is refused in one line that names the flag; with
    `--allow-space-change` the resumed trials are sampled from the new space, not the stored one."""
    from npas.service.search import driver

    st, url = repeated
    changed = tmp_path / "changed.yaml"
    changed.write_text(TINY.read_text().replace("ratio: 3.0", "ratio: 2.0"))
    spaces = []

    def run_trials(searcher, **kw):
        spaces.append(searcher.space)
        searcher.finished = True
        return True

    monkeypatch.setattr(driver, "run_trials", run_trials)
    assert cli(["resume", "rep", "--storage", url, "--space", str(changed)]) == 2
    err = capsys.readouterr().err
    assert "space file differs" in err and "--allow-space-change" in err and len(err.strip().splitlines()) == 1
    assert not spaces  # refused before anything ran
    assert cli(["resume", "rep", "--storage", url, "--space", str(TINY)]) == 0  # the same text needs no flag
    assert cli(["resume", "rep", "--storage", url, "--space", str(changed), "--allow-space-change"]) == 0
    stored, new = spaces
    assert "ratio: 2.0" in new.text and "ratio: 3.0" in stored.text
    assert new.hash != stored.hash


@pytest.mark.parametrize("value, fragment", [("0", "0 is out of range"), ("two", "'two' is not a whole number"),
                                             ("1.5", "'1.5' is not a whole number"), ("65", "65 is out of range")])
def test_bad_repeats_is_one_line_exit_2_and_writes_nothing(value, fragment, tmp_path, capsys):
    db = tmp_path / "x.db"
    assert cli(["search", str(TINY), "--repeats", value, "--storage", f"sqlite:///{db}"]) == 2
    err = capsys.readouterr().err
    assert fragment in err and "--repeats" in err and len(err.strip().splitlines()) == 1
    assert not db.exists()
    with pytest.raises(StudyError, match="--repeats must be a whole number from 1 to 64"):
        search(npas.load_space(TINY), repeats=0, storage=f"sqlite:///{db}")
    assert not db.exists()


# ---- hand-built studies: the per-seed losses are set, so the noise verdict is known -------------
def noisy_study(tmp_path, points: list[tuple[list[float], float]]) -> tuple[str, str]:
    """One complete front trial per (per-seed losses, memory); an empty list means a one-seed trial
    recorded without per-seed losses (value 3.0 + index / 100)."""
    url = f"sqlite:///{tmp_path}/noise.db"
    name = f"noise-{uuid.uuid4().hex[:6]}"
    space = npas.load_space(TINY)
    cfg = reference_config(space.reference_chassis)
    acc = count(cfg)
    study = optuna.create_study(study_name=name, storage=url, directions=["minimize", "minimize"])
    study.set_metric_names(["val_loss", "train_memory_bytes"])
    for k, v in {StudyAttr.SPACE_TEXT: space.text, StudyAttr.OBJECTIVES: ["val_loss", "train_memory_bytes"],
                 StudyAttr.RECIPE: {"name": "fast"}, StudyAttr.FINGERPRINT: "f"}.items():
        study.set_user_attr(k, v)
    for i, (losses, memory) in enumerate(points):
        attrs = {TrialAttr.ALLOC: cfg.to_dict(), TrialAttr.HASH: cfg.hash, TrialAttr.ACCOUNTING: acc.to_dict(),
                 TrialAttr.STATUS: "ok"}
        if losses:
            attrs.update({TrialAttr.SEEDS: list(repeat_seeds(0, len(losses))), TrialAttr.SEED_LOSSES: losses})
        study.add_trial(optuna.trial.create_trial(
            values=[statistics.fmean(losses) if losses else 3.0 + i / 100, memory], user_attrs=attrs,
            constraints={Constraint.BUDGET: -1.0, Constraint.FIDELITY: 0.0}))
    return url, name


def export_lines(url: str, name: str, how: str, out, capsys) -> list[str]:
    assert cli(["export", name, "--storage", url, "--pick", how, "--out", str(out)]) == 0
    return capsys.readouterr().out.strip().splitlines()


def test_min_loss_inside_the_noise_still_picks_but_says_unresolved(tmp_path, capsys):
    # trial 0 is lower on average by 0.01, but its per-seed differences to trial 1 swing by ±0.05
    url, name = noisy_study(tmp_path, [([3.00, 3.10, 3.02], 3e8), ([3.05, 3.04, 3.06], 2e8), ([3.5, 3.6, 3.4], 1e8)])
    lines = export_lines(url, name, "min-loss", tmp_path / "b.yaml", capsys)
    assert lines[0].startswith("wrote") and "trial 0" in lines[0]  # still picked: the lowest mean
    assert len(lines) == 2 and lines[1].startswith("unresolved: trial 0's val_loss is 0.0100 below trial 1's")
    assert "inside 2 paired std" in lines[1] and "over 3 seeds" in lines[1] and "--pick trial=1" in lines[1]
    # max-memory chooses by loss too: under 2.5e8 only trials 1 and 2 compete, and 1 beats 2 clearly
    lines = export_lines(url, name, "max-memory=2.5e8", tmp_path / "c.yaml", capsys)
    assert "trial 1" in lines[0] and lines[1].startswith("resolved: trial 1's val_loss is 0.4500 below trial 2's")


def test_pairing_over_seeds_resolves_what_unpaired_noise_would_hide(tmp_path, capsys):
    """Each seed moves both trials alike (its batches are the same); trial 0 is 0.05 lower on every
    seed, although each trial's own spread over seeds is 0.25."""
    url, name = noisy_study(tmp_path, [([3.00, 3.50, 3.20], 3e8), ([3.05, 3.56, 3.24], 2e8)])
    lines = export_lines(url, name, "min-loss", tmp_path / "b.yaml", capsys)
    assert lines[1].startswith("resolved: trial 0's val_loss is 0.0500 below trial 1's")
    assert "beyond 2 paired std (2 × 0.0100 over 3 seeds)" in lines[1]


def test_one_seed_per_trial_says_the_noise_is_unknown(tmp_path, capsys):
    url, name = noisy_study(tmp_path, [([], 3e8), ([], 2e8), ([], 1e8)])
    lines = export_lines(url, name, "min-loss", tmp_path / "b.yaml", capsys)
    assert lines[1].startswith("unresolved: trial 0's val_loss is 0.0100 below trial 1's")
    assert "one seed, so its seed noise is unknown" in lines[1] and "--repeats 2" in lines[1]
    lines = export_lines(url, name, "knee", tmp_path / "k.yaml", capsys)
    assert lines[1].startswith("noise unknown: trial 1's val_loss")  # knee trades off; it only reports
    lines = export_lines(url, name, "trial=2", tmp_path / "t.yaml", capsys)
    assert lines[1] == "noise: trial 2 has the highest val_loss among the front; no point ranks after it to compare with"
    assert main(["front", name, "--storage", url]) == 0
    out = capsys.readouterr().out
    assert "3.0000 ± —" in out and "one seed per trial" in out


def test_combined_record_takes_the_mean_loss_and_the_largest_memory():
    def run(loss: float, peak: int, steps: int, curve) -> dict:
        return {"status": "ok", "val_loss": loss, "val_bpc": None, "train_loss": loss + 0.1, "steps_done": steps,
                "peak_memory_bytes": peak, "rss_delta_bytes": 0, "tokens_per_s": 100.0, "wall_s": 1.5,
                "curve": curve}

    out = combine_repeats([run(3.0, 100, 40, [[20, 3.4], [40, 3.0]]), run(3.2, 120, 40, [[20, 3.6], [40, 3.2]])],
                          (0, 2))
    assert out["val_loss"] == pytest.approx(3.1) and out["train_loss"] == pytest.approx(3.2)
    assert out["peak_memory_bytes"] == 120 and out["wall_s"] == pytest.approx(3.0)
    assert out["curve"] == [[20, pytest.approx(3.5)], [40, pytest.approx(3.1)]]
    assert out["seeds"] == [0, 2] and out["seed_losses"] == [3.0, 3.2]


def test_validate_never_retrains_on_a_seed_the_search_trained(tmp_path):
    """With repeats the proxy trained several seeds; `npas validate`'s fresh seeds avoid all of them."""
    from npas.service.certify.targets import SEED_BASE, Options, make_plan
    from tests.service.test_validate import synthetic_study

    name, _ = synthetic_study(f"sqlite:///{tmp_path}/v.db", n=6)
    st = optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path}/v.db")
    st.set_user_attr(StudyAttr.RECIPE, {**st.user_attrs[StudyAttr.RECIPE], "seed": SEED_BASE - 2})
    st.set_user_attr(StudyAttr.REPEATS, 2)  # proxy seeds SEED_BASE - 2 and SEED_BASE
    plan = make_plan(st, Options(seeds=2, top=1, sample=0), load_recipe(FAST))
    assert SEED_BASE not in plan.seeds and len(set(plan.seeds)) == 2
