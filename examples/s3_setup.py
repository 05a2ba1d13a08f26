"""The tracker on S3, offline: a local S3 API server (moto's), a bucket, an fsspec config.

Run it from the repository root (needs the s3 and test extras: s3fs, boto3, moto[server]):

    pip install -e '.[s3,test]' && python examples/s3_setup.py [--dir tracker_runs]

It starts `python -m moto.server` on 127.0.0.1, creates a bucket with boto3, writes the fsspec
config a job would use (torchx's key=value file: dotted keys nest, so
`client_kwargs.endpoint_url` reaches botocore), logs a few steps to
s3://<bucket>/runs, lists the run with the CLI, and stops the server. For real S3, drop
endpoint_url, key and secret: s3fs then finds your AWS credentials as boto3 does.
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import boto3

from async_tracker import AppRun

KEY, SECRET, REGION = "testing", "testing", "us-east-1"  # moto takes any credentials
SERVER_START_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def s3_server() -> Iterator[str]:
    """moto's S3 API server on a free port of 127.0.0.1; its endpoint URL while it runs."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while True:  # poll until the server answers (any HTTP status will do)
            try:
                urllib.request.urlopen(url, timeout=1).close()
                break
            except urllib.error.HTTPError:
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto's server did not start on {url}") from None
                time.sleep(0.1)
        yield url
    finally:
        server.terminate()
        server.wait(10)


def write_config(path: Path, bucket: str, endpoint_url: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "protocol=s3\n"
        f"root_path={bucket}/runs\n"
        f"key={KEY}\n"
        f"secret={SECRET}\n"
        f"client_kwargs.endpoint_url={endpoint_url}\n"
        f"client_kwargs.region_name={REGION}\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default="tracker_runs", help="where the config file goes")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    config = Path(args.dir).resolve() / "s3.cfg"
    bucket = f"tracker-{secrets.token_hex(4)}"

    with s3_server() as endpoint_url:
        boto3.client(
            "s3", endpoint_url=endpoint_url, region_name=REGION,
            aws_access_key_id=KEY, aws_secret_access_key=SECRET,
        ).create_bucket(Bucket=bucket)  # fmt: skip
        write_config(config, bucket, endpoint_url)
        print(f"S3 API server at {endpoint_url}, bucket {bucket}; {config}:\n")
        print(config.read_text())

        # What `async-tracker run` or `torchx run` would set for the job.
        run_id = f"local://examples/s3-{secrets.token_hex(3)}"
        os.environ.update(
            TORCHX_JOB_ID=run_id, TORCHX_TRACKERS="fsspec", TORCHX_TRACKER_FSSPEC_CONFIG=str(config)
        )
        run = AppRun.run_from_env()
        run.add_metadata(store="s3", bucket=bucket)
        for step in range(args.steps):
            run.log_metric("loss", 1.0 / (step + 1), step=step)
        report = run.close()
        print(f"run {run_id}: {report.delivered} records delivered, ok={report.ok}")

        for cmd in (["list", "jobs"], ["list", "metrics", run_id]):
            print(f"\n$ async-tracker {' '.join(cmd)}", flush=True)
            subprocess.run([sys.executable, "-m", "async_tracker", *cmd], check=True)


if __name__ == "__main__":
    main()
