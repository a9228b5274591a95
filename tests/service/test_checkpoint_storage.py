"""--checkpoint-storage: trials' checkpoints on a path or storage URI every node reaches, so a paused
ladder trial recorded by one driver resumes on another node or under a later driver."""

from __future__ import annotations

import pytest
from pyarrow.fs import LocalFileSystem, S3FileSystem

from npas.errors import StudyError
from npas.service.search.climb_store import from_storage, is_checkpoint, load_climbs, save_climbs
from npas.service.search.launch import Launch, check_inputs, checkpoint_uri
from npas.service.search.worker import WorkerSpec
from npas.training.data import load_corpus


def test_a_checkpoint_is_recorded_as_a_path_here_and_as_a_uri_on_cloud_storage():
    assert checkpoint_uri(LocalFileSystem(), "/runs/t/checkpoint_000001") == "/runs/t/checkpoint_000001"
    s3 = S3FileSystem(anonymous=True, region="us-east-1")  # nothing is contacted until a file is read
    assert checkpoint_uri(s3, "bucket/runs/t/checkpoint_000001") == "s3://bucket/runs/t/checkpoint_000001"

    class Unknown:
        type_name = "py::fsspec+memory"

    assert checkpoint_uri(Unknown(), "x") is None  # not recorded: a later driver could not read it


@pytest.mark.parametrize("where", ["s3://bucket/npas", "gs://b/x", "/shared/npas/runs", "file:///tmp/x"])
def test_paths_and_known_uris_are_accepted(where):
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
