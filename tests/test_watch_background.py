"""`ov watch --background` (one daemon per project, found by the next `ov watch`) and `--kill-others` (only the
dashboards ov started: record, start time and command line), with real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing as t

from agent_helpers import wait_for
from conftest import ov_command, run_ov
from overstory import procs
from overstory.paths import ProjectPaths
from overstory.watchdog import dashboards
from overstory.watchdog.lock import WatchdogLock, lock_holder


def _started_pid(output: str) -> int:
    return int(output.split("pid ")[1].split(";")[0])


def _stop(pids: t.Iterable[int]) -> None:
    """Teardown: stop what a failed test left (only pids this test started, checked by their records)."""
    for pid in pids:
        if procs.is_alive(pid) and dashboards.is_ov_watch(pid):
            os.kill(pid, 15)


def test_the_background_dashboard_is_found_by_the_next_watch_and_stopped_by_kill_others(project: ProjectPaths
                                                                                        ) -> None:
    started = run_ov("watch", "--background", "--interval", "0.2", "--width", "90", cwd=project.root)
    assert started.returncode == 0, started.stderr
    assert started.stdout.startswith("started the background dashboard: pid ")
    daemon = _started_pid(started.stdout)
    viewer: subprocess.Popen[str] | None = None
    try:
        assert os.getsid(daemon) == daemon  # detached: its own session, it outlives the terminal
        again = run_ov("watch", "--background", cwd=project.root)
        assert again.returncode == 0 and again.stdout.startswith(f"a background dashboard runs already: pid {daemon};")
        frame = dashboards.frames_file(project)
        wait_for(lambda: frame.exists() and "ov watch" in frame.read_text(), 20, message="the daemon's first frame")
        assert max(len(line) for line in frame.read_text().splitlines()) <= 90
        wait_for(lambda: lock_holder(project) == daemon, 20, message="the daemon's watchdog")

        viewer = subprocess.Popen([*ov_command(), "watch", "--interval", "0.2", "--width", "90"], cwd=project.root,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert viewer.stdout is not None and viewer.stdout.readline().startswith("ov watch")  # it is up
        assert [r["pid"] for r in dashboards.running(project)] == [daemon, viewer.pid]

        killed = run_ov("watch", "--kill-others", "--once", "--width", "90", cwd=project.root)
        assert killed.returncode == 0, killed.stderr
        assert killed.stderr.strip() == f"stopped 2 other `ov watch`: pid {daemon}, {viewer.pid}"
        assert viewer.wait(timeout=10) == 0  # SIGTERM ends it as Ctrl-C does
        assert viewer.stderr is not None and "the background dashboard runs (pid" in viewer.stderr.read()
        wait_for(lambda: not procs.is_alive(daemon), 10, message="the daemon to exit")
        assert dashboards.running(project) == [] and sorted(p.name for p in dashboards.watch_dir(project).glob("*.json")) == []
        WatchdogLock(project).acquire()  # the daemon's watchdog lock went with it
        assert run_ov("watch", "--kill-others", "--once", cwd=project.root).stderr.strip() == \
            "no other `ov watch` runs for this project"
    finally:
        _stop([daemon, *([viewer.pid] if viewer else [])])


def test_kill_others_never_signals_a_process_ov_did_not_start(project: ProjectPaths) -> None:
    """A record naming a live process that is not an `ov watch` (a reused pid, or a forged file) is dropped unsignalled."""
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "watch"])
    try:
        folder = dashboards.watch_dir(project)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{stranger.pid}.json").write_text(json.dumps(
            {"pid": stranger.pid, "ticks": procs.start_ticks(stranger.pid), "background": True, "frames": None,
             "started_at": 1}))
        assert dashboards.background(project) is None
        assert dashboards.kill_others(project, grace=0.5) == []
        assert stranger.poll() is None, "a process ov did not start was signalled"
        assert not (folder / f"{stranger.pid}.json").exists()
    finally:
        stranger.kill()
        stranger.wait()


def test_two_racing_background_starts_leave_one_daemon(project: ProjectPaths) -> None:
    starts = [subprocess.Popen([*ov_command(), "watch", "--background", "--interval", "0.5"], cwd=project.root,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [start.communicate(timeout=60) for start in starts]
    pids = {_started_pid(out) for out, _ in outputs}
    try:
        assert all(start.returncode == 0 for start in starts), outputs
        assert len(pids) == 1, outputs
        assert [r["pid"] for r in dashboards.running(project)] == list(pids)
    finally:
        assert sorted(dashboards.kill_others(project)) == sorted(pids)
        _stop(pids)
