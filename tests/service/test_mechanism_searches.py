"""A real search on each second-round mechanism's shipped space (atoms, expert pool, KV sharing):
trials train on Ray and land in SQLite, the mechanism's hand-crafted baseline is enqueued beside the
space's own, and the exported pick rebuilds the exact module the trial counted."""

from __future__ import annotations

import pytest

import npas
from npas.allocation.config import ArchConfig
from npas.service.export.exporter import write_export
from npas.service.export.picks import pick
from npas.service.search.driver import search
from npas.service.search.launch import Launch
from npas.service.study.record import TrialAttr
from tests.conftest import ROOT
from tests.service.test_search import FAST

# space -> the baseline a space using the mechanism enqueues, and the mechanism's mark on an allocation
MECHANISMS = {
    "atoms": ("cycle_tying", lambda cfg: bool(cfg.atoms)),
    "expert_pool": ("per_layer_moe", lambda cfg: cfg.experts is not None),
    "kv_sharing": ("narrow_untied", lambda cfg: any(cfg.kv_consumer(i) for i in range(cfg.chassis.n_layers))),
    "recursion": ("fixed_depth_recursion", lambda cfg: cfg.recursion is not None),
}


@pytest.mark.slow  # three real searches on the six-layer mechanism spaces
@pytest.mark.parametrize("name", list(MECHANISMS))
def test_search_on_the_mechanism_space_runs_and_its_pick_rebuilds_exactly(name, ray_local, tmp_path):
    baseline, uses = MECHANISMS[name]
    space = npas.load_space(ROOT / "search_spaces" / f"{name}.yaml")
    st = search(space, trials=len(space.baselines()) + 3, study=name, storage=f"sqlite:///{tmp_path}/npas.db",
                recipe=FAST, seed=3, launch=Launch(workers=2, early_stop=False))
    done = [t for t in st.trials if t.values]
    assert len(done) >= len(space.baselines())
    assert baseline in {t.user_attrs.get(TrialAttr.BASELINE) for t in done}
    sampled = [ArchConfig.from_dict(t.user_attrs[TrialAttr.ALLOC]) for t in done
               if not t.user_attrs.get(TrialAttr.BASELINE)]
    assert any(uses(cfg) for cfg in sampled), f"no sampled {name} allocation used the mechanism"
    out = tmp_path / "pick.yaml"
    write_export(st, out, "min-loss")
    again = ArchConfig.from_yaml(out.read_text())
    trial = pick(st, "min-loss")
    assert again.hash == trial.user_attrs[TrialAttr.HASH]
    assert npas.build_model(again).num_params() == trial.user_attrs[TrialAttr.ACCOUNTING]["stored_params"]
