"""A training loop that records its run to a local directory, then shows what it recorded.

Run it from the repository root:  python examples/train_loop.py [--dir tracker_runs]

It configures the tracker the way torchx's runner does (TORCHX_* variables), so the loop
itself is plain torchx tracker code with one import changed.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from async_tracker import AppRun


def configure(store: Path) -> str:
    """What `torchx run` (or `async-tracker run`) would set up: a job id and a tracker."""
    store.mkdir(parents=True, exist_ok=True)
    config = store / "fsspec.cfg"
    config.write_text(f"protocol=file\nroot_path={store / 'runs'}\n")
    run_id = f"local://examples/train-{int(time.time())}"
    os.environ.setdefault("TORCHX_JOB_ID", run_id)
    os.environ.setdefault("TORCHX_TRACKERS", "fsspec")
    os.environ.setdefault("TORCHX_TRACKER_FSSPEC_CONFIG", str(config))
    return str(config)


def train(steps: int) -> None:
    run = AppRun.run_from_env()
    run.add_metadata(model="mlp", lr=0.05, batch_size=64, seed=0)
    rng = random.Random(0)
    loss = 2.5
    for step in range(steps):
        # Stand-in for a forward/backward pass.
        loss *= 0.997 + rng.uniform(-0.002, 0.002)
        run.log_metrics({"loss": loss, "accuracy": 1 - math.exp(-step / 300)}, step=step)
        if step % 500 == 499:
            run.add_artifact("checkpoint", f"/checkpoints/step-{step}.pt", {"step": step})
    run.add_metadata(final_loss=round(loss, 4))
    report = run.close()
    print(f"run {run.id}: {report.delivered} records delivered, ok={report.ok}\n")


def show(config: str, run_id: str) -> None:
    for args in (
        ["list", "metadata", run_id],
        ["list", "artifacts", run_id],
        ["list", "metrics", run_id],
    ):
        cmd = [sys.executable, "-m", "async_tracker", "--tracker", "fsspec", "--config", config, *args]
        print("$ async-tracker " + " ".join(args))
        subprocess.run(cmd, check=True)
        print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default="tracker_runs", help="where the runs are stored")
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    config = configure(Path(args.dir).resolve())
    train(args.steps)
    show(config, os.environ["TORCHX_JOB_ID"])


if __name__ == "__main__":
    main()
