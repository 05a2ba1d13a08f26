"""Counting S3 requests: tests and benchmarks that state how many requests a read costs."""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def counting() -> Iterator[collections.Counter[str]]:
    """The S3 requests made meanwhile, by operation, counted at s3fs's one entry for them
    (``S3FileSystem._call_s3``: one call per request, retries aside). Counts nothing where
    s3fs is not installed."""
    calls: collections.Counter[str] = collections.Counter()
    try:
        import s3fs
    except ImportError:
        yield calls
        return
    real = s3fs.S3FileSystem._call_s3

    async def counted(fs: Any, method: Any, *args: Any, **kwargs: Any) -> Any:
        calls[method if isinstance(method, str) else getattr(method, "__name__", "?")] += 1
        return await real(fs, method, *args, **kwargs)

    s3fs.S3FileSystem._call_s3 = counted
    try:
        yield calls
    finally:
        s3fs.S3FileSystem._call_s3 = real
