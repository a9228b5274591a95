"""--checkpoint-storage: trials' checkpoints on a path or storage URI every node reaches, so a paused
ladder trial recorded by one driver resumes on another node or under a later driver."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from pyarrow.fs import LocalFileSystem, S3FileSystem

from npas.errors import StudyError
from npas.service.execution.climb_store import (
    checkpoint_uri,
    from_storage,
    is_checkpoint,
    load_climbs,
    save_climbs,
)
from npas.service.execution.worker import WorkerSpec
from npas.service.search.launch import Launch, check_inputs
from npas.training.data import load_corpus


def test_a_checkpoint_is_recorded_as_a_path_here_and_as_a_uri_on_cloud_storage():
    assert checkpoint_uri(LocalFileSystem(), "/runs/t/checkpoint_000001") == "/runs/t/checkpoint_000001"
    s3 = S3FileSystem(anonymous=True, region="us-east-1")  # nothing is contacted until a file is read
    assert checkpoint_uri(s3, "bucket/runs/t/checkpoint_000001") == "s3://bucket/runs/t/checkpoint_000001"

    class Unknown:
        type_name = "py::fsspec+memory"

    assert checkpoint_uri(Unknown(), "x") is None  # not recorded: a later driver could not read it


class _EmptyBucket(BaseHTTPRequestHandler):
    """An S3 endpoint holding one empty bucket: no object (HEAD 404), no key under any prefix."""

    def log_message(self, *args) -> None:
        pass

    def do_HEAD(self) -> None:
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        body = (b'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/'
                b'2006-03-01/"><Name>bucket</Name><KeyCount>0</KeyCount><IsTruncated>false</IsTruncated>'
                b"</ListBucketResult>")
        self.send_response(200)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def s3_endpoint(monkeypatch):
    """host:port of an S3 endpoint on this machine (pyarrow's real S3 client talks to it; no network)."""
    for k, v in {"AWS_ACCESS_KEY_ID": "npas-test", "AWS_SECRET_ACCESS_KEY": "npas-test",
                 "AWS_EC2_METADATA_DISABLED": "true"}.items():  # no credential lookup over the network
        monkeypatch.setenv(k, v)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EmptyBucket)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_paths_and_reachable_uris_are_accepted(tmp_path, s3_endpoint):
    """An absolute path (created by Tune when missing), a file:// URI and a bucket that answers pass;
    what cannot work (relative, a file, an endpoint that never answers) is tests/presentation/
    test_inputs_round3.py's."""
    for where in (str(tmp_path / "shared" / "npas" / "runs"), f"file://{tmp_path}/x",
                  f"s3://bucket/npas?endpoint_override={s3_endpoint}&scheme=http"):
        assert check_inputs(2, Launch(checkpoint_storage=where), None).checkpoint_storage == where


@pytest.mark.parametrize("where, fragment", [("ftp://h/x", "ftp:// is not a storage"), ("  ", "is empty")])
def test_unreadable_storage_is_refused_before_anything_starts(where, fragment):
    with pytest.raises(StudyError, match=fragment):
        check_inputs(2, Launch(checkpoint_storage=where), None)


@pytest.fixture(scope="module")
def corpus_tiny():
    from tests.training.test_located_rate import REFERENCE, TIED, WSD

    return TIED, WSD, load_corpus(), WorkerSpec(fingerprint="-", reference=REFERENCE)


def test_a_climb_resumes_from_a_checkpoint_given_as_a_uri(tmp_path, corpus_tiny):
    """A recorded URI (here file://, the scheme a test can reach) restores the same climb a path does;
    a URI holding no checkpoint gives None, and the trial starts afresh."""
    from npas.training import climb

    cfg, recipe, corpus, spec = corpus_tiny
    c = climb.start(cfg, recipe, corpus, device="cpu", reference=spec.reference)
    c.step_up()
    save_climbs([c], tmp_path / "ckpt", {"wall_s": 1.0})
    assert is_checkpoint(tmp_path / "ckpt", 1)
    by_path, meta_path = load_climbs(tmp_path / "ckpt", cfg, corpus, spec, 1)
    by_uri, meta_uri = from_storage(f"file://{tmp_path / 'ckpt'}", cfg, corpus, spec, 1)
    assert meta_uri == meta_path and by_uri[0].rung_losses == by_path[0].rung_losses == c.rung_losses
    assert by_uri[0].climb() == by_path[0].climb()  # the same state, so the same losses onwards
    assert from_storage(f"file://{tmp_path / 'none'}", cfg, corpus, spec, 1) is None
    assert from_storage(str(tmp_path / "ckpt"), cfg, corpus, spec, 1) is None  # a path: the caller's branch
