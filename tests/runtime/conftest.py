"""The runtime's tests each get their own kernel cache directory (not the
session's shared one) and the default compiler."""

import pytest

from tf_fusionstitch.runtime import cache


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    directory = tmp_path / "cache"
    monkeypatch.setenv(cache.ENV_CACHE_DIR, str(directory))
    monkeypatch.delenv("CXX", raising=False)
    return directory
