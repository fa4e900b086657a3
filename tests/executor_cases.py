"""Commands and waits the executor tests share (local and ray run the same turns)."""

from __future__ import annotations

import os
import time
import typing as t
from pathlib import Path

from overstory import procs
from overstory.executors.base import Lines, TurnExecutor, TurnSpec


def spec(turn_id: str, script: str, cwd: Path, **kwargs: t.Any) -> TurnSpec:
    """A turn that runs ``sh -c script`` in ``cwd`` with this machine's PATH."""
    return TurnSpec(turn_id, ("sh", "-c", script), str(cwd), env={"PATH": os.environ["PATH"]}, **kwargs)


def counting(marker: Path, then: str) -> str:
    """A script that appends one line to ``marker`` each time it starts, then runs ``then``."""
    return f"echo started >> '{marker}'; {then}"


def group_and_straggler(tag: str = "ready") -> str:
    """A script with a child in its process group and one that left it (setsid), then prints ``tag``."""
    return f"sleep 300 & setsid sleep 300 & echo {tag}; wait"


def stubborn(tag: str = "ready") -> str:
    """A script that ignores SIGTERM: only the SIGKILL after the grace ends it."""
    return f"trap '' TERM; echo {tag}; while :; do sleep 0.2; done"


def numbered(first: int, last: int, gate: Path) -> str:
    """Prints first..last/2, waits for ``gate`` to exist, prints the rest, then a last line without a newline."""
    middle = (first + last) // 2
    return (f"i={first}; while [ $i -le {middle} ]; do echo line $i; i=$((i+1)); done; "
            f"while [ ! -e '{gate}' ]; do sleep 0.05; done; "
            f"while [ $i -le {last} ]; do echo line $i; i=$((i+1)); done; printf tail")


def read_until(executor: TurnExecutor, turn_id: str, count: int, cursor: int = 0,
               timeout: float = 60) -> tuple[list[str], int]:
    """Read lines until ``count`` have come (or the turn is done); returns them and the cursor."""
    found: list[str] = []
    deadline = time.monotonic() + timeout
    while len(found) < count and time.monotonic() < deadline:
        batch: Lines = executor.lines(turn_id, cursor, timeout=1.0)
        found += batch.lines
        cursor = batch.cursor
        if batch.done:
            break
    return found, cursor


def read_all(executor: TurnExecutor, turn_id: str, cursor: int = 0, timeout: float = 60) -> tuple[list[str], int]:
    found: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = executor.lines(turn_id, cursor, timeout=1.0)
        found += batch.lines
        cursor = batch.cursor
        if batch.done:
            return found, cursor
    raise AssertionError(f"turn {turn_id} did not end within {timeout}s (read {len(found)} lines)")


def wait_until(predicate: t.Callable[[], t.Any], timeout: float, message: str) -> t.Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(message)


def tagged(turn_id: str) -> list[int]:
    """Every live process on this machine that carries the turn's tag (all nodes of a test cluster are here)."""
    return procs.tagged_processes(turn_id)
