"""Every use of a private Ray API in npas, in one place.

npas checks a cluster before it writes anything (`npas.service.execution.session.check_address_reachable`):
one bounded request to the head, with the token authentication a node of that cluster would use.
Ray's public surface has no call that makes one request with a deadline (`ray.init` retries a
refused token for ~20 s, then reports only "Failed to connect"), none that says whether a token is
on this machine, none that turns token authentication on for a process that has already imported
Ray, and none that names the directory where `ray start` records the head it started. So these are
read here and nowhere else, from `ray._raylet` (Ray's compiled core) and `ray._common.utils`.
`tests/service/test_ray_adapter.py` pins each to the installed Ray and the Ray range in
pyproject.toml: a Ray upgrade that moves one fails that test, naming the accessor, not a search in
the field. Logger names npas quiets are here too: a rename only lets a notice through, so they are
checked but not load-bearing.
"""

from __future__ import annotations

import os
from pathlib import Path

# [lo, hi) as (major, minor): the range pyproject.toml allows ("ray[tune]>=2.59,<3"). Token
# authentication on by default for local clusters, which npas relies on, arrived in Ray 2.59.
SUPPORTED_RAY = ((2, 59), (3, 0))

AUTH_MODE_ENV = "RAY_AUTH_MODE"  # Ray's own switch, read by every Ray process: "token" or "disabled"
# "Token authentication is enabled ...": Ray's notice when it turns auth on by itself
AUTH_NOTICE_LOGGER = "ray._private.authentication.authentication_token_setup"
WORKER_LOGGER = "ray._private.worker"  # "SIGTERM handler is not set ...": npas sets its own


def version() -> tuple[int, int]:
    import ray

    major, minor = ray.__version__.split(".")[:2]
    return int(major), int(minor)


def token_available() -> bool:
    """Whether this machine holds a Ray token where Ray looks for one ($RAY_AUTH_TOKEN,
    $RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token), whatever RAY_AUTH_MODE says. Ray's own loader answers,
    so npas never disagrees with Ray about where tokens live."""
    from ray._raylet import AuthenticationTokenLoader

    return bool(AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True))


def token_auth_enabled() -> bool:
    """Whether this process's Ray sends the token (the mode Ray's config holds now)."""
    from ray._raylet import AuthenticationMode, get_authentication_mode

    return get_authentication_mode() == AuthenticationMode.TOKEN


def enable_token_auth() -> None:
    """Token authentication for this process and what it spawns, as `RAY_AUTH_MODE=token` would have
    given it at start-up. Ray reads its config once per process, so the cached config is re-read
    (what Ray itself does when `ray.init` or `ray start --head` turn auth on)."""
    from ray._raylet import Config

    os.environ[AUTH_MODE_ENV] = "token"
    Config.initialize("")


def probe_gcs(hostport: str, timeout_ms: int) -> None:
    """One request to the GCS at host:port for its cluster id, within `timeout_ms`, with this
    process's auth. Raises `ray.exceptions.AuthenticationError` when the head refuses the token,
    another exception when nothing answers as a Ray head. `InnerGcsClient.standalone` is the client
    `ray.init` builds first."""
    from ray._raylet import InnerGcsClient

    InnerGcsClient.standalone(hostport, None, timeout_ms)


def cluster_record() -> Path:
    """The file where `ray start` records the head it started or joined, under Ray's default temp dir
    ($RAY_TMPDIR, else $TMPDIR, else /tmp, then `ray/`): what `ray.init(address="auto")` reads."""
    from ray._common.utils import get_ray_address_file

    return Path(get_ray_address_file(None))
