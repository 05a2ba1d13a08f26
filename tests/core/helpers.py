"""Helpers for the core tests: retry policy without waits, child interpreters and their pipes."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from async_tracker import RetryPolicy

REPO = Path(__file__).resolve().parents[2]

# Retries without waiting; a parked lane waits for flush()/close(), not for its cooldown.
FAST_RETRY = RetryPolicy(
    max_attempts=3, initial_backoff_s=0, max_backoff_s=0, jitter_s=0, cooldown_s=3600
)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a server a test starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(
    condition: Callable[[], bool], what: str = "the condition", timeout: float = 30.0
) -> None:
    """Waits for state that another thread produces and no event announces (a counter of
    ``status()``, the thread pool's queues), polling it: the deadline only bounds a wait for
    something that is due, it is never reached when all is well. AssertionError naming
    ``what`` if the condition does not hold by then."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {timeout} s: {what}")
        time.sleep(0.005)


def python_env(**extra: str) -> dict[str, str]:
    """The environment of a child interpreter that imports this checkout and ``tests``."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("TORCHX_", "ASYNC_TRACKER_"))
    }
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTHONUNBUFFERED"] = "1"
    # A child that hangs is dumped (every thread's traceback) by the SIGABRT Child sends it.
    env["PYTHONFAULTHANDLER"] = "1"
    env.update(extra)
    return env


class Child:
    """``python -c script args...`` (or ``python script.py args...`` for a Path) with pipes,
    read line by line with deadlines (select on the pipe: the test waits for what the child
    says, never for a fixed time).

    A child that waits to be signalled idles in ``time.sleep`` calls, never in
    ``signal.pause()``: CPython runs a Python signal handler only between bytecodes, and a
    signal whose C handler ran after the last check (the main thread waiting for the GIL
    just before the call, say) leaves ``pause()`` waiting for a second signal, forever."""

    def __init__(self, script: str | Path, *args: str, **env: str) -> None:
        command = [str(script)] if isinstance(script, Path) else ["-c", script]
        self.proc = subprocess.Popen(
            [sys.executable, *command, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=REPO,
            env=python_env(**env),
        )
        assert self.proc.stdout is not None
        self._fd = self.proc.stdout.fileno()
        self._buf = b""

    def readline(self, timeout: float = 20.0) -> str:
        """The child's next stdout line; AssertionError (with its stderr) if none comes."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._fd], [], [], max(0.0, left))
            if not ready:
                message = f"no line from the child in {timeout} s; {self.dump()}"
                raise AssertionError(message)
            chunk = os.read(self._fd, 65536)
            if not chunk:
                raise AssertionError(f"the child closed stdout early; {self.stderr()}")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode()

    def wait(self, timeout: float = 20.0) -> int:
        """The exit code; AssertionError if the child is still alive after ``timeout``."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            message = f"the child did not exit in {timeout} s; {self.dump()}"
            raise AssertionError(message) from None

    def dump(self) -> str:
        """What a hung child and its own children (a pool's workers) were doing, then kills
        them: each thread's signal mask and pending signals (from /proc, where there is one),
        and each thread's traceback (SIGABRT makes their faulthandler print them)."""
        tree = _descendants(self.proc.pid)
        masks = [mask for pid in [self.proc.pid, *tree] for mask in _signal_masks(pid)]
        for pid in [*reversed(tree), self.proc.pid]:  # the workers first: the parent waits
            try:
                os.kill(pid, signal.SIGABRT)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.kill()
        for pid in tree:  # a descendant that survived its SIGABRT keeps the stderr pipe open
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return "threads:\n" + "\n".join(masks) + "\n" + self.stderr()

    def stderr(self, timeout: float = 10.0) -> str:
        """What the child wrote to stderr, once it has exited. Read until the pipe's end or
        ``timeout``: a process it started may still hold the pipe open."""
        if self.proc.poll() is None:
            return "stderr: (child still running)"
        assert self.proc.stderr is not None
        fd, data = self.proc.stderr.fileno(), b""
        deadline = time.monotonic() + timeout
        while select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            data += chunk
        return "stderr:\n" + data.decode(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        self.kill()
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid``, parents before their children (from /proc; none where
    there is no /proc)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            ppid = int(stat.read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parents.setdefault(ppid, []).append(int(stat.parent.name))
    tree = list(parents.get(pid, []))
    for parent in tree:  # breadth first: the list grows as the loop walks it
        tree.extend(parents.get(parent, []))
    return tree


def thread_status(pid: int | str, tid: int | str) -> dict[str, str]:
    """A thread's fields in Linux's /proc (``SigBlk``: its blocked signals, in hex); OSError
    if the thread is gone or there is no /proc."""
    text = Path(f"/proc/{pid}/task/{tid}/status").read_text()
    return {key: value.strip() for key, _, value in (x.partition(":") for x in text.splitlines())}


def _signal_masks(pid: int) -> list[str]:
    """A line per thread of ``pid``: its name, blocked, pending and caught signals."""
    lines = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
        try:
            fields = thread_status(pid, task.name)
        except OSError:  # the thread ended meanwhile
            continue
        keys = ("Name", "SigBlk", "SigPnd", "ShdPnd", "SigCgt")
        values = "  ".join(f"{k}={fields.get(k, '?')}" for k in keys)
        lines.append(f"pid {pid} thread {task.name}: {values}")
    return lines
