"""async_tracker beside the tools its users would otherwise pick, on one workload, in one run.

    python -m benchmarks.bench_peers --install          # first time: the peers' venvs
    python -m benchmarks.bench_peers [--steps 25000] [--only TOOL,...] [--json F] [--png F]

Tools, each in a process of its own (``benchmarks/peer_worker.py``):

* ``deque``: a bare ``deque.append`` of the same tuple, the baseline of every ratio;
* ``async_tracker-fsspec``: ``AppRun.log_metric`` over the fsspec backend, on local disk;
* ``async_tracker-mlflow``: ``AppRun.log_metric`` over the MLflow backend, local server;
* ``torchx-fsspec``: torchx's own ``AppRun`` over its ``FsspecTracker`` (synchronous; torchx
  has no metrics, so a scalar is an ``add_metadata`` key);
* ``mlflow-async``: ``mlflow.log_metric(..., synchronous=False)``, 1 s buffering, same server;
* ``tensorboardX``: ``SummaryWriter.add_scalar``;
* ``wandb-offline``: ``wandb.log`` in offline mode.

The peers run from virtual environments under ``.venvs/peers/`` that ``--install`` creates
from PyPI (they are never dependencies of async_tracker); ours run in this interpreter.

Workload: ``--steps`` steps (25k) of 4 scalars (100k records). Figures per tool:

* median and p99 cost of one call in the caller's thread (each call timed on its own);
* time from the first call until everything is durable (the tool's close/finish/flush);
* peak memory: the peak RSS of the worker's whole process tree (wandb's service included),
  sampled every 5 ms, less the RSS of the bare interpreter before it imported the tool: what
  the tool costs a job in all (its modules, threads, services and buffers). Also, apart:
  the growth from the moment the tool was set up (its buffers alone);
* the slowdown of a CPU-bound loop (about 200 us of pure-Python work per step) against the
  same loop without logging, run in the same process before the tool is imported and after
  it has made everything durable;

each also as a ratio to ``deque``'s figure from the same run. A table goes to stdout (and
``--json``), a chart to ``--png`` (default ``benchmarks/peers.png``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "benchmarks" / "peer_worker.py"
VENVS = REPO / ".venvs" / "peers"

# tool -> (venv directory, what pip installs there). Versions pinned so that a rerun
# measures the same code; ours run in this interpreter.
PEERS: dict[str, tuple[str, list[str]]] = {
    "torchx-fsspec": ("torchx", ["torchx==0.7.0", "fsspec==2026.9.0"]),
    "mlflow-async": ("mlflow", ["mlflow==3.17.2"]),
    "tensorboardX": ("tensorboardx", ["tensorboardX==2.6.5"]),
    "wandb-offline": ("wandb", ["wandb==0.31.0"]),
}
OURS = ("deque", "async_tracker-fsspec", "async_tracker-mlflow")
TOOLS = (*OURS, *PEERS)
NEEDS_SERVER = {"async_tracker-mlflow", "mlflow-async"}
FIGURES = (  # key, label, unit
    ("median_call_us", "median cost per call", "µs"),
    ("p99_call_us", "p99 cost per call", "µs"),
    ("slowdown_pct", "CPU-bound loop slowdown", "%"),
    ("durable_s", "time until durable", "s"),
    ("cost_mb", "peak memory", "MB"),
)
PAGE = os.sysconf("SC_PAGE_SIZE")


def python_of(tool: str) -> Path:
    if tool in PEERS:
        return VENVS / PEERS[tool][0] / "bin" / "python"
    return Path(sys.executable)


def install(tools: list[str]) -> None:
    for tool in tools:
        if tool not in PEERS:
            continue
        venv, requirements = PEERS[tool]
        path = VENVS / venv
        print(f"installing {tool} into {path}: {' '.join(requirements)}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        pip = [str(path / "bin" / "python"), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, "-U", "pip"], check=True)
        subprocess.run([*pip, *requirements], check=True)


# -- memory of a process tree -----------------------------------------------------------------


def tree_rss(pid: int) -> int:
    """Bytes resident in ``pid`` and all its descendants (0 once it has exited)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * PAGE
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
    return total


class Sampler:
    """Samples a process tree's RSS every 5 ms from a thread of the harness (not of the
    measured process). ``start()``: the bare interpreter's RSS; ``setup()``: the RSS once
    the tool is ready, the base of the growth."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.bare = self.base = self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def start(self) -> None:
        self.bare = tree_rss(self.pid)

    def setup(self) -> None:
        self.base = tree_rss(self.pid)

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, tree_rss(self.pid))

    def stop(self) -> tuple[float, float]:
        """(MB the tool costs in all, MB of growth after its setup)."""
        self._stop.set()
        self._thread.join()
        return (self.peak - self.bare) / 2**20, (self.peak - self.base) / 2**20


# -- one tool, one phase ------------------------------------------------------------------------


def run_worker(tool: str, phase: str, steps: int, work: int, url: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix=f"bench-{tool}-") as out:
        cmd = [str(python_of(tool)), str(WORKER), tool, phase, out, str(steps), str(work), url]
        env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_SILENT": "true"}
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, cwd=out)
        assert proc.stdout is not None
        sampler = Sampler(proc.pid)
        result: dict[str, float] = {}
        for line in proc.stdout:
            if line.strip() == "start":
                sampler.start()
            elif line.strip() == "setup":
                sampler.setup()
            elif line.startswith("{"):
                result = json.loads(line)
        cost, growth = sampler.stop()
        if proc.wait() != 0 or not result:
            raise SystemExit(f"{tool} {phase}: worker failed (exit {proc.returncode})")
        if phase == "calls":
            result["cost_mb"], result["growth_mb"] = cost, growth
        return result


def calibrate(target_us: float = 200.0) -> int:
    """Iterations of the worker's ``work()`` that take about ``target_us`` here."""
    sys.path.insert(0, str(WORKER.parent))
    from peer_worker import work

    n = 1000
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(200):
            work(n)
        per_call_us = (time.perf_counter() - start) / 200 * 1e6
        n = max(1, int(n * target_us / per_call_us))
    return n


# -- report -------------------------------------------------------------------------------------


def ratios(results: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Each figure over deque's. The loop's ratio is of loop times (1.00 = no slowdown)."""
    base = results["deque"]
    out: dict[str, dict[str, float]] = {}
    for tool, r in results.items():
        out[tool] = {
            key: (r[key] / base[key] if base[key] else float("nan"))
            for key, _, _ in FIGURES
            if key != "slowdown_pct"
        }
        out[tool]["loop_ratio"] = (1 + r["slowdown_pct"] / 100) / (1 + base["slowdown_pct"] / 100)
        out[tool]["growth_mb"] = r["growth_mb"] / max(base["growth_mb"], 0.1)
    return out


def table(results: dict[str, dict[str, float]], rel: dict[str, dict[str, float]]) -> str:
    head = (
        "| tool | median per call | p99 per call | CPU-bound loop slowdown | "
        "time until durable | peak memory | of which growth while logging |"
    )
    lines = [head, "|---|---|---|---|---|---|---|"]
    for tool, r in results.items():
        x = rel[tool]
        lines.append(
            f"| {tool} "
            f"| {r['median_call_us']:.2f} µs ({x['median_call_us']:.1f}x) "
            f"| {r['p99_call_us']:.2f} µs ({x['p99_call_us']:.1f}x) "
            f"| {r['slowdown_pct']:+.1f}% ({x['loop_ratio']:.3f}x) "
            f"| {r['durable_s']:.2f} s ({x['durable_s']:.0f}x) "
            f"| {r['cost_mb']:.1f} MB ({x['cost_mb']:.1f}x) "
            f"| {r['growth_mb']:.1f} MB ({x['growth_mb']:.1f}x) |"
        )
    return "\n".join(lines)


def chart(results: dict[str, dict[str, float]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (*FIGURES, ("growth_mb", "memory growth while logging", "MB"))
    tools = [t for t in results if t != "deque"]
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    for ax, (key, label, unit) in zip(axes.flat, panels):
        values = [results[t][key] for t in tools]
        colors = ["tab:green" if t.startswith("async_tracker") else "tab:gray" for t in tools]
        bars = ax.barh(tools, values, color=colors)
        ax.bar_label(bars, labels=[f"{v:.3g}" for v in values], fontsize=7, padding=2)
        if key in ("median_call_us", "p99_call_us", "durable_s"):
            ax.set_xscale("log")
        ax.axvline(results["deque"][key], color="tab:blue", linestyle="--", linewidth=1)
        ax.set_title(f"{label} ({unit})", fontsize=9)
        ax.invert_yaxis()
        ax.margins(x=0.15)
        ax.tick_params(labelsize=8)
    fig.suptitle(f"{title}\nlower is better; dashed line: bare deque.append", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=25_000, help="steps of 4 scalars")
    parser.add_argument("--only", help="comma-separated tools (deque always runs)")
    parser.add_argument("--install", action="store_true", help="create the peers' venvs")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--png", type=Path, default=REPO / "benchmarks" / "peers.png")
    parser.add_argument("--replot", type=Path, help="redraw the chart from a --json file")
    args = parser.parse_args(argv)
    if args.replot:
        saved = json.loads(args.replot.read_text())
        title = f"{saved['steps'] * 4} records, {saved['machine']}"
        chart(saved["results"], args.png, title)
        return 0
    tools = list(TOOLS) if not args.only else ["deque", *args.only.split(",")]
    unknown = set(tools) - set(TOOLS)
    if unknown:
        parser.error(f"unknown tools {sorted(unknown)}; known: {', '.join(TOOLS)}")
    if args.install:
        install(tools)
    missing = [t for t in tools if not python_of(t).exists()]
    if missing:
        parser.error(f"no venv for {missing}: run with --install first")

    machine = (
        f"{os.cpu_count()} CPUs ({_cpu_model()}), Python {platform.python_version()}, "
        f"{platform.platform()}"
    )
    work = calibrate()
    print(f"machine: {machine}\n{args.steps} steps x 4 scalars; CPU-bound step: "
          f"work({work}), about 200 us", flush=True)
    server = None
    if NEEDS_SERVER & set(tools):
        from tests.mlflow.server import MlflowServer

        server_dir = tempfile.mkdtemp(prefix="bench-peers-mlflow-")
        server = MlflowServer(Path(server_dir))
        server.start()
    results: dict[str, dict[str, float]] = {}
    try:
        for tool in tools:
            url = server.url if server is not None else ""
            calls = run_worker(tool, "calls", args.steps, work, url)
            loop = run_worker(tool, "loop", args.steps, work, url)
            results[tool] = {**calls, **loop}
            r = results[tool]
            print(
                f"  {tool:<22} median {r['median_call_us']:8.2f} us  p99 "
                f"{r['p99_call_us']:9.2f} us  durable {r['durable_s']:7.2f} s  memory "
                f"{r['cost_mb']:6.1f} MB (+{r['growth_mb']:.1f})  loop {r['slowdown_pct']:+6.1f}%",
                flush=True,
            )
    finally:
        if server is not None:
            server.stop()
    rel = ratios(results)
    print()
    print(table(results, rel))
    chart(results, args.png, f"{args.steps * 4} records, {machine}")
    print(f"\nchart: {args.png}")
    if args.json:
        args.json.write_text(json.dumps(
            {"machine": machine, "steps": args.steps, "work": work, "results": results,
             "ratios_to_deque": rel, "versions": versions(tools)}, indent=2))
    return 0


def versions(tools: list[str]) -> dict[str, Any]:
    return {tool: PEERS[tool][1] for tool in tools if tool in PEERS}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


if __name__ == "__main__":
    sys.exit(main())
