"""Schedules: what happens to the world, step by step, drawn from seeds.

A schedule is a list of integers, one per step; each seeds the draw of its step (what it does
and with what). Hypothesis shrinks such a list by dropping and lowering its integers, which
gives short failing schedules; a seed gives the list itself, for a one-line replay.
"""

from __future__ import annotations

import errno
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio

from tests.simulation.world import BACKENDS, FAULTS, PART_FAULTS, RUNS, World

STEP_KINDS = (
    ["write"] * 36
    + ["interrupted_write"] * 4
    + ["tick"] * 8
    + ["flush"] * 8
    + ["advance"] * 10
    + ["fault"] * 10
    + ["heal"] * 5
    + ["spool_fault"] * 3
    + ["foreign"] * 2
    + ["crash"] * 3
    + ["fork"] * 2
    + ["crash_while_closing"] * 2
    + ["close"] * 3
    + ["close_while_flushing"] * 2
)


@dataclass(frozen=True)
class Step:
    kind: str
    run: str
    a: int
    b: float
    c: str

    @classmethod
    def draw(cls, x: int) -> Step:
        r = random.Random(x)
        kind = r.choice(STEP_KINDS)
        step = cls(
            kind,
            r.choice(RUNS),
            r.randrange(0, 40),
            round(r.uniform(0.0, 8.0), 3),
            r.choice(
                {"write": ["metric"] * 8 + ["metadata", "poison", "artifact", "source"],
                 "fault": list(FAULTS),
                 "flush": ["0", "timeout", "none"],
                 "spool_fault": ["ENOSPC", "EROFS"],
                 "foreign": ["file", "segment", "dir"],
                 # Drawn last, so that adding a variant left every other draw of a seed as
                 # it was: a third of closes are cut short by a SIGTERM.
                 "close": ["plain", "plain", "sigterm"],
                 # A fifth of advances also set the wall clock back (metadata stamps).
                 "advance": ["", "", "", "", "back"]}.get(kind, [""])
            ),
        )
        # Drawn after everything else (so every other draw of a seed stays as it was): a
        # quarter of faults are of a backend that stores a batch part by part.
        if kind == "fault" and r.random() < 0.25:
            step = cls(kind, step.run, step.a, step.b, r.choice(PART_FAULTS))
        return step


def schedule_of_seed(seed: int, length: int = 60) -> list[int]:
    r = random.Random(seed)
    return [r.getrandbits(32) for _ in range(length)]


async def apply(world: World, step: Step) -> None:
    run = step.run
    backend = world.backends[BACKENDS[step.a % len(BACKENDS)]]
    if step.kind == "write":
        world.write(run, step.a % 3, 1 if step.c == "poison" else 1 + step.a, step.c)
    elif step.kind == "interrupted_write":
        world.interrupted_write(run, step.a % 3, 1 + step.a * 3)
    elif step.kind == "tick":
        world.runs[run].pipeline.tick()
    elif step.kind == "flush":
        troubled = any(b.troubled(run) for b in world.backends.values())
        if step.c == "none" and any("hang" in b.faults[run] or b.hung[run]
                                    for b in world.backends.values()):
            return  # flush() without a timeout waits for a hung backend: by contract
        timeout = {"0": 0.0, "timeout": step.b, "none": None}[step.c]
        await world.runs[run].pipeline.flush(timeout)
        if step.c == "none" and not troubled and not world.io.fail_writes:
            world.check_isolated(run)
    elif step.kind == "advance":
        if step.c == "back":
            world.step_wall_clock_back(2 * step.b)
        await world.clock.sleep(step.b)
    elif step.kind == "fault" and step.c == "flaky":
        backend.flaky[run] = True  # until healed
    elif step.kind == "fault" and step.c == "parts":
        # Several in a row, more than a round's tries: each stores a part, so a round that
        # counted tries whatever they stored would end (and a flush return) before the batch
        # is delivered.
        backend.faults[run].extend([step.c] * (3 + step.a % 8))
    elif step.kind == "fault":
        backend.faults[run].extend([step.c] * (1 + step.a % 4))
    elif step.kind == "heal":
        backend.heal(run)
    elif step.kind == "spool_fault":
        world.io.fail_writes = 1 + step.a % 3
        world.io.errno_ = {"ENOSPC": errno.ENOSPC, "EROFS": errno.EROFS}[step.c]
    elif step.kind == "foreign":
        lane = world.runs[run].pipeline.lanes[step.a % len(BACKENDS)]
        directory = Path(lane.log.spool.path)
        directory.mkdir(parents=True, exist_ok=True)
        if step.c == "file":
            (directory / f"stray-{step.a}.txt").write_text("not ours")
        elif step.c == "segment":
            (directory / f"0000000000000000001x1-0-5-9-{step.a}.seg").write_bytes(b"garbage\n")
        else:
            (directory / f"junk{step.a}").mkdir(exist_ok=True)
            (directory.parent / f"stray{step.a}").write_text("in the run directory")
    elif step.kind == "crash_while_closing":
        # A signal ends the process in the middle of close(): what the close had done stays.
        pipeline = world.runs[run].pipeline
        async with anyio.create_task_group() as tg:
            tg.start_soon(pipeline.close, step.b)
            await world.clock.sleep(step.b / 4)
            tg.cancel_scope.cancel()
        await world.crash(run)
    elif step.kind == "fork":
        await world.fork(run, 1 + step.a)
    elif step.kind == "crash":
        await world.crash(run)
    elif step.kind == "close" and step.c == "sigterm":
        # A SIGTERM lands while close() waits for the backends: its deadline moves to the
        # end of the grace (as the handler does, through the loop), earlier than its own.
        await world.sigterm_while_closing(run, 2 * step.b, step.b / 4, step.a / 20)
    elif step.kind == "close":
        await world.close(run, step.b)
    elif step.kind == "close_while_flushing":
        pipeline = world.runs[run].pipeline
        async with anyio.create_task_group() as tg:
            tg.start_soon(pipeline.flush, None)
            await world.clock.sleep(step.b / 4)
            await world.close(run, step.b)


async def run_schedule(
    seed: int, schedule: Sequence[int], spool_dir: Path, durable: bool
) -> World:
    """Runs a schedule, checking after every step; then heals everything, replays the spool
    in a new life of each run, and checks what every backend ended with."""
    async with anyio.create_task_group() as tg:
        world = World(seed, spool_dir, durable, tg)
        tg.start_soon(world.clock.drive)
        for i, x in enumerate(schedule):
            step = Step.draw(x)
            world.log.append(f"{i}: {step}")
            await apply(world, step)
            world.check()
        # The end of the story: backends and disk healthy, every run closed, then started
        # again to replay what was spooled, and closed with time to deliver everything.
        world.io.fail_writes = 0
        for backend in world.backends.values():
            backend.heal()
        for run in RUNS:
            await world.close(run, 60.0)
            await world.runs[run].pipeline.flush(60.0)
            world.check()
        for run in RUNS:
            inc = world.runs[run]
            await inc.pipeline.close(60.0)
            world.note_end(run, inc)
            inc.scope.cancel()
        world.check_final()
        tg.cancel_scope.cancel()
    return world
