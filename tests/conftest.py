"""Shared fixtures. Tests run against the real libraries: torch, optuna, the shipped spaces."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from npas.allocation.config import ArchConfig
    from npas.errors import SpaceError

ROOT = Path(__file__).resolve().parents[1]
SPACES = sorted((ROOT / "search_spaces").glob("*.yaml"))

# torch's intra-op threads: two for a single process on 2 cores, one per pytest-xdist worker (two workers
# of two spinning OpenMP threads each would oversubscribe the cores)
os.environ.setdefault("OMP_NUM_THREADS", "1" if os.environ.get("PYTEST_XDIST_WORKER") else "2")
# A contributor's own cluster (`ray start --head`, or RAY_ADDRESS exported for it) must never be joined by
# accident: every Ray a test wants is started here with address="local". Tests that join a cluster on
# purpose (tests/service/test_faults.py) pass RAY_ADDRESS to their subprocesses explicitly.
os.environ.pop("RAY_ADDRESS", None)


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: absent without the plugin
def pytest_xdist_make_scheduler(config, log):
    """pyproject's `--dist loadgroup`, with a test module as the unit where no xdist_group is marked:
    a module's tests run on one worker, so each module-scoped fixture (a real search, a bench run) runs
    once, not once per worker; tests marked xdist_group(NAME) still go together across modules."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class ModuleOrGroup(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            group = super()._split_scope(nodeid)
            return group if group != nodeid else nodeid.split("::", 1)[0]

    return ModuleOrGroup(config, log)


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist, the tests of an xdist_group first (the Ray-cluster and shared bench-run groups:
    the longest units of work), so no worker starts one of them while the other is about to run out of
    work; pyproject's --no-loadscope-reorder then keeps this order (every worker collects the same)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: item.get_closest_marker("xdist_group") is None)  # stable: else file order


@pytest.fixture(autouse=True)
def _quiet_optuna():
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    yield


@pytest.fixture
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def ray_local():
    """One embedded Ray (2 CPUs) for the whole session: starting Ray costs seconds, and the searches
    that need it only need it up. address="local" starts a private one even when a cluster of the
    contributor's is up on this machine. Reuses a Ray an earlier in-process search left running."""
    import ray

    if ray.is_initialized():
        yield
        return
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


TINY = ROOT / "tests" / "data" / "tiny.yaml"
FAST = str(ROOT / "tests" / "data" / "fast.yaml")


@pytest.fixture(scope="session")
def smoke_study(tmp_path_factory):
    """A finished study of one small real search (tiny space, fast recipe, 6 trials, seed 1; real Ray,
    real SQLite), shared read-only by every test that needs one: (study, storage url). It is rebuilt
    from tests/data/smoke_study.json into a fresh SQLite file rather than searched again (that costs a
    Ray start and ~15 s); tests/service/test_study_fixture.py (slow tier) checks the file still has the
    shape today's search writes. Tests must not add trials to it; one that needs to write makes its own."""
    from tests.study_fixture import load, rebuild

    url = f"sqlite:///{tmp_path_factory.mktemp('smoke')}/npas.db"
    return rebuild(load(), url), url


def needs(available: bool, reason: str) -> pytest.MarkDecorator:
    """Skip a test whose service (PostgreSQL ...) is missing on a developer machine; in CI (CI=true)
    run it anyway, so a service that failed to start fails the run instead of skipping it."""
    return pytest.mark.skipif(not available and os.environ.get("CI") != "true", reason=reason)


# The six-layer chassis of the mechanism tests (KV sharing, atoms, expert pools).
SMALL_CHASSIS = "{vocab_size: 30, context: 16, d_model: 32, n_layers: 6, n_heads: 4, d_ff: 64}"


def small_space(knobs: str, budget: str = "0.5x", composed: bool = False) -> str:
    """Space text over SMALL_CHASSIS with the given knob lines (a block, indented as you like), so a
    test writes only the knobs it is about. composed=True also searches the activation and lets the fit
    widen the MLP up to 8x: the spaces where a mechanism is composed with everything it may meet."""
    chassis = SMALL_CHASSIS[:-1] + ", activation: [gelu, swiglu]}" if composed else SMALL_CHASSIS
    fit = "fit: {width: mlp, max_width_scale: 8.0}\n" if composed else ""
    block = textwrap.indent(textwrap.dedent(knobs).strip("\n"), "  ")
    return f"chassis: {chassis}\nbudget: {budget}\n{fit}knobs:\n{block}\n"


def space_refusal(text: str) -> SpaceError:
    """parse_space(text) must refuse at load; the error comes back for the caller to check its message."""
    from npas.allocation.space_parser import parse_space
    from npas.errors import SpaceError

    with pytest.raises(SpaceError) as info:
        parse_space(text)
    return info.value


def check_export_round_trip(cfg: ArchConfig, tmp_path: Path) -> None:
    """cfg survives YAML and JSON, and a model of it saved and loaded back has the same config and
    computes the same logits: the export is complete for whatever mechanism cfg uses."""
    import torch

    import npas
    from npas.allocation.config import ArchConfig
    from npas.training.data import CharTokenizer
    from npas.training.train import load_trained, save_trained

    assert ArchConfig.from_yaml(cfg.to_yaml()) == cfg
    assert ArchConfig.from_json(cfg.to_json()).hash == cfg.hash
    torch.manual_seed(0)
    model = npas.build_model(cfg)
    save_trained(model, cfg, CharTokenizer.from_text("abcdefghijklmnopqrs\n"), tmp_path)
    loaded, _, back = load_trained(tmp_path)
    assert back == cfg
    x = torch.randint(0, cfg.chassis.vocab_size, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(loaded(x)[0], model(x)[0])


def record_launches(monkeypatch: pytest.MonkeyPatch) -> dict:
    """From now on the driver launches nothing: its run_trials records the keywords it was called with
    into the returned dict and marks the searcher finished. For tests of what search/resume pass on to
    the trials (stored settings a resume must keep) without running any."""
    from npas.service.search import driver

    seen: dict = {}

    def run_trials(searcher, **kw):
        seen.update(kw)
        searcher.finished = True
        return True

    monkeypatch.setattr(driver, "run_trials", run_trials)
    return seen
