"""An S3 store URL on moto's server, for the store tests (fsspec's config points s3:// at it)."""

from __future__ import annotations

import fsspec.config
import pytest

from tests.fsspec.conftest import _s3_credentials, make_bucket, s3_endpoint  # noqa: F401


@pytest.fixture
def s3_url(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:  # noqa: F811
    """``s3://<fresh bucket>/runs``, with fsspec's ``s3`` config aimed at the server."""
    pytest.importorskip("s3fs")
    monkeypatch.setitem(fsspec.config.conf, "s3", {
        "key": "testing", "secret": "testing", "skip_instance_cache": True,
        "client_kwargs": {"endpoint_url": s3_endpoint, "region_name": "us-east-1"},
    })  # fmt: skip
    return f"s3://{make_bucket(s3_endpoint)}/runs"


@pytest.fixture
def no_writer_folds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writers do not fold the run index (``indexfold.py``): for tests that count what the
    readers' own compaction reads, writes and removes."""
    from async_tracker.backend.fsspec import indexfold

    monkeypatch.setattr(indexfold, "FOLD_AFTER_FILES", 10**9)
    monkeypatch.setattr(indexfold, "_states", {})
