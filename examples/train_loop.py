"""A training loop that records its run to a local directory, then shows what it recorded.

Run it from the repository root:  python examples/train_loop.py [--dir tracker_runs]

It records to the store every `async-tracker` command reads when given no --store
($ASYNC_TRACKER_DIR, else ./tracker_runs), so `async-tracker list jobs` shows the run after.

It configures the tracker the way torchx's runner does (TORCHX_* variables), so the loop
itself is plain torchx tracker code with one import changed. Launched by
`async-tracker run -- python examples/train_loop.py`, it keeps the launcher's run id and trackers.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import random
import secrets
import subprocess
import sys
import time
from pathlib import Path

from async_tracker import AppRun
from async_tracker.init_run import store_dir


def configure(store: Path) -> None:
    """What `torchx run` (or `async-tracker run`) would set up: a job id and a tracker.
    The config file lives in the store, beside the runs (readers skip it)."""
    store.mkdir(parents=True, exist_ok=True)
    config = store / "fsspec.cfg"
    config.write_text(f"protocol=file\nroot_path={store}\n")
    run_id = f"local://examples/train-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
    os.environ.setdefault("TORCHX_JOB_ID", run_id)
    if "TORCHX_TRACKERS" not in os.environ:
        os.environ["TORCHX_TRACKERS"] = "fsspec"
        os.environ["TORCHX_TRACKER_FSSPEC_CONFIG"] = str(config)


def train(steps: int) -> str:
    run = AppRun.run_from_env()
    run.add_metadata(model="mlp", lr=0.05, batch_size=64, seed=0)
    rng = random.Random(0)
    loss = 2.5
    for step in range(steps):
        # Stand-in for a forward/backward pass.
        loss *= 0.997 + rng.uniform(-0.002, 0.002)
        # Returns at once: a background flusher writes the points in batches.
        run.log_metrics({"loss": loss, "accuracy": 1 - math.exp(-step / 300)}, step=step)
        if step % 500 == 499 or step == steps - 1:
            run.add_artifact("checkpoint", f"/checkpoints/step-{step}.pt", {"step": step})
    run.add_metadata(final_loss=round(loss, 4))
    report = run.close()
    print(f"run {run.id}: {report.delivered} records delivered, ok={report.ok}\n")
    return run.id


def async_tracker(*args: str) -> None:
    """`async-tracker ARGS`, configured by the TORCHX_* variables the job had."""
    print("$ async-tracker " + " ".join(args), flush=True)
    subprocess.run([sys.executable, "-m", "async_tracker", *args], check=True)
    print(flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dir",
        default=store_dir(),
        help="where the runs are stored (default: $ASYNC_TRACKER_DIR, else ./tracker_runs)",
    )
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    store = Path(args.dir).resolve()
    configure(store)
    run_id = train(args.steps)
    async_tracker("list", "metadata", run_id)
    async_tracker("list", "artifacts", run_id)
    async_tracker("list", "metrics", run_id)
    if importlib.util.find_spec("matplotlib") is not None:
        async_tracker("plot", run_id, "-o", str(store / "curves.png"))
    else:
        print("(pip install 'async-tracker[plot]' and `async-tracker plot` draws the curves)")


if __name__ == "__main__":
    main()
