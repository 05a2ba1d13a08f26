"""The start of a job on S3 (moto's server) behind a TCP proxy the test controls: ``init()``
returns and spools whether the endpoint refuses connections, resets them or never answers;
``resume="never"`` cannot be promised then and says so in one line; of several processes
creating one id exactly one wins; a run killed while its points were spooled resumes after
them."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import fsspec.config
import pytest

import async_tracker
from async_tracker import AppRun, TrackerConfigError
from async_tracker.init_run import open_store
from async_tracker.spool import has_spool, spooled_last_steps
from tests.core.helpers import Child
from tests.creators import DURABLE_CHILD, check_one_winner, race
from tests.fsspec.conftest import make_bucket
from tests.tcp_proxy import TcpProxy, tcp_proxy

# The endpoint's bad behaviours (see tests/tcp_proxy.py).
DOWN = ["refuse", "reset", "silent"]


def s3_options(endpoint: str) -> dict[str, object]:
    """What fsspec's config gives ``s3://`` URLs: the endpoint, and no retries of botocore's
    beyond one (a test on a refusing endpoint need not wait through them to close)."""
    return {
        "key": "testing", "secret": "testing",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2},
    }


@pytest.fixture
def proxy(s3_endpoint: str) -> Iterator[TcpProxy]:
    with tcp_proxy(s3_endpoint) as p:
        yield p


@pytest.fixture
def store(
    s3_endpoint: str, proxy: TcpProxy, monkeypatch: pytest.MonkeyPatch
) -> str:
    """``s3://<fresh bucket>/runs``, reached through the proxy (fsspec's config for ``s3``,
    as a user sets it, or FSSPEC_S3 in a child's environment)."""
    monkeypatch.setitem(fsspec.config.conf, "s3", s3_options(proxy.url))
    return f"s3://{make_bucket(s3_endpoint)}/runs"


def init_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "async_tracker.init_run"]


@pytest.mark.parametrize("mode", DOWN)
def test_init_starts_and_spools_whatever_the_endpoint_does(
    store: str, proxy: TcpProxy, tmp_path: Path, caplog: pytest.LogCaptureFixture, mode: str
) -> None:
    spool = tmp_path / "spool"
    proxy.mode = mode  # type: ignore[assignment]
    with caplog.at_level(logging.WARNING, logger="async_tracker.init_run"):
        run = async_tracker.init("p", dir=store, timeout=0.5, spool_dir=str(spool))
    warned = init_warnings(caplog)
    assert len(warned) == 1 and "did not answer" in warned[0] and run.id in warned[0], warned
    for i in range(10):
        run.log_metric("loss", float(i))
    report = run.close(timeout=0.5)
    assert report.spooled == 11 and has_spool(spool, run.id), report  # 10 points, metadata
    assert spooled_last_steps(spool, run.id) == {"loss": 9}

    # The store back: the run was never claimed nor stored, and "must" finds it in the spool.
    proxy.mode = "pass"
    with async_tracker.init(
        "p", dir=store, id=run.id, resume="must", spool_dir=str(spool), timeout=60
    ) as resumed:
        resumed.log_metric("loss", 10.0)  # after the spooled step 9, the spool replayed first
    points = AppRun(run.id, [open_store(store)]).metrics()["loss"]
    assert [(p.step, p.value) for p in points] == [(i, float(i)) for i in range(11)]


@pytest.mark.parametrize("mode", ["refuse", "silent"])
def test_resume_without_an_answer(
    store: str, proxy: TcpProxy, tmp_path: Path, caplog: pytest.LogCaptureFixture, mode: str
) -> None:
    """"never" cannot promise that no other process holds the id: one line, no traceback
    of the network's; "allow" and "must" start, with one warning."""
    proxy.mode = mode  # type: ignore[assignment]
    with pytest.raises(TrackerConfigError) as info:
        async_tracker.init("p", dir=store, id="p/x", resume="never", timeout=0.5)
    assert "resume='never'" in str(info.value) and "\n" not in str(info.value)
    assert info.value.__cause__ is None
    assert info.value.__context__ is None or info.value.__suppress_context__
    for resume in ("allow", "must"):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="async_tracker.init_run"):
            run = async_tracker.init(
                "p", dir=store, id="p/x", resume=resume, timeout=0.5,
                spool_dir=str(tmp_path / "spool"),
            )
        run.close(timeout=0.2)
        warned = init_warnings(caplog)
        assert len(warned) == 1 and f"resume={resume!r} unchecked" in warned[0], warned


def test_concurrent_creates_on_s3_exactly_one_wins(s3_endpoint: str) -> None:
    """4 processes released at once on one id, 15 times, with a conditional PUT each."""
    store = f"s3://{make_bucket(s3_endpoint)}/runs"
    env = {"FSSPEC_S3": json.dumps(s3_options(s3_endpoint))}
    seed, answers = race(store, processes=4, trials=15, env=env)
    check_one_winner(seed, answers)


def test_resume_after_sigkill_with_the_store_down_continues_after_the_spooled_steps(
    store: str, proxy: TcpProxy, tmp_path: Path
) -> None:
    spool, run_id = tmp_path / "spool", "p/killed"
    env = {"FSSPEC_S3": json.dumps(fsspec.config.conf["s3"])}
    child = Child(DURABLE_CHILD, store, str(spool), run_id, **env)
    try:
        assert child.readline(60) == "stored"
        proxy.mode = "refuse"
        assert child.proc.stdin is not None
        child.proc.stdin.write(b"go\n")
        child.proc.stdin.flush()
        assert child.readline(60) == "spooled"
        child.kill()  # SIGKILL: steps 100 to 499 exist only in the spool
    finally:
        child.close()
    proxy.mode = "pass"
    with async_tracker.init("p", dir=store, id=run_id, spool_dir=str(spool), timeout=60) as run:
        for i in range(500, 600):
            run.log_metric("loss", float(i))  # no step: after the spooled 499
    points = AppRun(run_id, [open_store(store)]).metrics()["loss"]
    assert [(p.step, p.value) for p in points] == [(i, float(i)) for i in range(600)]
    assert [p.step for p in sorted(points, key=lambda p: p.timestamp)] == list(range(600))
    assert not has_spool(spool, run_id)
