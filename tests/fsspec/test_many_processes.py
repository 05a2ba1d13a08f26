"""Eight processes share one run of one store (a local root, then moto's S3 server through a
``url=`` config): the last write of each metadata key wins by call order, whichever process
made it; every lineage edge is kept; and torchx's own reader sees the same metadata."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from async_tracker.backend.fsspec import (
    METADATA_DIR,
    AsyncFsspecTracker,
    FsspecTracker,
    create,
    encode_run_id,
)

REPO = Path(__file__).resolve().parents[2]
RANKS = 8
RUN = "local://job/shared"
KEYS = ("lr", "epoch", "status", "best")
PARENTS = 3  # each rank links the run to each parent under its own artifact name
BURST = 12  # writes and flushes per rank, all ranks at once

# A rank: one AppRun on the shared run, driven by JSON commands on stdin. Each command is
# flushed (delivered) before "ok" is printed, so the driver knows the order of the calls.
RANK = """
import json, sys
from async_tracker import AppRun
from async_tracker.backend.fsspec import create

config, run_id, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
run = AppRun(run_id, [create(config)], flush_interval=3600.0)

def flushed():
    report = run.flush()
    assert report.ok, report

print("ready", flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    if cmd["op"] == "set":
        run.add_metadata(**{cmd["key"]: cmd["value"]})
        flushed()
    elif cmd["op"] == "burst":
        for i in range(cmd["n"]):
            run.add_metadata(shared=[rank, i], **{f"rank{rank}": i})
            run.add_source(f"parent-{i % cmd['parents']}", f"art-{rank}")
            flushed()
    elif cmd["op"] == "close":
        assert run.close().ok
        print("ok", flush=True)
        break
    print("ok", flush=True)
"""

READ_WITH_TORCHX = """
import json, sys, fsspec
from torchx.tracker.backend.fsspec import FsspecTracker
t = FsspecTracker(fsspec.filesystem("file"), sys.argv[1])
run_id, parents = sys.argv[2], json.loads(sys.argv[3])
print(json.dumps({
    "metadata": t.metadata(run_id),
    "sources": sorted([s.source_run_id, s.artifact_name] for s in t.sources(run_id)),
    "children": {p: list(t.run_ids(parent_run_id=p)) for p in parents},
}))
"""


class Rank:
    def __init__(self, config: str, rank: int) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", RANK, config, RUN, str(rank)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        self.expect("ready")

    def send(self, **cmd: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def expect(self, word: str) -> None:
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline() == word + "\n", f"rank exited: {self.proc.poll()}"


@pytest.fixture
def ranks_on() -> Iterator[Any]:
    started: list[Rank] = []

    def start(config: str) -> list[Rank]:
        started.extend(Rank(config, r) for r in range(RANKS))
        return started

    yield start
    for rank in started:
        if rank.proc.poll() is None:
            rank.proc.kill()
        rank.proc.communicate()  # closes the pipes


def drive(ranks: list[Rank], seed: int) -> dict[str, object]:
    """Sets the keys from random ranks, one call at a time; returns each key's last value.
    Then every rank writes its own key, a shared key and lineage edges, all at once."""
    rng = random.Random(seed)
    expected: dict[str, object] = {}
    for step in range(60):
        key = rng.choice(KEYS)
        rank = rng.choice(ranks)
        rank.send(op="set", key=key, value=step)
        rank.expect("ok")
        expected[key] = step
    for rank in ranks:
        rank.send(op="burst", n=BURST, parents=PARENTS)
    for rank in ranks:
        rank.expect("ok")
    for rank in ranks:
        rank.send(op="close")
    for rank in ranks:
        rank.expect("ok")
        assert rank.proc.wait(60) == 0
    return expected


def check(tracker: FsspecTracker, expected: dict[str, object]) -> dict[str, object]:
    metadata = dict(tracker.metadata(RUN))
    # The keys set one call at a time: the last call wins, whichever rank made it.
    assert {k: metadata[k] for k in KEYS} == expected
    # Each rank's own key: its last write. The shared key: some rank's last write.
    assert {k: metadata[k] for k in metadata if k.startswith("rank")} == {
        f"rank{r}": BURST - 1 for r in range(RANKS)
    }
    shared = metadata["shared"]
    assert isinstance(shared, list) and shared[1] == BURST - 1
    assert len(metadata) == len(KEYS) + RANKS + 1

    # Every edge, on both ends.
    edges = {(p, f"art-{r}") for p in (f"parent-{j}" for j in range(PARENTS)) for r in range(RANKS)}
    assert {(s.source_run_id, s.artifact_name) for s in tracker.sources(RUN)} == edges
    for j in range(PARENTS):
        lineage = tracker.lineage(f"parent-{j}")
        assert {(d.source_run_id, d.artifact_name) for d in lineage.descendants} == {
            (RUN, f"art-{r}") for r in range(RANKS)
        }
        assert list(tracker.run_ids(parent_run_id=f"parent-{j}")) == [RUN]
    # The parents hold only descendants: not runs.
    assert list(tracker.run_ids()) == [RUN]
    return metadata


def one_file_per_key(tracker: FsspecTracker) -> None:
    inner = tracker.async_tracker
    assert isinstance(inner, AsyncFsspecTracker)
    directory = f"{inner.root_dir}/{encode_run_id(RUN)}/{METADATA_DIR}"
    inner.fs.invalidate_cache()
    names = [p.rsplit("/", 1)[1] for p in inner.fs.ls(directory, detail=False)]
    digests = [n.rsplit("-", 1)[1] for n in names]
    assert len(digests) == len(set(digests)) == len(KEYS) + RANKS + 1, names


@pytest.mark.parametrize("seed", [1, 2])
def test_eight_processes_on_a_local_root(
    tmp_path: Path, ranks_on: Any, torchx_python: Path, seed: int
) -> None:
    root = tmp_path / "store"
    config = tmp_path / "fsspec.cfg"
    config.write_text(f"protocol=file\nroot_path={root}\n")
    expected = drive(ranks_on(str(config)), seed)
    tracker = create(str(config))
    metadata = check(tracker, expected)
    one_file_per_key(tracker)

    # torchx's reader, which merges files in listing order, sees the same metadata, every
    # source and every child; artifact names of one source written by several ranks at
    # once live in one file torchx reads, which may miss some of them.
    parents = [f"parent-{j}" for j in range(PARENTS)]
    out = subprocess.run(
        [str(torchx_python), "-c", READ_WITH_TORCHX, str(root), RUN, json.dumps(parents)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    seen = json.loads(out.stdout)
    assert seen["metadata"] == metadata
    assert {source for source, _ in seen["sources"]} == set(parents)
    assert {art for _, art in seen["sources"]} <= {f"art-{r}" for r in range(RANKS)}
    assert seen["children"] == {p: [RUN] for p in parents}


def test_eight_processes_on_s3_named_by_url(
    s3_endpoint: str, tmp_path: Path, ranks_on: Any
) -> None:
    boto3 = pytest.importorskip("boto3")
    bucket = f"b-{uuid.uuid4().hex[:12]}"
    boto3.client(
        "s3", endpoint_url=s3_endpoint, region_name="us-east-1",
        aws_access_key_id="testing", aws_secret_access_key="testing",
    ).create_bucket(Bucket=bucket)  # fmt: skip
    config = tmp_path / "s3.cfg"
    # url= instead of protocol and root_path; numbers parsed (botocore refuses the text "3").
    config.write_text(
        f"url=s3://{bucket}/runs\n"
        "key=testing\nsecret=testing\nskip_instance_cache=true\n"
        f"client_kwargs.endpoint_url={s3_endpoint}\n"
        "client_kwargs.region_name=us-east-1\n"
        "config_kwargs.retries.max_attempts=3\n"
        "config_kwargs.connect_timeout=5\n"
    )
    expected = drive(ranks_on(str(config)), seed=3)
    tracker = create(str(config))
    check(tracker, expected)
    one_file_per_key(tracker)
