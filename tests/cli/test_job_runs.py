"""Runs inside a job: ``init()`` under ``async-tracker run`` (a child process, as a user runs
it), recording into a real local store.

One run per ``init()``: a plain ``init()`` (and ``init(id=<the job's run>)``, and
``AppRun.run_from_env()``) is the job's run; an ``init()`` that names its own run opens it,
a child of the job's run; the processes (ranks) of one job share each named run, and a job
started again under its id (a requeue) resumes them. A job id with no tracker configured
says so once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from fsspec.implementations.local import LocalFileSystem

import async_tracker
from async_tracker.backend.fsspec import FsspecTracker
from async_tracker.init_run import child_run_id
from tests.cli.conftest import PARENT, child_env

# The README's tour, run as a job: two runs of a sweep, in one process.
SWEEP = """
import async_tracker

for lr in (0.1, 0.01):
    with async_tracker.init("mnist", name=f"lr-{lr}", config={"lr": lr, "epochs": 3}) as run:
        loss = 1.0
        for step in range(100):
            loss *= 1 - lr
            run.log({"loss": loss, "acc": 1 - loss}, step=step)
    print(run.id)
"""

# Every way of asking for the job's own run.
JOBS_OWN_RUN = """
import os
import async_tracker
from async_tracker import AppRun

with async_tracker.init("p", quiet=True) as run:
    run.log_metric("loss", 1.0, step=0)
print(run.id)
with async_tracker.init("p", id=os.environ["TORCHX_JOB_ID"], quiet=True) as run:
    run.log_metric("loss", 2.0, step=1)
print(run.id)
job = AppRun.run_from_env()
job.log_metric("loss", 3.0, step=2)
print(job.id)
"""

# One rank of a job: a run named "trial" twice (the second is a run of its own), then the
# job's run; each rank logs its own metric, as ranks of a data-parallel job log their own.
RANK = """
import sys
import async_tracker
from async_tracker import AppRun

rank = sys.argv[1]
for trial in range(2):
    with async_tracker.init("p", name="trial", config={"trial": trial}, quiet=True) as run:
        run.log_metric(f"loss/rank{rank}", float(trial), step=0)
    print(run.id)
AppRun.run_from_env().log_metric(f"steps/rank{rank}", 1.0, step=0)
"""

# A job of three ranks started at once, as torchrun or torchx's replicas start them.
RANKS = """
import subprocess, sys
ranks = [
    subprocess.Popen([sys.executable, "rank.py", str(r)], stdout=subprocess.PIPE, text=True)
    for r in range(3)
]
outs = [r.communicate()[0] for r in ranks]
print(" ".join(outs[0].split()))
sys.exit(max(r.returncode for r in ranks))
"""

# A run named after the job ("train", as `async-tracker run --name train` names the job).
NAMED_LIKE_THE_JOB = """
import async_tracker
with async_tracker.init("p", name="train", quiet=True) as run:
    run.log_metric("loss", 0.5, step=0)
print(run.id)
"""

# A trial that a job started again under its id (a requeue) continues: step-less points.
TRIAL = """
import async_tracker
with async_tracker.init("p", name="trial", quiet=True) as run:
    for _ in range(3):
        run.log_metric("loss", 1.0)
print(run.id)
"""


def launch(cwd: Path, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m async_tracker ARGV`` as a child process (no deadline of its own: a loaded
    machine makes it slow, not wrong)."""
    done = subprocess.run(
        [sys.executable, "-m", "async_tracker", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=child_env(**env),
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    return done


def job_run_id(done: subprocess.CompletedProcess[str]) -> str:
    """The job's run id, from the launcher's first line on stderr."""
    first = done.stderr.splitlines()[0]
    assert first.startswith("async-tracker: run "), done.stderr
    return first.removeprefix("async-tracker: run ")


def default_store(cwd: Path) -> FsspecTracker:
    return FsspecTracker(LocalFileSystem(), str(cwd / "tracker_runs"))


def test_each_named_init_in_a_job_opens_its_own_run_a_child_of_the_jobs(
    isolated: Path,
) -> None:
    (isolated / "train.py").write_text(SWEEP)
    done = launch(isolated, "run", "--parent-run-id", PARENT, "--", sys.executable, "train.py")
    job = job_run_id(done)
    first, second = done.stdout.split()
    assert first.startswith("mnist/lr-0.1-") and second.startswith("mnist/lr-0.01-")
    store = default_store(isolated)
    # Two runs, each with its own params and its 100 points; the job's run holds nothing.
    assert set(store.run_ids()) == {first, second}
    for run_id, lr in ((first, 0.1), (second, 0.01)):
        assert store.metadata(run_id) == {"project": "mnist", "lr": lr, "epochs": 3}
        metrics = store.metrics(run_id)
        assert [p.step for p in metrics["loss"]] == list(range(100))
        assert len(metrics["acc"]) == 100
        assert [s.source_run_id for s in store.sources(run_id)] == [job]
    assert sorted(store.run_ids(parent_run_id=job)) == sorted([first, second])
    # The CLI reads them back by name, and as the job's children.
    listed = launch(isolated, "--json", "list", "jobs", "--parent-run-id", job)
    assert sorted(row["run_id"] for row in json.loads(listed.stdout)) == sorted([first, second])
    compared = launch(isolated, "--json", "list", "metrics", "mnist/lr-0.1")
    assert json.loads(compared.stdout)["loss"]["count"] == 100


def test_a_plain_init_init_by_the_jobs_id_and_run_from_env_are_the_jobs_run(
    isolated: Path,
) -> None:
    (isolated / "job.py").write_text(JOBS_OWN_RUN)
    done = launch(isolated, "run", "--parent-run-id", PARENT, "--", sys.executable, "job.py")
    job = job_run_id(done)
    assert done.stdout.split() == [job, job, job]
    store = default_store(isolated)
    assert set(store.run_ids()) == {job}
    assert [p.value for p in store.metrics(job)["loss"]] == [1.0, 2.0, 3.0]
    assert [s.source_run_id for s in store.sources(job)] == [PARENT]


def test_the_ranks_of_a_job_share_each_named_run(isolated: Path) -> None:
    (isolated / "rank.py").write_text(RANK)
    (isolated / "ranks.py").write_text(RANKS)
    done = launch(isolated, "run", "--", sys.executable, "ranks.py")
    job = job_run_id(done)
    first, second = done.stdout.split()  # rank 0's two trials
    assert first != second and first.startswith("p/trial-") and second.startswith("p/trial-")
    store = default_store(isolated)
    assert set(store.run_ids()) == {job, first, second}
    ranks = {f"loss/rank{r}" for r in range(3)}
    for run_id, trial in ((first, 0), (second, 1)):
        metrics = store.metrics(run_id)
        assert set(metrics) == ranks
        assert all([p.value for p in metrics[name]] == [trial] for name in ranks)
        assert store.metadata(run_id) == {"project": "p", "trial": trial}
        assert [s.source_run_id for s in store.sources(run_id)] == [job]
    assert set(store.metrics(job)) == {f"steps/rank{r}" for r in range(3)}


def test_a_run_named_like_the_job_is_still_a_run_of_its_own(isolated: Path) -> None:
    (isolated / "train.py").write_text(NAMED_LIKE_THE_JOB)
    done = launch(isolated, "run", "--name", "train", "--", sys.executable, "train.py")
    job = job_run_id(done)
    assert job.startswith("local://async_tracker/train-")
    (run_id,) = done.stdout.split()
    assert run_id.startswith("p/train-")
    store = default_store(isolated)
    assert set(store.run_ids()) == {run_id}
    assert [s.source_run_id for s in store.sources(run_id)] == [job]


def job_environ(cwd: Path) -> dict[str, str]:
    """The variables ``async-tracker run`` gives a job (the default store), from
    ``--dry-run``: starting a script twice with them is a job started again under its id."""
    done = launch(cwd, "--json", "run", "--dry-run", "--", "true")
    env = json.loads(done.stdout)["env"]
    assert isinstance(env, dict)
    return env


def test_a_job_started_again_under_its_id_resumes_its_named_runs(isolated: Path) -> None:
    env = job_environ(isolated)
    (isolated / "trial.py").write_text(TRIAL)
    ids = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "trial.py"],
            cwd=isolated,
            capture_output=True,
            text=True,
            env=child_env(**env),
            stdin=subprocess.DEVNULL,
        )
        assert done.returncode == 0, done.stderr
        ids.append(done.stdout.strip())
    assert ids[0] == ids[1]
    store = default_store(isolated)
    assert [p.step for p in store.metrics(ids[0])["loss"]] == [0, 1, 2, 3, 4, 5]


def test_a_named_run_whose_id_another_run_holds_takes_the_next(isolated: Path) -> None:
    env = job_environ(isolated)
    job = env["TORCHX_JOB_ID"]
    taken = child_run_id(job, "p", "trial", 1, 0)
    # Another run of the store holds the id this job's first "trial" would get (the 6 hex
    # digits of two ids can be equal): the job's run gets the next one, in each of its starts.
    other = async_tracker.init("p", id=taken, dir=isolated / "tracker_runs", quiet=True)
    other.log_metric("loss", -1.0, step=0)
    assert other.close().ok
    (isolated / "trial.py").write_text(TRIAL)
    ids = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "trial.py"],
            cwd=isolated,
            capture_output=True,
            text=True,
            env=child_env(**env),
            stdin=subprocess.DEVNULL,
        )
        assert done.returncode == 0, done.stderr
        ids.append(done.stdout.strip())
    assert ids == [child_run_id(job, "p", "trial", 1, 1)] * 2
    store = default_store(isolated)
    assert [p.value for p in store.metrics(taken)["loss"]] == [-1.0]
    assert [p.step for p in store.metrics(ids[0])["loss"]] == [0, 1, 2, 3, 4, 5]


# A trial opened with the resume= given as argv[1]; prints its id, or why it was refused.
RESUMING_TRIAL = """
import sys
import async_tracker
from async_tracker import TrackerConfigError

try:
    with async_tracker.init("p", name="trial", resume=sys.argv[1], quiet=True) as run:
        run.log_metric("loss", 1.0)
except TrackerConfigError as exc:
    print("refused:", exc)
else:
    print(run.id)
"""


def test_resume_applies_to_a_jobs_named_run_as_to_a_given_id(isolated: Path) -> None:
    env = job_environ(isolated)
    (isolated / "trial.py").write_text(RESUMING_TRIAL)

    def start(resume: str) -> str:
        done = subprocess.run(
            [sys.executable, "trial.py", resume],
            cwd=isolated,
            capture_output=True,
            text=True,
            env=child_env(**env),
            stdin=subprocess.DEVNULL,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    trial = child_run_id(env["TORCHX_JOB_ID"], "p", "trial", 1)
    # "must": not started yet, refused, and nothing claimed.
    assert start("must").startswith(f"refused: run {trial!r} is not in the store")
    assert list(default_store(isolated).run_ids()) == []
    # "never": the first process opens it, a later one (a rank, a requeue) is refused.
    assert start("never") == trial
    assert start("never").startswith(f"refused: run {trial!r} already exists")
    assert start("must") == trial
    assert [p.step for p in default_store(isolated).metrics(trial)["loss"]] == [0, 1]


# torchx's runner sets TORCHX_JOB_ID for every job, and TORCHX_TRACKERS only when trackers
# are configured: a job launched with none.
NO_TRACKERS = """
import async_tracker
from async_tracker import AppRun

job = AppRun.run_from_env()
for step in range(3):
    job.log_metric("loss", 1.0, step=step)
job.add_metadata(lr=0.1)
print(job.close().delivered)
with async_tracker.init("p", quiet=True) as run:
    run.log_metric("loss", 1.0, step=0)
with async_tracker.init("p", name="trial", quiet=True) as trial:
    trial.log_metric("loss", 1.0, step=0)
print(run.id, trial.id)
"""


def test_a_job_id_without_trackers_says_so_once(isolated: Path) -> None:
    job = "local_cwd://torchx/train-x1y2z3"
    done = subprocess.run(
        [sys.executable, "-c", NO_TRACKERS],
        cwd=isolated,
        capture_output=True,
        text=True,
        env=child_env(TORCHX_JOB_ID=job),
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    delivered, run_id, trial_id = done.stdout.split()
    # run_from_env() records nothing, as torchx's does, and says so at its first write.
    assert delivered == "0"
    lines = [line for line in done.stderr.splitlines() if "TORCHX_TRACKERS" in line]
    assert len(lines) == 2, done.stderr
    nothing, default = lines
    assert "not recorded" in nothing and job in nothing
    # init() records into the default store, and says where, once.
    assert str(isolated / "tracker_runs") in default and job in default
    assert run_id == job
    store = default_store(isolated)
    assert set(store.run_ids()) == {run_id, trial_id}
    assert [p.value for p in store.metrics(run_id)["loss"]] == [1.0]
    assert [s.source_run_id for s in store.sources(trial_id)] == [job]


def test_a_job_id_with_a_store_of_its_own_says_nothing(isolated: Path) -> None:
    # ASYNC_TRACKER_DIR is a choice of store: init() has nothing to warn about.
    done = subprocess.run(
        [sys.executable, "-c", NO_TRACKERS],
        cwd=isolated,
        capture_output=True,
        text=True,
        env=child_env(
            TORCHX_JOB_ID="local_cwd://torchx/j", ASYNC_TRACKER_DIR=str(isolated / "mine")
        ),
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "TORCHX_TRACKERS" in line]
    assert len(lines) == 1 and "not recorded" in lines[0], done.stderr
    assert (isolated / "mine").is_dir() and not (isolated / "tracker_runs").exists()


def test_child_run_ids_are_readable_and_stable() -> None:
    a = child_run_id("local://s/job-1", "p", "lr-0.1", 1, 0)
    assert a.startswith("p/lr-0.1-") and len(a) == len("p/lr-0.1-") + 6
    assert a == child_run_id("local://s/job-1", "p", "lr-0.1", 1, 0)
    others = {
        child_run_id("local://s/job-2", "p", "lr-0.1", 1, 0),
        child_run_id("local://s/job-1", "p", "lr-0.1", 2, 0),
        child_run_id("local://s/job-1", "p", "lr-0.1", 1, 1),
    }
    assert a not in others and len(others) == 3
