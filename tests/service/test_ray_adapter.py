"""The private Ray APIs npas relies on, each checked against the installed Ray.

A Ray release that moves one of them fails here, naming the accessor, instead of failing a cluster
search in the field. The installed version must lie in the range pyproject.toml declares. Token
state is per process in Ray (its config and token loader are read once), so the token checks run
in a fresh interpreter each, with a HOME of their own: the machine's ~/.ray is never read.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
import tomllib

import pytest
import ray

from npas.service.execution import ray_adapter as adapter
from tests.conftest import ROOT


def test_installed_ray_is_in_the_declared_range():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(d for d in deps if d.startswith("ray"))
    m = re.fullmatch(r"ray\[tune\]>=(\d+)\.(\d+),<(\d+)(?:\.(\d+))?", spec)
    assert m, f"{spec!r}: declare the Ray range as ray[tune]>=A.B,<C"
    lo, hi = (int(m[1]), int(m[2])), (int(m[3]), int(m[4] or 0))
    assert (lo, hi) == adapter.SUPPORTED_RAY, "update ray_adapter.SUPPORTED_RAY with pyproject.toml"
    assert lo <= adapter.version() < hi, f"ray {ray.__version__} is outside {spec}: re-check npas.service.execution.ray_adapter"


TOKEN_STATE = """
import json, os
from npas.service.execution import ray_adapter as a
from npas.service.execution.session import authenticate_like_a_node
before = [a.token_available(), a.token_auth_enabled()]
sends = authenticate_like_a_node()
print(json.dumps(before + [sends, a.token_auth_enabled(), os.environ.get("RAY_AUTH_MODE")]))
"""


def token_state(tmp_path, token: bool) -> list:
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    if token:
        (home / ".ray" / "auth_token").write_text("0123456789abcdef0123456789abcdef")
    env = {k: v for k, v in os.environ.items()
           if k not in {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"}}
    out = subprocess.run([sys.executable, "-c", TOKEN_STATE], env={**env, "HOME": str(home)}, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_token_on_the_machine_turns_token_auth_on(tmp_path):
    """AuthenticationTokenLoader finds ~/.ray/auth_token; Config.initialize makes the mode take."""
    available, enabled, sends, enabled_after, mode = token_state(tmp_path, token=True)
    assert available, "AuthenticationTokenLoader.has_token(ignore_auth_mode=True) no longer finds ~/.ray/auth_token"
    assert not enabled, "token auth was on before RAY_AUTH_MODE was set: get_authentication_mode moved"
    assert sends and mode == "token"
    assert enabled_after, "RAY_AUTH_MODE=token + Config.initialize('') no longer turns token auth on"


def test_no_token_leaves_auth_off(tmp_path):
    assert token_state(tmp_path, token=False) == [False, False, False, False, None]


@pytest.mark.parametrize("mode, sends", [("disabled", False), ("token", True), ("TOKEN", True)])
def test_a_set_auth_mode_is_the_users_word(monkeypatch, mode, sends):
    from npas.service.execution.session import authenticate_like_a_node

    monkeypatch.setenv("RAY_AUTH_MODE", mode)
    assert authenticate_like_a_node() is sends
    assert os.environ["RAY_AUTH_MODE"] == mode


def test_probe_gcs_fails_fast_where_no_head_answers():
    from ray.exceptions import AuthenticationError

    from tests.service.test_faults import free_port

    t0 = time.time()
    with pytest.raises(Exception) as err:
        adapter.probe_gcs(f"127.0.0.1:{free_port()}", 500)
    assert not isinstance(err.value, AuthenticationError)
    # a hang guard, generous for a loaded machine (11 s seen at load 17 on 2 cores for this 0.5 s deadline)
    assert time.time() - t0 < 60, "InnerGcsClient.standalone no longer honours its timeout"


def test_cluster_record_follows_rays_temp_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    assert adapter.cluster_record() == tmp_path / "ray" / "ray_current_cluster", "get_ray_address_file moved"


@pytest.mark.parametrize("name", [adapter.AUTH_NOTICE_LOGGER, adapter.WORKER_LOGGER])
def test_quieted_loggers_name_rays_modules(name):
    assert importlib.util.find_spec(name) is not None, f"{name} moved: npas no longer quiets its notice"


def test_no_private_ray_outside_the_adapter():
    """Every private Ray call goes through the adapter, so the checks above cover them all."""
    private = re.compile(r"\bray\._(?!adapter)\w+|from ray\._\w+|import ray\._\w+")
    found = [f"{path.relative_to(ROOT)}:{n}" for path in sorted((ROOT / "npas").rglob("*.py"))
             if path.name != "ray_adapter.py"
             for n, line in enumerate(path.read_text().splitlines(), 1) if private.search(line)]
    assert not found, f"private Ray APIs outside npas/service/execution/ray_adapter.py: {found}"
