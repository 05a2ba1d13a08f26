"""Processes that start runs: several creating one run id at the same moment (the race
``resume="never"`` must win once), and a durable job killed with points in its spool (what a
resume must continue after). Used by the local store's tests and the S3 store's.

Each child starts once and runs every trial: the parent writes one line to all of them at
once (the barrier: each child blocks reading its stdin), each child waits a seeded jitter of
up to 2 ms (so that who comes first varies across trials, reproducibly by seed), calls
``init(id=..., resume="never")`` and says ``won`` or ``refused``.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from tests.core.helpers import Child

CREATOR = """
import random, sys, time
import async_tracker
from async_tracker import TrackerConfigError

store, seed, me, trials = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(seed * 1000 + me)
print("ready", flush=True)
for trial in range(trials):
    sys.stdin.readline()  # the barrier: every child is released by the same line
    jitter_until = time.perf_counter() + rng.random() * 0.002
    while time.perf_counter() < jitter_until:
        pass
    try:
        run = async_tracker.init(
            "race", dir=store, id=f"race/{seed}-{trial}", resume="never", timeout=60,
            flush_interval=3600,
        )
    except TrackerConfigError as exc:
        print("refused", str(exc).splitlines()[0][:80], flush=True)
    else:
        print("won", flush=True)
        run.close(timeout=30)
"""


# A durable job on a store (argv[1]) spooling in argv[2] under the id argv[3]: stores 100
# points and says "stored", then waits for a line on stdin (the parent takes the store down
# meanwhile), logs 400 more, which only its write-ahead spool gets, says "spooled" and waits to
# be killed.
DURABLE_CHILD = """
import sys
import async_tracker
from async_tracker.spool import spooled_last_steps
from tests.core.helpers import wait_until

store, spool, run_id = sys.argv[1:4]
run = async_tracker.init("p", dir=store, id=run_id, durable=True, spool_dir=spool,
                         flush_interval=3600, timeout=60)
for i in range(100):
    run.log_metric("loss", float(i))
assert run.flush(60).ok
print("stored", flush=True)
sys.stdin.readline()
for i in range(100, 500):
    run.log_metric("loss", float(i))
run.flush(0)  # cut now: the write-ahead log has the points before delivery is tried
wait_until(lambda: spooled_last_steps(spool, run_id).get("loss") == 499, "points spooled")
print("spooled", flush=True)
sys.stdin.read()
"""


def race(
    store: str, processes: int, trials: int, env: Mapping[str, str] | None = None
) -> tuple[int, list[list[str]]]:
    """Runs ``trials`` races of ``processes`` creators on ``store``; the seed used and, per
    trial, each child's answer (``won`` or ``refused ...``)."""
    seed = random.SystemRandom().randrange(2**31)
    print(f"creators race seed {seed}")  # shown by pytest with a failure
    children = [
        Child(CREATOR, store, str(seed), str(me), str(trials), **dict(env or {}))
        for me in range(processes)
    ]
    try:
        for child in children:
            assert child.readline(60) == "ready"
        answers: list[list[str]] = []
        for _ in range(trials):
            for child in children:
                assert child.proc.stdin is not None
                child.proc.stdin.write(b"go\n")
                child.proc.stdin.flush()
            answers.append([child.readline(90) for child in children])
        for child in children:
            assert child.proc.stdin is not None
            child.proc.stdin.close()
            assert child.wait(60) == 0, child.stderr()
        return seed, answers
    finally:
        for child in children:
            child.close()


def check_one_winner(seed: int, answers: list[list[str]]) -> None:
    bad = [
        (trial, said) for trial, said in enumerate(answers)
        if sum(a == "won" for a in said) != 1
        or not all(a == "won" or a.startswith("refused") for a in said)
    ]
    assert not bad, f"seed {seed}: trials without exactly one winner: {bad[:3]}"
