"""Fixtures for the fsspec backend: a real S3 API server (moto's) on 127.0.0.1, and torchx
from PyPI in a virtual environment of its own (it pins an old urllib3)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import filelock
import pytest

from tests.core.helpers import free_port

REPO = Path(__file__).resolve().parents[2]


def make_bucket(endpoint: str) -> str:
    """A new, empty bucket on the S3 server at ``endpoint``; its name."""
    boto3 = pytest.importorskip("boto3")
    bucket = f"b-{uuid.uuid4().hex[:12]}"
    boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id="testing", aws_secret_access_key="testing",
    ).create_bucket(Bucket=bucket)  # fmt: skip
    return bucket


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Polls ``url`` until it answers (any HTTP status) or the process dies or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.1)  # polling a server's readiness, not synchronising our own code
    raise RuntimeError(f"server at {url} not ready after {timeout_s} s")


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url, proc, 30)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="session", autouse=True)
def _s3_credentials() -> None:
    # Dummy credentials for moto, so botocore never looks for real ones.
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")


@pytest.fixture
def s3_config(s3_endpoint: str, tmp_path: Path) -> str:
    """A torchx-style config file for a fresh bucket on the S3 server, with nested keys."""
    bucket = f"b-{uuid.uuid4().hex[:12]}"
    boto3 = pytest.importorskip("boto3")
    boto3.client(
        "s3", endpoint_url=s3_endpoint, region_name="us-east-1",
        aws_access_key_id="testing", aws_secret_access_key="testing",
    ).create_bucket(Bucket=bucket)
    cfg = tmp_path / "s3.cfg"
    cfg.write_text(
        "# S3 API server started by the tests\n"
        "protocol=s3\n"
        f"root_path={bucket}/runs\n"
        "key=testing\n"
        "secret=testing\n"
        "skip_instance_cache=true\n"
        f"client_kwargs.endpoint_url={s3_endpoint}\n"
        "client_kwargs.region_name=us-east-1\n"
    )
    return str(cfg)


@pytest.fixture(scope="session")
def torchx_python() -> Path:
    """The interpreter of a virtual environment holding torchx from PyPI (made once, kept
    in .venvs/torchx, which CI builds afresh on a clean clone)."""
    venv = REPO / ".venvs" / "torchx"
    python = venv / "bin" / "python"
    (REPO / ".venvs").mkdir(exist_ok=True)
    # One builder at a time: each pytest-xdist worker runs this session fixture.
    with filelock.FileLock(f"{venv}.lock"):
        if not (venv / ".ready").exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
            subprocess.run(
                [str(python), "-m", "pip", "install", "-q", "torchx", "fsspec"],
                check=True,
            )
            (venv / ".ready").write_text("ok\n")
    return python
