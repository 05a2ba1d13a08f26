"""``run``: launch a local job with the tracker environment torchx's runner would give it.

    async-tracker run [--name NAME] [--parent-run-id ID] -- COMMAND ...

The job gets, as from ``torchx run`` on the local scheduler:

* ``TORCHX_JOB_ID=local://async_tracker/<name>-<unique suffix>``: the run id;
* ``TORCHX_TRACKERS=<name>,...`` and ``TORCHX_TRACKER_<NAME>_CONFIG`` from ``--tracker/--config``,
  else ``--store``, else ``.torchxconfig`` or ``TORCHX_*``, else the default store
  (``$ASYNC_TRACKER_DIR`` or ``./tracker_runs``) as the ``fsspec`` tracker;
* ``TORCHX_PARENT_RUN_ID`` from ``--parent-run-id``, else as inherited;
* ``ASYNC_TRACKER_FACTORY_<NAME>=module:factory`` for ``[torchx:tracker] name=module:factory``
  (torchx reads only the key; this keeps the name, which is the spool key, and the factory).

The run id goes to stderr, so the job's stdout stays its own. SIGINT and SIGTERM are passed on
to the job, and the exit code is the job's (128 + N when signal N ended it, as in shells).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import secrets
import shlex
import signal
import string
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePath
from types import FrameType
from typing import Any

from async_tracker.cli.common import CliError, StoreError, to_json, tracker_specs, warn
from async_tracker.config import TrackerSpec, configured_trackers, job_environ
from async_tracker.factory import ENV_TORCHX_JOB_ID, ENV_TORCHX_PARENT_RUN_ID
from async_tracker.init_run import store_dir

SCHEDULER = "local"
SESSION = "async_tracker"
SUFFIX_ALPHABET = string.ascii_lowercase + string.digits
SUFFIX_LEN = 10
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
NAME_MAX_LEN = 64
EXIT_NOT_EXECUTABLE = 126  # shell conventions
EXIT_NOT_FOUND = 127
EXIT_SIGNAL_BASE = 128
# The fsspec config file `run` writes into a local store for its job (torchx's runner passes
# a tracker's config as a file): the readers skip it.
STORE_CONFIG_FILE = "fsspec.cfg"


def default_name(command: Sequence[str]) -> str:
    """A job name from its command: ``python train.py`` -> ``train``, ``python -m pkg.mod``
    -> ``mod``, ``./run.sh`` -> ``run``."""
    words = list(command)
    name = PurePath(words[0]).name
    if name.startswith("python") and len(words) > 1:
        if words[1] == "-m" and len(words) > 2:
            name = words[2].rsplit(".", 1)[-1]
        elif not words[1].startswith("-"):
            name = PurePath(words[1]).name
    name = PurePath(name).stem or name
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-._")[:NAME_MAX_LEN]
    return name or "job"


def check_name(name: str) -> str:
    if not NAME_RE.fullmatch(name) or len(name) > NAME_MAX_LEN:
        raise CliError(
            f"--name {name!r}: use letters, digits, '_', '.' and '-' (at most {NAME_MAX_LEN}), "
            "starting with a letter or digit"
        )
    return name


def make_run_id(name: str) -> str:
    """``local://async_tracker/<name>-<suffix>``, torchx's app handle for a local job."""
    suffix = "".join(secrets.choice(SUFFIX_ALPHABET) for _ in range(SUFFIX_LEN))
    return f"{SCHEDULER}://{SESSION}/{name}-{suffix}"


def store_spec(store: str | None) -> TrackerSpec:
    """The ``fsspec`` tracker over ``store`` (default: ``$ASYNC_TRACKER_DIR``, else
    ``./tracker_runs``, where ``init()`` writes and every command reads), configured by an
    fsspec config file as torchx's runner passes it: ``fsspec.cfg`` in a local store (the
    readers skip it), else one per URL under ``~/.cache/async_tracker/stores``."""
    url = store_dir(store)
    if "://" not in url:
        root = Path(url).expanduser().resolve()
        try:
            root.mkdir(parents=True, exist_ok=True)
            config = root / STORE_CONFIG_FILE
            config.write_text(f"protocol=file\nroot_path={root}\n", encoding="utf-8")
        except OSError as exc:
            raise StoreError(f"cannot use the store {url}: {exc.strerror or exc}") from exc
    else:
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        config = cache / "async_tracker" / "stores" / (
            hashlib.sha256(url.encode()).hexdigest()[:16] + ".cfg"
        )
        try:
            config.parent.mkdir(parents=True, exist_ok=True)
            config.write_text(f"url={url}\n", encoding="utf-8")
        except OSError as exc:
            raise StoreError(f"cannot write {config}: {exc.strerror or exc}") from exc
    return TrackerSpec("fsspec", "fsspec", str(config))


def job_specs(args: argparse.Namespace) -> list[TrackerSpec]:
    """The job's trackers: ``--tracker``/``--config``, else ``--store``, else those
    configured the torchx way, else the default store."""
    store = getattr(args, "store", None)
    if args.tracker or args.config:
        return tracker_specs(args)
    if store is None:
        specs = configured_trackers()
        if specs:
            return specs
    return [store_spec(store)]


def job_env(
    args: argparse.Namespace, run_id: str, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The job's variables that differ from ours."""
    base = os.environ if environ is None else environ
    specs = job_specs(args)
    for spec in specs:
        # Import the factory (without calling it) so that a typo fails here, with exit code 2,
        # not in the job after it started.
        spec.load()
    env = job_environ(specs)
    env[ENV_TORCHX_JOB_ID] = run_id
    # torchx: the parent comes from the launcher's TORCHX_PARENT_RUN_ID, or the argument.
    # Here the argument wins: it is the more explicit of the two.
    parent = args.parent_run_id or base.get(ENV_TORCHX_PARENT_RUN_ID)
    if parent:
        env[ENV_TORCHX_PARENT_RUN_ID] = parent
    return env


def _terminal_sends_sigint() -> bool:
    """True when a Ctrl-C would reach the job without us: we are the foreground job of a
    terminal, so the terminal signals our whole process group, the job included."""
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp():
                return True
        except OSError:
            continue
    return False


class SignalForwarder:
    """Passes SIGINT and SIGTERM on to the job while it runs, then restores our handlers.

    Installed before the job starts, so no signal finds the launcher unprotected (which
    would kill it and orphan the job): a signal that comes before the job exists cancels it.

    The job stays in our process group, so that it keeps the terminal (reads stdin, gets
    Ctrl-Z). A Ctrl-C therefore reaches it straight from the terminal; forwarding that SIGINT
    too would deliver it twice (a second KeyboardInterrupt in the job's clean-up), so a
    SIGINT is forwarded only when no terminal sent it to the job as well.
    """

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.early: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> SignalForwarder:
        # Python sets signal handlers only on the main thread. From another thread (main()
        # called by a worker) the job gets no forwarded signal, as with subprocess.run.
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._forward) for sig in FORWARDED_SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _forward(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and _terminal_sends_sigint():
            return
        if self.proc is None:
            self.early = signum
        else:
            # send_signal() does nothing once the job has been reaped: never a reused pid.
            self.proc.send_signal(signum)


def launch(command: Sequence[str], env: Mapping[str, str]) -> int:
    """Runs ``command`` with ``env`` added to ours, forwarding signals; its exit code."""
    with SignalForwarder() as forwarder:
        if forwarder.early is not None:
            return EXIT_SIGNAL_BASE + forwarder.early
        try:
            forwarder.proc = proc = subprocess.Popen(list(command), env={**os.environ, **env})
        except FileNotFoundError as exc:
            warn(f"cannot run {command[0]!r}: {exc.strerror}")
            return EXIT_NOT_FOUND
        except PermissionError as exc:
            warn(f"cannot run {command[0]!r}: {exc.strerror}")
            return EXIT_NOT_EXECUTABLE
        if forwarder.early is not None:  # came while the job was being created
            proc.send_signal(forwarder.early)
        code = proc.wait()
    return EXIT_SIGNAL_BASE - code if code < 0 else code


def cmd_run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise CliError("run needs a command: async-tracker run [--name NAME] -- COMMAND ...")
    name = check_name(args.name) if args.name else default_name(command)
    run_id = make_run_id(name)
    env = job_env(args, run_id)
    if args.dry_run:
        if args.json:
            print(to_json({"run_id": run_id, "env": env, "command": command}))
        else:
            for key in sorted(env):
                print(f"{key}={shlex.quote(env[key])}")
            print(shlex.join(command))
        return 0
    if args.json:
        print(
            to_json({"run_id": run_id, "command": command}, indent=None),
            file=sys.stderr,
            flush=True,
        )
    else:
        warn(f"run {run_id}")
    code = launch(command, env)
    if args.json:
        print(
            to_json({"run_id": run_id, "exit_code": code}, indent=None), file=sys.stderr, flush=True
        )
    elif code:
        warn(f"run {run_id} exited with code {code}")
    return code


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    p = sub.add_parser(
        "run",
        parents=[common],
        help="launch a local job with the tracker environment set, as torchx's runner does",
        description=(
            "Launches COMMAND with TORCHX_JOB_ID, TORCHX_TRACKERS, TORCHX_TRACKER_<NAME>_CONFIG "
            "and TORCHX_PARENT_RUN_ID set from the configured trackers. Prints the run id to "
            "stderr, forwards SIGINT and SIGTERM, and exits with the job's exit code."
        ),
    )
    p.add_argument("--name", help="job name, the run id's prefix (default: from COMMAND)")
    p.add_argument("--parent-run-id", help="run to record as the job's parent")
    p.add_argument(
        "--dry-run", action="store_true", help="print the job's variables and command, run nothing"
    )
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")
    p.set_defaults(func=cmd_run)
