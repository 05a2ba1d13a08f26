"""Every read has a deadline: against an S3 endpoint that accepts connections and never
answers, a read command fails within its --timeout with one line naming the store (exit 1),
and ``Store(timeout=)`` raises ReadTimeoutError naming it; the same store answering again is
read as usual."""

from __future__ import annotations

from collections.abc import Iterator

import fsspec.config
import pytest

from async_tracker import AppRun, Store
from async_tracker.cli.main import main
from async_tracker.errors import ReadTimeoutError
from async_tracker.init_run import open_store
from tests.fsspec.conftest import make_bucket, s3_endpoint  # noqa: F401
from tests.fsspec.test_start_s3 import s3_options
from tests.tcp_proxy import TcpProxy, tcp_proxy

pytest.importorskip("s3fs")


@pytest.fixture
def proxy(s3_endpoint: str) -> Iterator[TcpProxy]:  # noqa: F811
    with tcp_proxy(s3_endpoint) as p:
        yield p


@pytest.fixture
def store(s3_endpoint: str, proxy: TcpProxy, monkeypatch: pytest.MonkeyPatch) -> str:  # noqa: F811
    monkeypatch.setitem(fsspec.config.conf, "s3", s3_options(proxy.url))
    url = f"s3://{make_bucket(s3_endpoint)}/runs"
    with AppRun("proj/a", [open_store(url)], heartbeat_s=0) as run:
        run.log_metric("loss", 1.0, step=0)
    return url


@pytest.mark.parametrize(
    "argv", [["list", "jobs"], ["list", "metadata", "proj/a"], ["compare", "proj/a"]]
)
def test_a_store_that_never_answers_fails_the_command_in_its_deadline(
    store: str, proxy: TcpProxy, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    proxy.mode = "silent"
    assert main(["--store", store, "--timeout", "0.5", *argv]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and store in err[0] and "0.5 s" in err[0], err
    proxy.mode = "pass"
    assert main(["--store", store, "--json", *argv]) == 0


def test_store_reads_have_a_deadline(store: str, proxy: TcpProxy) -> None:
    proxy.mode = "silent"
    reader = Store(store, timeout=0.5)
    with pytest.raises(ReadTimeoutError) as info:
        reader.runs()
    assert store in str(info.value) and "\n" not in str(info.value)
    proxy.mode = "pass"
    assert [r.run_id for r in Store(store, timeout=30).runs()] == ["proj/a"]


def test_a_bad_timeout_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("0", "-1", "soon"):
        assert main(["--timeout", bad, "list", "jobs"]) == 2
        assert "--timeout" in capsys.readouterr().err
