"""System metrics: CPU, memory and GPU use, sampled on the tracker loop, logged under ``system/``.

``AppRun(..., system_metrics=10.0)`` (or ``ASYNC_TRACKER_SYSTEM_METRICS=10``) samples every 10
seconds. The readings are blocking calls (psutil reads ``/proc``, NVML asks the driver), so
they run in a worker thread (:func:`~async_tracker.runtime.process.run_blocking`) between sleeps on
the tracker loop: neither the training loop nor the flusher waits for them. Each sample is
one ``log_metrics`` call; steps count samples.

Names, in a process without a rank::

    system/cpu_percent            system/memory_used_gb      system/memory_percent
    system/process_cpu_percent    system/process_rss_gb
    system/gpu0/utilization       system/gpu0/memory_used_gb system/gpu0/memory_percent
    system/gpu0/power_w           system/gpu0/temperature_c

Ranks. A run shared by the ranks of a distributed job gets every rank's samples: a process
started with ``RANK`` (or only ``LOCAL_RANK``) set, as torchrun and torchx set them, writes
``system/rank<RANK>/...`` instead (``system/rank3/cpu_percent``), and records where that rank
ran in the metadata key ``system/rank<RANK>`` (host, pid, local rank, GPUs). A rank with a
``LOCAL_RANK`` samples the one GPU of that index (among ``CUDA_VISIBLE_DEVICES`` when it lists
indexes), so that eight ranks on a node give eight GPUs, not sixty-four. A path segment,
not a suffix: MLflow allows ``/`` in metric names, not ``@`` or ``#``.

GPU readings need ``nvidia-ml-py`` (``pynvml``) and a driver; without either there are none.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import socket
from collections.abc import Callable, Mapping
from typing import Any

from async_tracker.clock import Clock
from async_tracker.errors import TrackerClosedError
from async_tracker.runtime.process import run_blocking

logger = logging.getLogger(__name__)

GB = 1e9
# What the readings talk to, for the worker threads' limits (async_tracker.runtime.threads).
ENDPOINT = "system metrics (psutil, NVML)"


class Rank:
    """Where a process stands in its job: ``RANK`` and ``LOCAL_RANK`` (None when unset)."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.rank = _int_env(env, "RANK")
        self.local_rank = _int_env(env, "LOCAL_RANK")
        if self.rank is None:
            self.rank = self.local_rank  # one node, a launcher that sets only LOCAL_RANK
        self.visible = _visible_devices(env.get("CUDA_VISIBLE_DEVICES"))

    @property
    def prefix(self) -> str:
        """The start of every metric name of this process: ``system/`` or
        ``system/rank<RANK>/``."""
        return "system/" if self.rank is None else f"system/rank{self.rank}/"

    def gpus(self, count: int) -> list[int]:
        """The NVML indexes this process reports on, of ``count`` GPUs."""
        indexes = [i for i in self.visible if i < count] if self.visible is not None else None
        if indexes is None:
            indexes = list(range(count))
        if self.local_rank is None:
            return indexes
        return indexes[self.local_rank : self.local_rank + 1]


def _int_env(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a rank (an integer)") from None


def _visible_devices(raw: str | None) -> list[int] | None:
    """``CUDA_VISIBLE_DEVICES`` as NVML indexes, when it lists indexes (not UUIDs)."""
    if raw is None or not raw.strip():
        return None
    try:
        return [int(part) for part in raw.split(",") if part.strip()]
    except ValueError:
        return None  # UUIDs or MIG names: report every GPU


class Sampler:
    """Takes readings of this machine (and process). Blocking: call it off the loop.

    ``psutil`` is required (checked at once, on the caller's thread); ``nvml`` is the
    ``pynvml`` module (found when installed and a driver answers), or a stand-in for tests.
    The driver is first asked at the first reading, off the caller's thread.
    """

    def __init__(self, rank: Rank | None = None, nvml: Any | None = None) -> None:
        try:
            import psutil
        except ImportError:
            raise ImportError(
                "system metrics need psutil: pip install 'async-tracker[system]'"
            ) from None
        self.rank = rank or Rank()
        self._psutil = psutil
        self._nvml: Any = nvml
        self._process: Any = None  # set by _open, with the GPUs
        self._gpus: list[tuple[int, Any]] = []

    def _open(self) -> None:
        if self._process is not None:
            return
        self._process = self._psutil.Process()
        # cpu_percent() measures since its previous call: this first call starts the count.
        self._psutil.cpu_percent(None)
        self._process.cpu_percent(None)
        if self._nvml is None:
            self._nvml = _open_nvml()
        if self._nvml is not None:
            try:
                count = self._nvml.nvmlDeviceGetCount()
                self._gpus = [
                    (i, self._nvml.nvmlDeviceGetHandleByIndex(i)) for i in self.rank.gpus(count)
                ]
            except Exception as exc:  # a driver that answers but fails: CPU and memory only
                logger.warning("async_tracker: no GPU metrics: %s", exc)
                self._gpus = []

    def gpu_names(self) -> list[str]:
        self._open()
        names = []
        for _, handle in self._gpus:
            name = self._nvml.nvmlDeviceGetName(handle)
            names.append(name.decode() if isinstance(name, bytes) else str(name))
        return names

    def sample(self) -> dict[str, float]:
        """One reading, named with this process's prefix."""
        self._open()
        ps = self._psutil
        memory = ps.virtual_memory()
        values = {
            "cpu_percent": ps.cpu_percent(None),
            "memory_used_gb": memory.used / GB,
            "memory_percent": memory.percent,
            "process_cpu_percent": self._process.cpu_percent(None),
            "process_rss_gb": self._process.memory_info().rss / GB,
        }
        for index, handle in self._gpus:
            values.update(self._gpu(index, handle))
        prefix = self.rank.prefix
        return {prefix + name: float(value) for name, value in values.items()}

    def _gpu(self, index: int, handle: Any) -> dict[str, float]:
        nvml = self._nvml
        readings: dict[str, Callable[[], float]] = {
            "utilization": lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu,
            "memory_used_gb": lambda: nvml.nvmlDeviceGetMemoryInfo(handle).used / GB,
            "memory_percent": lambda: _percent(nvml.nvmlDeviceGetMemoryInfo(handle)),
            "power_w": lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,  # milliwatts
            "temperature_c": lambda: nvml.nvmlDeviceGetTemperature(handle, 0),  # 0: the GPU die
        }
        out = {}
        for name, read in readings.items():
            try:
                out[f"gpu{index}/{name}"] = float(read())
            except Exception:  # NVMLError_NotSupported on this GPU, a GPU gone: skip that one
                continue
        return out


def _percent(info: Any) -> float:
    return 100.0 * info.used / info.total if info.total else 0.0


def _open_nvml() -> Any | None:
    """The ``pynvml`` module, initialised; None without the package or a driver."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded: no GPU here
        logger.debug("async_tracker: no GPU metrics (%s)", exc)
        return None
    return pynvml


class SystemMetrics:
    """Samples every ``interval`` seconds into ``run`` (anything with ``log_metrics`` and
    ``add_metadata``), until stopped or the run closes."""

    def __init__(
        self, run: Any, interval: float, sampler: Sampler | None = None, clock: Clock | None = None
    ) -> None:
        self.run = run
        self.interval = interval
        self.sampler = sampler or Sampler()
        self.clock = clock or Clock()
        self.samples = 0
        self._future: concurrent.futures.Future[None] | None = None

    def describe(self) -> bool:
        """Records where this process runs, under ``system`` or ``system/rank<RANK>``
        (blocking); False once the run is closed."""
        rank = self.sampler.rank
        where = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "rank": rank.rank,
            "local_rank": rank.local_rank,
            "gpus": self.sampler.gpu_names(),
            "interval_s": self.interval,
        }
        try:
            self.run.add_metadata(**{rank.prefix.rstrip("/"): where})
        except TrackerClosedError:
            return False
        return True

    def log_once(self) -> bool:
        """Takes and logs one sample (blocking); False once the run is closed."""
        try:
            self.run.log_metrics(self.sampler.sample())
        except TrackerClosedError:
            return False
        self.samples += 1
        return True

    async def serve(self) -> None:
        """Sleeps on the tracker loop, samples in a worker thread; ends when the run does."""
        if not await self._blocking(self.describe):
            return
        while True:
            await self.clock.sleep(self.interval)
            if not await self._blocking(self.log_once):
                return

    async def _blocking(self, call: Callable[[], bool]) -> bool:
        try:
            # An endpoint of its own: a driver call that hangs holds one thread, and takes no
            # share of a backend's.
            return await run_blocking(call, endpoint=ENDPOINT)
        except Exception:
            # A failed reading (a driver error) must not end the sampling, nor anything else.
            logger.exception("async_tracker: a system metrics sample failed")
            return True

    def start(self, submit: Callable[..., concurrent.futures.Future[None]]) -> None:
        """Starts :meth:`serve` with ``submit`` (the tracker loop's)."""
        self._future = submit(self.serve)

    def stop(self) -> None:
        """Stops sampling (a sample under way in its thread may still log: the run's close
        then refuses it, which ends it quietly)."""
        if self._future is not None:
            self._future.cancel()
            self._future = None
