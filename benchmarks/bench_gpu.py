"""What logging tensor metrics costs a training loop, on a GPU (or, without one, the CPU).

Three MLPs (small: launch-bound; medium; large) train with SGD; every step computes four
scalar tensors (loss, the mean and spread of the output, a gradient norm) in every variant,
and the variants differ only in what they do with them:

* ``none``: nothing (the baseline);
* ``tensors``: ``run.log_metrics(tensors, step)`` into an ``async_tracker.init()`` run (a
  local store): on a GPU, copied to pinned memory with an event, read on the tracker loop;
* ``float``: ``run.log_metrics({k: float(v)}, step)``: a device sync per step;
* ``tensorboard``: ``SummaryWriter.add_scalar`` for each (its ``.item()`` syncs), when
  ``torch.utils.tensorboard`` works here.

Variants run in alternated rounds, in a random order each round, each round ending with a
device sync so that it includes its GPU work; a variant's figure is the median over rounds of
its round time over the same round's ``none`` time, with the 25th and 75th percentiles. Run
from the repository root::

    python -m benchmarks.bench_gpu            # about a minute, on a GPU or on 2 CPU cores
    python -m benchmarks.bench_gpu --quick    # smoke run
    python -m benchmarks.bench_gpu --json gpu.json

Needs torch (``pip install 'async-tracker[torch]'``); the last variant needs tensorboard.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

try:
    import torch
except ImportError:  # pragma: no cover - said to the user
    raise SystemExit("bench_gpu needs torch: pip install 'async-tracker[torch]'") from None

import async_tracker

perf = time.perf_counter


@dataclass(frozen=True)
class Size:
    name: str
    width: int
    depth: int
    batch: int
    steps: int  # per round


# Small is launch-bound (tiny kernels: the CPU's launches are the step time), large is
# compute-bound. The CPU sizes are smaller: two cores, not thousands.
GPU_SIZES = [
    Size("small", 256, 4, 64, 50),
    Size("medium", 2048, 4, 512, 20),
    Size("large", 8192, 4, 1024, 5),
]
CPU_SIZES = [
    Size("small", 64, 4, 32, 50),
    Size("medium", 256, 4, 128, 20),
    Size("large", 512, 4, 256, 5),
]

Metrics = dict[str, torch.Tensor]
Logger = Callable[[Metrics, int], None]


class Model:
    def __init__(self, size: Size, device: torch.device) -> None:
        layers: list[torch.nn.Module] = []
        for _ in range(size.depth - 1):
            layers += [torch.nn.Linear(size.width, size.width), torch.nn.ReLU()]
        layers.append(torch.nn.Linear(size.width, size.width))
        self.net = torch.nn.Sequential(*layers).to(device)
        self.opt = torch.optim.SGD(self.net.parameters(), lr=1e-3)
        gen = torch.Generator(device="cpu").manual_seed(0)
        self.x = torch.randn(size.batch, size.width, generator=gen).to(device)
        self.y = torch.randn(size.batch, size.width, generator=gen).to(device)
        self.last = self.net[-1]

    def step(self) -> Metrics:
        self.opt.zero_grad(set_to_none=True)
        out = self.net(self.x)
        loss = torch.nn.functional.mse_loss(out, self.y)
        loss.backward()
        self.opt.step()
        assert isinstance(self.last, torch.nn.Linear) and self.last.weight.grad is not None
        return {
            "loss": loss.detach(),
            "out_mean": out.detach().mean(),
            "out_std": out.detach().std(),
            "grad_norm": self.last.weight.grad.norm(),
        }


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextmanager
def loggers(tmp: str) -> Iterator[tuple[dict[str, Logger], list[Callable[[], object]], str]]:
    """The variants' loggers, what closes them, and why tensorboard is missing (or "")."""
    tensors_run = async_tracker.init("bench", "tensors", dir=os.path.join(tmp, "runs"))
    float_run = async_tracker.init("bench", "float", dir=os.path.join(tmp, "runs"))

    def log_tensors(metrics: Metrics, step: int) -> None:
        tensors_run.log_metrics(metrics, step=step)

    def log_float(metrics: Metrics, step: int) -> None:
        float_run.log_metrics({k: float(v) for k, v in metrics.items()}, step=step)

    variants: dict[str, Logger] = {
        "none": lambda metrics, step: None,
        "tensors": log_tensors,
        "float": log_float,
    }
    closers: list[Callable[[], object]] = [tensors_run.close, float_run.close]
    missing = ""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        missing = f"tensorboard variant skipped: {exc}"
    else:
        writer = SummaryWriter(os.path.join(tmp, "tb"))

        def log_tb(metrics: Metrics, step: int) -> None:
            for name, value in metrics.items():
                writer.add_scalar(name, value, step)

        variants["tensorboard"] = log_tb
        closers.append(writer.close)
    try:
        yield variants, closers, missing
    finally:
        for close in closers:
            close()


def measure(
    size: Size, device: torch.device, rounds: int, rng: random.Random, tmp: str
) -> dict[str, Any]:
    model = Model(size, device)
    for _ in range(10):  # warm up: kernels chosen, caches filled, allocator settled
        model.step()
    sync(device)
    with loggers(tmp) as (variants, closers, missing):
        steps = dict.fromkeys(variants, 0)
        times: dict[str, list[float]] = {name: [] for name in variants}
        for name, log in variants.items():  # each logger's first call (run start) untimed
            log(model.step(), steps[name])
            steps[name] += 1
        sync(device)
        for _ in range(rounds):
            order = list(variants)
            rng.shuffle(order)
            for name in order:
                log = variants[name]
                start = perf()
                for _ in range(size.steps):
                    log(model.step(), steps[name])
                    steps[name] += 1
                sync(device)
                times[name].append(perf() - start)
        start = perf()
        for close in closers[:2]:
            report = close()
            assert getattr(report, "ok", True), report
        close_s = perf() - start
    base = times["none"]
    out: dict[str, Any] = {
        "size": size.name,
        "step_ms": 1000 * statistics.median(base) / size.steps,
        "close_s": close_s,
        "missing": missing,
        "ratios": {},
    }
    for name, series in times.items():
        if name == "none":
            continue
        ratios = sorted(t / b for t, b in zip(series, base))
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        out["ratios"][name] = {"median": q[1], "p25": q[0], "p75": q[2]}
    return out


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return f"GPU {torch.cuda.get_device_name(device)}"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"CPU {cpu} ({os.cpu_count()} cores, {torch.get_num_threads()} torch threads)"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    parser.add_argument("--rounds", type=int, default=30, help="alternated rounds per size")
    parser.add_argument("--sizes", nargs="*", choices=["small", "medium", "large"])
    parser.add_argument("--quick", action="store_true", help="3 rounds: a smoke run")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--threads", type=int, default=1,
        help="torch's CPU threads on the CPU (default 1: spinning OpenMP threads on a shared "
        "machine make every figure noise)",
    )
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    want_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if want_cuda and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    device = torch.device("cuda" if want_cuda else "cpu")
    if not want_cuda:
        torch.set_num_threads(args.threads)
    rounds = 3 if args.quick else args.rounds
    sizes = [s for s in (GPU_SIZES if want_cuda else CPU_SIZES) if s.name in (args.sizes or s.name)]

    print(f"device: {describe_device(device)}")
    print(f"torch {torch.__version__}, Python {platform.python_version()}, {platform.platform()}")
    if hasattr(os, "getloadavg"):
        print("load average (other jobs on this machine): " + " ".join(
            f"{x:.1f}" for x in os.getloadavg()
        ))
    if not want_cuda:
        print(
            "no GPU here: running on the CPU, where every tensor is read at once (no device to "
            "wait for), so 'tensors' and 'float' do the same work; the GPU figures need a GPU"
        )
    print(f"{rounds} rounds per size; step time ratio to no logging: median [p25, p75]\n")
    rng = random.Random(args.seed)
    results = []
    with tempfile.TemporaryDirectory(prefix="async-tracker-bench-gpu-") as tmp:
        for size in sizes:
            result = measure(size, device, rounds, rng, os.path.join(tmp, size.name))
            results.append(result)
            cells = "  ".join(
                f"{name} {r['median']:.3f} [{r['p25']:.3f}, {r['p75']:.3f}]"
                for name, r in result["ratios"].items()
            )
            print(
                f"{size.name:<7} w={size.width:<5} step {result['step_ms']:8.3f} ms  {cells}"
                f"  (close {result['close_s']:.2f} s)"
            )
            if result["missing"]:
                print(f"        {result['missing']}")
            sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": describe_device(device), "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
