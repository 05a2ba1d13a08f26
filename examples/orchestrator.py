"""An asyncio orchestrator: a learning-rate sweep whose trials run concurrently as tracked jobs.

Run it from the repository root:  python examples/orchestrator.py [--dir tracker_runs]

The sweep is a run of its own. Each trial is a child process launched with
`async-tracker run --parent-run-id <sweep>`, which gives it TORCHX_JOB_ID, the trackers of
.torchxconfig and TORCHX_PARENT_RUN_ID: the trial's `AppRun.run_from_env()` records the sweep
as its parent, and the store keeps the lineage both ways. The orchestrator logs its progress
from the event loop (writes never block it), then prints the lineage tree.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import os
import secrets
import subprocess
import sys
from pathlib import Path

from async_tracker import AppRun
from async_tracker.backend.fsspec import create
from async_tracker.init_run import store_dir


def write_torchxconfig(store: Path) -> Path:
    """A .torchxconfig naming the fsspec tracker, as a project would keep next to its code."""
    store.mkdir(parents=True, exist_ok=True)
    fsspec_cfg = store / "fsspec.cfg"
    fsspec_cfg.write_text(f"protocol=file\nroot_path={store}\n")
    torchxconfig = store / ".torchxconfig"
    torchxconfig.write_text(
        f"[torchx:tracker]\nfsspec =\n\n[tracker:fsspec]\nconfig = {fsspec_cfg}\n"
    )
    return fsspec_cfg


async def trial(sweep: AppRun, index: int, lr: float, steps: int) -> dict[str, float | str]:
    """One trial: `async-tracker run --parent-run-id SWEEP -- python orchestrator.py --trial`."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "async_tracker", "run",
        "--name", f"trial{index}", "--parent-run-id", sweep.id, "--",
        sys.executable, __file__, "--trial", "--lr", str(lr), "--steps", str(steps),
        stdout=subprocess.PIPE,
    )  # fmt: skip
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"trial {index} (lr={lr}) exited with code {proc.returncode}")
    result: dict[str, float | str] = json.loads(out)
    return result


async def sweep(store: Path, trials: int, steps: int) -> tuple[str, list[str]]:
    fsspec_cfg = write_torchxconfig(store)
    # The trials' launcher reads this file (torchx's TORCHXCONFIG variable), not variables a
    # shell may have left set.
    os.environ["TORCHXCONFIG"] = str(store / ".torchxconfig")
    os.environ.pop("TORCHX_TRACKERS", None)
    lrs = [0.3 / 2**i for i in range(trials)]
    sweep_id = f"local://examples/sweep-{secrets.token_hex(3)}"
    async with AppRun(sweep_id, [create(str(fsspec_cfg))]) as run:
        run.add_metadata(kind="lr-sweep", lrs=lrs, steps=steps)
        tasks = [asyncio.create_task(trial(run, i, lr, steps)) for i, lr in enumerate(lrs)]
        results = []
        for done, next_result in enumerate(asyncio.as_completed(tasks), 1):
            result = await next_result
            results.append(result)
            print(f"trial {result['run_id']}: lr={result['lr']:g} loss={result['loss']:.4f}")
            run.log_metric("trials_done", done, step=done)  # returns at once, no I/O here
        best = min(results, key=lambda r: float(r["loss"]))
        run.add_metadata(best_run=best["run_id"], best_lr=best["lr"], best_loss=best["loss"])
        run.add_artifact("best", str(best["run_id"]), {"loss": best["loss"]})
    # Leaving `async with` awaited aclose(): everything is in the store.
    return sweep_id, [str(r["run_id"]) for r in results]


def train_trial(lr: float, steps: int) -> None:
    """A trial's job: plain torchx tracker code, configured by `async-tracker run`."""
    run = AppRun.run_from_env()
    run.add_metadata(lr=lr)
    loss = 2.0
    for step in range(steps):
        loss = loss * (1 - lr * 0.05) + 0.01 * math.sin(step)  # stand-in for training
        run.log_metric("loss", loss, step=step)
    run.close()
    print(json.dumps({"run_id": run.id, "lr": lr, "loss": loss}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dir",
        default=store_dir(),
        help="where the runs are stored (default: $ASYNC_TRACKER_DIR, else ./tracker_runs)",
    )
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--trial", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--lr", type=float, default=0.1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trial:
        train_trial(args.lr, args.steps)
        return
    store = Path(args.dir).resolve()
    sweep_id, trial_ids = asyncio.run(sweep(store, args.trials, args.steps))
    commands = [["lineage", sweep_id], ["list", "metadata", sweep_id]]
    if importlib.util.find_spec("matplotlib") is not None:  # the plot extra
        plot = ["plot", *sorted(trial_ids), "--metric", "loss", "-o", str(store / "sweep.png")]
        commands.append(plot)
    for cmd in commands:
        print(f"\n$ async-tracker {' '.join(cmd)}", flush=True)
        subprocess.run([sys.executable, "-m", "async_tracker", *cmd], check=True)


if __name__ == "__main__":
    main()
