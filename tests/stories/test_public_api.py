"""`npas.__all__` is the whole public API: what a user scripts with (load a space, count, build, plan,
search, resume, export, certify, convert, train, the errors), at most 45 names, every one resolving. A
tool that needs more imports the module that defines it (tests/bench/test_harness_store.py holds the
benches to modules docs/architecture.md names), so no second table of names grows beside it."""

from __future__ import annotations

import pytest

import npas


def test_all_is_a_user_sized_api_and_every_name_resolves():
    assert 30 <= len(npas.__all__) <= 45, len(npas.__all__)
    assert len(set(npas.__all__)) == len(npas.__all__)
    assert all(getattr(npas, name) is not None for name in npas.__all__)
    assert npas.CertifyOptions.__name__ == "Options"  # a lazy name may differ from its module's


def test_no_name_beyond_all_resolves_lazily():
    from npas import _LAZY

    assert set(_LAZY) <= set(npas.__all__), sorted(set(_LAZY) - set(npas.__all__))
    for internal in ("tying_map", "NpasSearcher", "ENTRY_POINTS", "certificate_table"):
        with pytest.raises(AttributeError, match=internal):
            getattr(npas, internal)
