"""System metrics (async_tracker/system_metrics.py): real psutil readings of this machine,
names with the rank, GPUs through a stand-in for NVML (no GPU here), sampling driven by an
injected clock."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from async_tracker import AppRun
from async_tracker.backend.memory import InMemoryTracker
from async_tracker.clock import Clock
from async_tracker.runtime.process import runtime
from async_tracker.settings import RunOptions
from async_tracker.system_metrics import Rank, Sampler, SystemMetrics

pytest.importorskip("psutil")

MakeRun = Callable[..., AppRun]
BASE = {"cpu_percent", "memory_used_gb", "memory_percent", "process_cpu_percent", "process_rss_gb"}


class StandInNVML:
    """The part of pynvml the sampler calls, for GPUs this machine does not have. GPU 1
    does not report power (as some boards answer NVMLError_NotSupported)."""

    class NVMLError(Exception):
        pass

    def __init__(self, count: int = 2) -> None:
        self.count = count

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return f"Board {h}".encode()

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=10 * (h + 1), memory=5)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return SimpleNamespace(used=4e9 * (h + 1), total=16e9, free=0)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        if h == 1:
            raise self.NVMLError("Not Supported")
        return 250_000  # milliwatts

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return 60 + h


def test_a_sample_reads_cpu_and_memory_of_this_machine_and_process() -> None:
    sample = Sampler(Rank({})).sample()
    names = {n.removeprefix("system/") for n in sample}
    assert set(BASE) <= names and all(n.startswith("system/") for n in sample)
    assert all("rank" not in n for n in sample)
    assert sample["system/memory_used_gb"] > 0 and 0 < sample["system/memory_percent"] <= 100
    assert 0 < sample["system/process_rss_gb"] < sample["system/memory_used_gb"] * 10
    assert 0 <= sample["system/cpu_percent"] <= 100
    assert all(type(v) is float for v in sample.values())


@pytest.mark.parametrize(
    "env, prefix, local",
    [
        ({}, "system/", None),
        ({"RANK": "3", "LOCAL_RANK": "1"}, "system/rank3/", 1),
        ({"LOCAL_RANK": "2"}, "system/rank2/", 2),  # a launcher that sets only LOCAL_RANK
        ({"RANK": "0"}, "system/rank0/", None),
    ],
)
def test_every_point_carries_the_rank_it_came_from(
    env: dict[str, str], prefix: str, local: int | None
) -> None:
    rank = Rank(env)
    assert rank.prefix == prefix and rank.local_rank == local
    sample = Sampler(rank).sample()
    assert {n.removeprefix(prefix) for n in sample} >= BASE
    assert all(n.startswith(prefix) for n in sample)


def test_a_rank_that_is_not_an_integer_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="RANK='one'"):
        Rank({"RANK": "one"})


def test_gpus_are_read_through_nvml_and_a_rank_reports_its_own() -> None:
    sample = Sampler(Rank({}), nvml=StandInNVML()).sample()
    gpu = {n: v for n, v in sample.items() if "/gpu" in n}
    assert gpu == {
        "system/gpu0/utilization": 10.0,
        "system/gpu0/memory_used_gb": 4.0,
        "system/gpu0/memory_percent": 25.0,
        "system/gpu0/power_w": 250.0,
        "system/gpu0/temperature_c": 60.0,
        "system/gpu1/utilization": 20.0,
        "system/gpu1/memory_used_gb": 8.0,
        "system/gpu1/memory_percent": 50.0,
        # no power: not supported on that board, and nothing else is lost for it
        "system/gpu1/temperature_c": 61.0,
    }
    ranked = Sampler(Rank({"RANK": "5", "LOCAL_RANK": "1"}), nvml=StandInNVML()).sample()
    assert {n for n in ranked if "/gpu" in n} == {
        "system/rank5/gpu1/utilization",
        "system/rank5/gpu1/memory_used_gb",
        "system/rank5/gpu1/memory_percent",
        "system/rank5/gpu1/temperature_c",
    }
    # CUDA_VISIBLE_DEVICES reorders what a local rank's index means.
    visible = Rank({"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "1,0"})
    assert visible.gpus(2) == [1]
    assert Rank({"CUDA_VISIBLE_DEVICES": "GPU-1234"}).gpus(2) == [0, 1]


def test_without_a_gpu_driver_there_are_no_gpu_metrics_and_no_error() -> None:
    # pynvml may be installed here; this machine has no driver (or, where it has, the
    # names still follow the scheme).
    sample = Sampler(Rank({})).sample()
    assert all(n.startswith("system/gpu") or n.removeprefix("system/") in BASE for n in sample)


def test_samples_are_logged_into_the_run_with_where_the_process_runs(make_run: MakeRun) -> None:
    mem = InMemoryTracker()
    run = make_run("r", [mem])
    system = SystemMetrics(run, 10.0, Sampler(Rank({"RANK": "1"}), nvml=StandInNVML(1)))
    assert system.describe()
    assert system.log_once() and system.log_once()
    assert run.flush().ok
    points = mem.points("r", "system/rank1/memory_percent")
    assert [p.step for p in points] == [0, 1]
    assert [p.value for p in mem.points("r", "system/rank1/gpu0/utilization")] == [10.0, 10.0]
    where = run.metadata()["system/rank1"]
    assert isinstance(where, dict)
    assert where["rank"] == 1 and where["gpus"] == ["Board 0"] and where["interval_s"] == 10.0
    run.close()
    assert not system.log_once()  # a closed run ends the sampling quietly
    assert not system.describe()


class TickClock(Clock):
    """Lets ``ticks`` sleeps return at once, then holds the next one until cancelled and
    says so (``held``): by then that many samples were logged."""

    def __init__(self, ticks: int) -> None:
        self.ticks = ticks
        self.slept: list[float] = []
        self.held = threading.Event()

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        if len(self.slept) > self.ticks:
            self.held.set()
            await anyio.sleep_forever()


class BrokenDriver(StandInNVML):
    def nvmlDeviceGetCount(self) -> int:
        raise self.NVMLError("Driver/library version mismatch")


def test_the_sampler_runs_on_the_tracker_loop_every_interval_until_close(
    make_run: MakeRun,
) -> None:
    mem = InMemoryTracker()
    run = make_run("r", [mem])
    clock = TickClock(ticks=3)
    # A driver that fails costs the GPU readings (with a warning), not the sampling.
    system = SystemMetrics(run, 7.5, Sampler(Rank({}), nvml=BrokenDriver()), clock=clock)
    system.start(runtime().loop.submit)
    future = system._future
    assert future is not None
    assert clock.held.wait(30)
    assert clock.slept == [7.5] * 4
    assert run.flush().ok
    assert [p.step for p in mem.points("r", "system/cpu_percent")] == [0, 1, 2]
    assert not any("gpu" in name for name in run.metrics())
    where = run.metadata()["system"]
    assert isinstance(where, dict) and where["gpus"] == [] and where["rank"] is None
    system.stop()
    assert future.cancelled()


def test_the_run_option_and_its_variable_start_and_stop_sampling(
    make_run: MakeRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = make_run("r", [InMemoryTracker()], system_metrics=3600.0)
    assert run._system is not None and run._system.interval == 3600.0
    future = run._system._future
    assert future is not None and not future.done()
    run.close()
    assert future.cancelled()
    assert make_run("s", [InMemoryTracker()])._system is None
    assert make_run("t", [InMemoryTracker()], system_metrics=0)._system is None

    assert RunOptions.from_env({"ASYNC_TRACKER_SYSTEM_METRICS": "2.5"}).system_metrics == 2.5
    with pytest.raises(ValueError, match="ASYNC_TRACKER_SYSTEM_METRICS='often'"):
        RunOptions.from_env({"ASYNC_TRACKER_SYSTEM_METRICS": "often"})
    with pytest.raises(ValueError, match="system_metrics must be >= 0"):
        RunOptions(system_metrics=-1.0)
    monkeypatch.setenv("TORCHX_JOB_ID", "job")
    monkeypatch.setenv("TORCHX_TRACKERS", "")
    monkeypatch.setenv("ASYNC_TRACKER_SYSTEM_METRICS", "60")
    env_run = AppRun.run_from_env()
    assert env_run.options.system_metrics == 60.0


def test_without_psutil_the_option_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil now raises ImportError
    with pytest.raises(ImportError, match=r"async-tracker\[system\]"):
        AppRun("r", [InMemoryTracker()], system_metrics=10.0)
