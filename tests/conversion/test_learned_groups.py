"""Learned sharing groups (`tying.mode: learned`, `pools.rule: learned`): clustering, the budget fit,
and real searches that learn the similarity from --init-from or from one pretraining of the reference."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import optuna
import pytest
import torch

import npas
from npas.allocation.budget import count, stored_params
from npas.allocation.config import reference_config
from npas.allocation.layer_maps import groups_from_similarity
from npas.allocation.space_parser import parse_space
from npas.errors import SpaceError, StudyError
from npas.service.study.record import StudyAttr, StudyRecord, TrialAttr
from tests.conftest import ROOT

FAST = str(ROOT / "tests" / "data" / "fast.yaml")
PLANT = (0, 1, 2, 0, 3, 1, 2, 0)  # four groups of layers, none of them contiguous
L = len(PLANT)


def planted(plant: tuple[int, ...] = PLANT, seed: int = 0) -> list[list[float]]:
    """A noisy similarity in which layers of one planted group are alike and others are not."""
    rng = random.Random(seed)
    n = len(plant)
    sim = [[1.0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            sim[i][j] = sim[j][i] = (0.8 if plant[i] == plant[j] else 0.2) + rng.uniform(-0.1, 0.1)
    return sim


def space_text(knobs: str, n_layers: int | str = L, d_model: int = 32) -> str:
    return (f"name: learned\nchassis: {{vocab_size: 68, context: 64, d_model: {d_model}, n_layers: {n_layers}, "
            f"n_heads: 4, d_ff: 96, activation: gelu}}\nbudget: 0.5x\nobjectives: [val_loss, train_memory_bytes]\n"
            f"recipe: smoke\nknobs:\n{knobs}")


def chassis_values(space) -> dict:
    return {k: kn.default for k, kn in space.chassis.items()}


def check_budget_exact(space, cand) -> None:
    """The same exactness every fit test asks: count == the fit's number, and within one step of the budget."""
    acc = count(cand.config)
    assert acc.stored_params == stored_params(cand.config) == cand.fit.stored <= space.budget_params
    if not cand.fit.capped:
        assert space.budget_params - acc.stored_params < max(cand.fit.step, 1)


# ---- clustering -----------------------------------------------------------------------------
def test_groups_from_similarity_recovers_planted_non_contiguous_groups():
    for seed in range(5):
        assert groups_from_similarity(planted(seed=seed), 4) == PLANT
    sim = planted()
    for n in range(1, L + 1):  # the knob is the group count: exactly n groups, each a union of finer ones
        groups = groups_from_similarity(sim, n)
        assert len(set(groups)) == n
        if n >= 4:
            assert all(groups[i] != groups[j] for i in range(L) for j in range(L) if PLANT[i] != PLANT[j])
    # tied heights (every cross-group pair equally far) still give exactly the asked count
    flat = [[1.0 if i == j else 0.9 if PLANT[i] == PLANT[j] else 0.1 for j in range(L)] for i in range(L)]
    assert [len(set(groups_from_similarity(flat, n))) for n in range(1, L + 1)] == list(range(1, L + 1))
    with pytest.raises(ValueError, match="1 <= groups <= 8"):
        groups_from_similarity(sim, 9)


def test_learned_groups_of_a_model_go_through_the_same_clustering():
    from npas.conversion.groups import layer_similarity, learned_groups

    torch.manual_seed(0)
    model = npas.build_model(reference_config(npas.Chassis(vocab_size=68, context=16, d_model=16, n_layers=5,
                                                          n_heads=2, d_ff=32)))
    sim = layer_similarity(model).tolist()
    assert learned_groups(model, 3) == groups_from_similarity(sim, 3)


# ---- the space: tying and banks from a similarity -------------------------------------------
def test_learned_tying_follows_the_clusters_and_fills_the_budget():
    space = parse_space(space_text("  tying: {mode: learned, unique_blocks: {low: 2, high: 8}}\n"
                                   "  relaxation: {rank: [0, 4]}\n")).with_similarity(planted())
    cand = space.candidate({**chassis_values(space), "tying": "learned", "unique_blocks": 4})
    assert cand.config.block_of_layer == PLANT
    check_budget_exact(space, cand)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    for _ in range(12):
        cand = space.sample(study.ask())
        U = cand.values["unique_blocks"]
        assert cand.config.block_of_layer == groups_from_similarity(planted(), U)
        check_budget_exact(space, cand)


def test_learned_banks_hold_the_blocks_of_one_cluster():
    space = parse_space(space_text("  tying: {mode: [none, learned], unique_blocks: 6}\n"
                                   "  pools: {enabled: true, rule: learned, banks: 4, "
                                   "generator: [slice, template_mix]}\n")).with_similarity(planted())
    for tying in ("none", "learned"):
        for generator in ("slice", "template_mix"):
            cand = space.candidate({**chassis_values(space), "tying": tying, "unique_blocks": 6, "pools": True,
                                    "bank_rule": "learned", "n_banks": 4, "generator": generator})
            cfg = cand.config
            layers_of = {b: [i for i in range(L) if cfg.block_of_layer[i] == b] for b in range(cfg.n_blocks)}
            slots = {m[1] for bank in cfg.banks for m in bank.members}
            assert len(cfg.banks) == 4 * len(slots)  # four banks per slot type
            for bank in cfg.banks:
                assert len({m[1] for m in bank.members}) == 1  # by type, like by_type
                assert len({PLANT[i] for b, _ in bank.members for i in layers_of[b]}) == 1, bank.members
            check_budget_exact(space, cand)
    untied = space.candidate({**chassis_values(space), "tying": "none", "pools": True, "bank_rule": "learned",
                              "n_banks": 4, "generator": "slice"}).config
    assert [b for b, _ in untied.banks[0].members] == [0, 3, 7]  # non-contiguous: layers of planted group 0


def test_learned_modes_without_a_similarity_say_where_it_comes_from():
    space = parse_space(space_text("  tying: {mode: learned, unique_blocks: 3}\n"
                                   "  pools: {enabled: [false, true], rule: learned, banks: 2}\n"))
    assert space.learns_groups and not parse_space(space_text("  tying: {mode: cycle}\n")).learns_groups
    for values in ({"tying": "learned", "unique_blocks": 3, "pools": False},
                   {"tying": "none", "pools": True, "bank_rule": "learned", "n_banks": 2}):
        cand = space.candidate({**chassis_values(space), **values})
        assert not cand.feasible and "--init-from" in cand.reason and "npas search" in cand.reason
    with pytest.raises(SpaceError, match="not 8 x 8"):
        space.with_similarity(planted()[:4])
    with pytest.raises(SpaceError, match="knobs.tying.mode: learned groups .* one value"):
        parse_space(space_text("  tying: {mode: [none, learned]}\n", n_layers="[4, 8]"))


def test_count_of_a_learned_space_counts_its_reference_and_baselines(tmp_path, capsys):
    """`npas count` needs no similarity: the reference and the hand-made baselines learn nothing."""
    from npas.presentation.cli import main

    path = tmp_path / "learned.yaml"
    path.write_text(space_text("  tying: {mode: learned, unique_blocks: 3}\n"), encoding="utf-8")
    assert main(["count", str(path)]) == 0
    out = capsys.readouterr().out
    assert "baseline full_tying" in out and "infeasible" not in out


def test_the_record_round_trips_learned_and_old_records_load():
    from tests.service.test_record import RECORD

    learned = {"origin": "pretrained", "dir": "/x", "weights": "abc", "similarity": planted()}
    rec = StudyRecord.from_attrs(dataclasses.replace(RECORD, learned=learned).to_attrs())
    assert rec.learned == learned and rec.to_attrs()[StudyAttr.LEARNED]["similarity"][1][2] == planted()[1][2]
    old = {k: v for k, v in RECORD.to_attrs().items() if k != StudyAttr.LEARNED}
    assert StudyRecord.from_attrs(old).learned is None


# ---- real searches: the similarity from --init-from, or from one pretraining ----------------
TINY_LEARNED = space_text("  tying: {mode: learned, unique_blocks: [2, 3]}\n", n_layers=4)


def _trained(out: Path, steps: int = 30) -> Path:
    from npas.training.data import load_corpus
    from npas.training.recipe import load_recipe
    from npas.training.train import train_allocation

    recipe = load_recipe("smoke").with_steps(steps)
    corpus = load_corpus(None, recipe.val_fraction, recipe.test_fraction)
    space = parse_space(TINY_LEARNED)
    assert train_allocation(reference_config(space.reference_chassis), recipe, corpus, out).status == "ok"
    return out


def _learned_trials(study) -> list:
    return [t for t in study.trials if (t.user_attrs.get(TrialAttr.KNOBS) or {}).get("tying") == "learned"
            and t.user_attrs.get(TrialAttr.ALLOC)]


@pytest.mark.slow  # a pretraining and real searches on Ray
def test_search_with_init_from_records_the_similarity_and_trials_follow_it(ray_local, tmp_path):
    from npas.conversion.directory import fingerprint_weights
    from npas.conversion.groups import similarity_of
    from npas.service.search.driver import search
    from npas.service.search.launch import Launch

    dense = _trained(tmp_path / "dense")
    url = f"sqlite:///{tmp_path}/npas.db"
    st = search(parse_space(TINY_LEARNED), trials=5, study="warm", storage=url, recipe=FAST, sampler="random",
                init_from=str(dense), launch=Launch(workers=2, early_stop=False))
    learned = st.user_attrs[StudyAttr.LEARNED]
    sim = similarity_of(dense)
    assert learned["origin"] == "init_from" and learned["weights"] == fingerprint_weights(dense)
    assert learned["similarity"] == [list(r) for r in sim]
    assert not (tmp_path / "warm.learned-source").exists()  # nothing pretrained: the model was given
    trials = _learned_trials(st)
    assert trials
    for t in trials:
        U = t.user_attrs[TrialAttr.KNOBS]["unique_blocks"]
        assert tuple(t.user_attrs[TrialAttr.ALLOC]["block_of_layer"]) == groups_from_similarity(sim, U)


@pytest.mark.slow  # a pretraining and real searches on Ray
def test_search_without_a_model_pretrains_once_and_resume_reuses_it(ray_local, tmp_path):
    from npas.conversion.directory import fingerprint_weights
    from npas.conversion.groups import similarity_of
    from npas.service.search.driver import resume, search
    from npas.service.search.launch import Launch

    url = f"sqlite:///{tmp_path}/db/npas.db"
    text = space_text("  pools: {enabled: true, rule: learned, banks: [2, 3], generator: slice}\n", n_layers=4)
    st = search(parse_space(text), trials=4, study="cold", storage=url, recipe=FAST, sampler="random",
                launch=Launch(workers=2, early_stop=False))
    src = tmp_path / "db" / "cold.learned-source"
    learned = st.user_attrs[StudyAttr.LEARNED]
    assert learned["origin"] == "pretrained" and learned["dir"] == str(src.resolve())
    assert learned["weights"] == fingerprint_weights(src)
    sim = similarity_of(src)
    assert learned["similarity"] == [list(r) for r in sim]
    assert st.user_attrs[StudyAttr.INIT_FROM] is None  # the trials themselves train from scratch
    stamp = (src / "model.safetensors").stat().st_mtime_ns
    st = resume("cold", storage=url, trials=5, launch=Launch(workers=2))
    assert (src / "model.safetensors").stat().st_mtime_ns == stamp  # not pretrained again
    pooled = [t for t in st.trials if (t.user_attrs.get(TrialAttr.KNOBS) or {}).get("pools")
              and t.user_attrs.get(TrialAttr.ALLOC)]
    assert len(pooled) >= 2
    from npas.allocation.config import ArchConfig

    for t in pooled:
        cfg = ArchConfig.from_dict(t.user_attrs[TrialAttr.ALLOC])
        k = t.user_attrs[TrialAttr.KNOBS]["n_banks"]
        clusters = groups_from_similarity(sim, k)  # untied: block b is layer b
        for bank in cfg.banks:
            assert len({clusters[b] for b, _ in bank.members}) == 1
    with pytest.raises(StudyError, match="recorded no learned groups"):
        from npas.service.search.learned import attach

        attach(parse_space(text), None, "cold")


def test_a_joiner_waits_past_the_setup_limit_while_the_creator_pretrains(tmp_path, monkeypatch):
    import threading
    import time

    from npas.service.search import driver, learned
    from npas.service.study.storage import open_storage

    url = f"sqlite:///{tmp_path / 'p.db'}"
    study = optuna.create_study(study_name="p", storage=open_storage(url).storage)
    study.set_user_attr(StudyAttr.SPACE_TEXT, "name: p\n")
    monkeypatch.setattr(driver, "SETUP_WAIT_S", 0.2)  # shorter than the "pretraining" below
    monkeypatch.setattr(learned, "PRETRAIN_WAIT_S", 30.0)
    study.set_user_attr(learned.PRETRAINING_ATTR, True)
    threading.Timer(0.8, lambda: study.set_user_attr(StudyAttr.READY, True)).start()
    t0 = time.monotonic()
    driver._await_setup("p", open_storage(url))
    assert time.monotonic() - t0 >= 0.7
    monkeypatch.setattr(learned, "PRETRAIN_WAIT_S", 0.2)  # and it does give up in the end
    optuna.create_study(study_name="q", storage=open_storage(url).storage).set_user_attr(learned.PRETRAINING_ATTR, 1)
    with pytest.raises(StudyError, match="never fully set up"):
        driver._await_setup("q", open_storage(url))


def test_a_failed_pretraining_leaves_no_study_behind(tmp_path, monkeypatch):
    """The creator deletes the study it claimed when the pretraining fails, so the name is free again,
    and the diverged pretraining's directory with it: nothing is left beside the database."""
    from npas.service.search import learned
    from npas.service.search.plan import SearchPlan
    from npas.service.study.storage import open_storage
    from npas.training.data import load_corpus
    from npas.training.recipe import Recipe, load_recipe

    url = f"sqlite:///{tmp_path / 'f.db'}"
    handle = open_storage(url)
    study = optuna.create_study(study_name="f", storage=handle.storage)
    space = parse_space(TINY_LEARNED).bind(vocab_size=68)
    diverges = Recipe.from_dict({**load_recipe(FAST).to_dict(), "lr": 1e6, "min_lr": 1e5, "steps": 20})
    corpus = load_corpus(None, diverges.val_fraction, diverges.test_fraction)
    with pytest.raises(StudyError, match="pretraining the reference for learned groups failed.*--init-from"):
        learned.learn_for_study(study, handle, SearchPlan(space=space, recipe=diverges, corpus=corpus, study_name="f"))
    assert "f" not in [s.study_name for s in handle.storage.get_all_studies()]
    assert not (tmp_path / "f.learned-source").exists()  # not even the diverged run's metrics.json
    assert not [p.name for p in tmp_path.iterdir() if not p.name.startswith("f.db")]
