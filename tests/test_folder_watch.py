"""A local turn's reader sleeps on its folder (executors.changes, inotify) and wakes when the turn writes or ends.

Real files, a real kernel watch and a real local executor running a shell command: a reader whose waits are made
far longer than any test (1,000 s) still returns each line and the end, so it can only have been woken by them.
"""

from __future__ import annotations

import os
import select
import threading
import time
import typing as t
from pathlib import Path

import pytest

from overstory.agents import turn_exec
from overstory.executors.base import TurnSpec
from overstory.executors.changes import FolderWatch
from overstory.executors.local import LocalExecutor


def _ready(watch: FolderWatch) -> bool:
    return bool(select.select([watch], [], [], 0)[0])


def test_a_folder_watch_wakes_on_a_write_and_a_rename_into_the_folder(tmp_path: Path) -> None:
    (tmp_path / "stdout").write_bytes(b"")
    watch = FolderWatch.open(tmp_path)
    assert watch is not None  # Linux: inotify is there
    try:
        assert not _ready(watch)
        with open(tmp_path / "stdout", "ab") as out:
            out.write(b"a line\n")
        assert _ready(watch)
        watch.drain()
        assert not _ready(watch)  # drained: quiet until the next change
        (tmp_path / ".exit.json.1").write_text("{}")
        watch.drain()
        os.replace(tmp_path / ".exit.json.1", tmp_path / "exit.json")  # as the shim ends a turn
        assert _ready(watch)
        (tmp_path.parent / "elsewhere").write_text("x")  # outside the folder: no wake
        watch.drain()
        (tmp_path.parent / "elsewhere").write_text("y")
        assert not _ready(watch)
    finally:
        watch.close()
    assert watch.fd == -1


def test_a_folder_that_cannot_be_watched_gives_no_watch(tmp_path: Path) -> None:
    assert FolderWatch.open(tmp_path / "missing") is None  # the reader then waits as before


def test_a_reader_with_endless_waits_gets_every_line_and_the_end_when_they_come(tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(turn_exec, "LOCAL_FIRST_SLICE", 1000.0)
    monkeypatch.setattr(turn_exec, "LOCAL_SLICE", 1000.0)
    executor = LocalExecutor(tmp_path / "turns")
    go = tmp_path / "go"
    script = f"echo first; while [ ! -e {go} ]; do sleep 0.05; done; echo second"
    executor.submit(TurnSpec("t-watch", ("sh", "-c", script), str(tmp_path)))
    reader = turn_exec.ExecutorLines(executor, "t-watch")
    assert reader.changes is not None
    try:
        got: list[bytes] = []
        while not got:
            got = reader.lines(timeout=1000)
        assert got == [b"first"]
        threading.Timer(0.3, go.touch).start()
        rest: list[bytes] = []
        while not reader.eof:
            rest += reader.lines(timeout=1000)
        assert rest == [b"second"]
    finally:
        reader.close()
        executor.forget("t-watch")
    assert reader.changes is None


def test_a_turn_read_through_its_watch_reads_the_same_as_one_read_by_polling(tmp_path: Path) -> None:
    executor = LocalExecutor(tmp_path / "turns")
    script = "for i in 1 2 3; do echo line $i; sleep 0.02; done; printf 'no newline at the end'"
    results: dict[str, list[bytes]] = {}
    for turn_id, watched in (("t-watched", True), ("t-polled", False)):
        executor.submit(TurnSpec(turn_id, ("sh", "-c", script), str(tmp_path)))
        reader = turn_exec.ExecutorLines(executor, turn_id)
        if not watched:
            t.cast(t.Any, reader.changes).close()
            reader.changes = None
        lines: list[bytes] = []
        deadline = time.monotonic() + 60
        while not reader.eof and time.monotonic() < deadline:
            lines += reader.lines(timeout=5)
        reader.close()
        results[turn_id] = lines
        executor.forget(turn_id)
    assert results["t-watched"] == results["t-polled"] == [b"line 1", b"line 2", b"line 3", b"no newline at the end"]
