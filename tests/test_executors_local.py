"""The local turn executor on its own (not yet driven by the agents): real processes, real signals.

Also the registry and the configuration, and `executor: ray` without the ray package installed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import typing as t
from pathlib import Path

import pytest

from executor_cases import (
    counting,
    group_and_straggler,
    numbered,
    read_all,
    read_until,
    spec,
    stubborn,
    tagged,
    wait_until,
)
from overstory import procs
from overstory.config.model import load_config
from overstory.errors import ConfigError, ExecutorUnavailable, TurnNotFound, UsageError
from overstory.executors import EXECUTOR_KINDS, from_config, get_executor
from overstory.executors.base import STOPPED, TurnSpec
from overstory.executors.local import LocalExecutor
from sandbox_helpers import requires_bwrap


@pytest.fixture
def executor(tmp_path: Path) -> t.Iterator[LocalExecutor]:
    made = LocalExecutor(tmp_path / "turns")
    yield made
    for folder in made.root.iterdir():  # nothing a test started outlives it
        procs.kill_turn(None, None, folder.name, force=True)


def test_a_second_submit_of_one_turn_id_starts_one_process(executor: LocalExecutor, tmp_path: Path) -> None:
    marker = tmp_path / "starts"
    turn = spec("t-once", counting(marker, "echo done"), tmp_path)
    results = []
    threads = [threading.Thread(target=lambda: results.append(executor.submit(turn))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    again = LocalExecutor(executor.root).submit(turn)  # another process's executor: the folder is the truth
    assert executor.wait("t-once", timeout=30).state == "finished"
    assert sorted(result.created for result in results) == [False, False, False, True]
    assert again.created is False
    assert marker.read_text().splitlines() == ["started"]


def test_lines_come_in_order_and_a_new_reader_resumes_from_the_cursor(executor: LocalExecutor,
                                                                      tmp_path: Path) -> None:
    gate = tmp_path / "go"
    executor.submit(spec("t-lines", numbered(1, 300, gate), tmp_path, stdin=b""))
    first, cursor = read_until(executor, "t-lines", 150)
    assert first == [f"line {i}" for i in range(1, 151)]  # the command waits at the gate: nothing more yet
    gate.touch()
    rest, _ = read_all(LocalExecutor(executor.root), "t-lines", cursor)
    assert rest == [f"line {i}" for i in range(151, 301)] + ["tail"]


def test_stdin_reaches_the_command(executor: LocalExecutor, tmp_path: Path) -> None:
    executor.submit(spec("t-stdin", "cat; echo", tmp_path, stdin=b'{"type":"user"}\n'))
    assert read_all(executor, "t-stdin")[0] == ['{"type":"user"}', ""]


def test_the_command_runs_as_popen_would_start_it(executor: LocalExecutor, tmp_path: Path) -> None:
    """The shim starts the command without subprocess (executors.shim._start): in a session and process group of
    its own, in the spec's folder, with only the spec's environment, SIGPIPE and SIGXFSZ back to their defaults
    (Python ignores SIGPIPE; a pipeline like `yes | head -1` relies on it), and none of the shim's own files."""
    script = ('ps -o sid=,pgid= -p $$; pwd; echo "[$ONLY]" "[${HOME:-none}]"; grep SigIgn /proc/self/status; '
              'ls /proc/self/fd | sort -n | tr "\\n" " "; echo; yes | head -1')
    executor.submit(TurnSpec("t-popen", ("sh", "-c", script), str(tmp_path), env={"PATH": os.environ["PATH"],
                                                                                    "ONLY": "this"}))
    lines = read_all(executor, "t-popen")[0]
    ended = executor.wait("t-popen", timeout=30)
    assert ended.exit_code == 0
    sid, pgid = lines[0].split()
    assert sid == pgid == str(ended.pid)  # its own session, led by the command itself
    assert lines[1] == str(tmp_path)
    assert lines[2] == "[this] [none]"
    ignored = int(lines[3].split()[1], 16)
    assert not ignored & (1 << (13 - 1)) and not ignored & (1 << (25 - 1))  # SIGPIPE, SIGXFSZ not ignored
    assert lines[4].split() == ["0", "1", "2", "3"]  # stdio, and the fd ls itself opens
    assert lines[5] == "y"


def test_stop_ends_the_whole_process_group_and_what_left_it(executor: LocalExecutor, tmp_path: Path) -> None:
    executor.submit(spec("t-stop", group_and_straggler(), tmp_path))
    assert read_until(executor, "t-stop", 1)[0] == ["ready"]
    running = executor.status("t-stop")
    assert running.state == "running" and running.pid
    assert len(procs.group_members(running.pid)) >= 2  # sh and its background sleep share the group
    assert len(tagged("t-stop")) >= 3  # ...and the setsid one left it, but carries the turn's tag
    stopped = executor.stop("t-stop", grace=2)
    assert (stopped.state, stopped.reason) == ("failed", STOPPED)
    assert procs.group_members(running.pid) == []
    assert tagged("t-stop") == []


def test_stop_kills_a_command_that_ignores_sigterm_after_the_grace(executor: LocalExecutor, tmp_path: Path) -> None:
    executor.submit(spec("t-stubborn", stubborn(), tmp_path))
    assert read_until(executor, "t-stubborn", 1)[0] == ["ready"]
    stopped = executor.stop("t-stubborn", grace=1)
    assert (stopped.state, stopped.reason, stopped.exit_code) == ("failed", STOPPED, 128 + signal.SIGKILL)
    assert tagged("t-stubborn") == []


def test_stop_with_no_grace_kills_at_once(executor: LocalExecutor, tmp_path: Path) -> None:
    """What a turn stopped for its budget, a park or a stall gets: SIGKILL at once, not a grace to take a step in."""
    executor.submit(spec("t-now", stubborn(), tmp_path))
    assert read_until(executor, "t-now", 1)[0] == ["ready"]
    started = time.monotonic()
    stopped = executor.stop("t-now", grace=0)
    assert time.monotonic() - started < 2.0
    assert (stopped.state, stopped.reason, stopped.exit_code) == ("failed", STOPPED, 128 + signal.SIGKILL)
    assert tagged("t-now") == []


@pytest.mark.parametrize("attempt", range(5))
def test_a_stop_racing_the_submit_never_leaves_the_command_running(executor: LocalExecutor, tmp_path: Path,
                                                                   attempt: int) -> None:
    """Whichever comes first, the turn ends stopped: the shim sees the stop before starting the command, or
    the stop finds the command's proc.json and kills it."""
    name = f"t-race-{attempt}"
    submitter = threading.Thread(target=executor.submit, args=(spec(name, group_and_straggler(), tmp_path),))
    submitter.start()
    wait_until(lambda: (executor.root / name).is_dir(), 10, "never claimed")
    stopped = executor.stop(name, grace=1)
    submitter.join()
    assert (stopped.state, stopped.reason) == ("failed", STOPPED), stopped
    assert executor.status(name).state == "failed"
    assert tagged(name) == []


@requires_bwrap
def test_stop_ends_a_bubblewrap_sandbox(executor: LocalExecutor, tmp_path: Path) -> None:
    argv = ("bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid",
            "--die-with-parent", "sh", "-c", "sleep 300 & echo ready; wait")
    executor.submit(TurnSpec("t-bwrap", argv, str(tmp_path), env={"PATH": os.environ["PATH"]}))
    assert read_until(executor, "t-bwrap", 1)[0] == ["ready"]
    assert len(tagged("t-bwrap")) >= 2
    assert executor.stop("t-bwrap", grace=2).reason == STOPPED
    assert tagged("t-bwrap") == []


def test_statuses_are_typed(executor: LocalExecutor, tmp_path: Path) -> None:
    executor.submit(spec("t-exit", "echo out; exit 3", tmp_path))
    ended = executor.wait("t-exit", timeout=30)
    assert (ended.state, ended.exit_code, ended.ended) == ("finished", 3, True)
    assert ended.node and ended.pid and ended.started_ms and ended.ended_ms

    executor.submit(TurnSpec("t-missing", (str(tmp_path / "no-such-program"),), str(tmp_path)))
    missing = executor.status("t-missing")
    assert missing.state == "failed" and "no-such-program" in missing.reason and "No such file" in missing.reason

    with pytest.raises(TurnNotFound) as caught:
        executor.status("t-never")
    assert caught.value.turn_id == "t-never" and "\n" not in str(caught.value)


def test_a_turn_whose_shim_was_killed_is_lost_not_running(executor: LocalExecutor, tmp_path: Path) -> None:
    executor.submit(spec("t-lost", "echo ready; sleep 300", tmp_path))
    read_until(executor, "t-lost", 1)
    record = json.loads((executor.root / "t-lost" / "proc.json").read_text())
    os.kill(record["shim_pid"], signal.SIGKILL)
    os.killpg(record["pgid"], signal.SIGKILL)
    lost = wait_until(lambda: (s := executor.status("t-lost")).state == "lost" and s, 10, "never lost")
    assert "nothing recorded how" in lost.reason


def test_a_turn_outlives_the_process_that_submitted_it(executor: LocalExecutor, tmp_path: Path) -> None:
    gate = tmp_path / "go"
    code = ("import sys; from overstory.executors.local import LocalExecutor; from overstory.executors.base import "
            f"TurnSpec; LocalExecutor(sys.argv[1]).submit(TurnSpec('t-orphan', ('sh', '-c', "
            f"\"while [ ! -e {gate} ]; do sleep 0.05; done; echo after; exit 5\"), '/'))")
    subprocess.run([sys.executable, "-c", code, str(executor.root)], check=True, timeout=60)
    assert executor.status("t-orphan").state == "running"
    gate.touch()
    ended = executor.wait("t-orphan", timeout=30)
    assert (ended.state, ended.exit_code) == ("finished", 5)
    assert read_all(executor, "t-orphan")[0] == ["after"]


def test_forget_drops_an_ended_turn(executor: LocalExecutor, tmp_path: Path) -> None:
    executor.submit(spec("t-forget", "true", tmp_path))
    executor.wait("t-forget", timeout=30)
    executor.forget("t-forget")
    with pytest.raises(TurnNotFound):
        executor.status("t-forget")


# ---- the registry and the configuration ---------------------------------------------------------------


def test_the_registry_names_both_kinds_and_refuses_others(tmp_path: Path) -> None:
    assert EXECUTOR_KINDS == ("local", "ray")
    with pytest.raises(UsageError, match="unknown executor 'k8s'; choose one of: local, ray"):
        get_executor("k8s")


def test_config_defaults_to_local_and_ray_needs_an_address(tmp_path: Path) -> None:
    config_file = tmp_path / "config.yaml"
    config_file.write_text("")
    config = load_config(config_file, None, environ={})
    assert config.executor.kind == "local" and config.executor.ray.turn_resources == {"CPU": 1.0}
    assert isinstance(from_config(config, str(tmp_path / "turns")), LocalExecutor)
    config_file.write_text("executor:\n  kind: ray\n")
    with pytest.raises(ConfigError) as caught:
        load_config(config_file, None, environ={})
    assert "\n" not in str(caught.value) and "executor.ray.address" in str(caught.value)


def test_executor_ray_without_the_ray_package_is_one_clear_line(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    config_file = tmp_path / "config.yaml"
    config_file.write_text("executor:\n  kind: ray\n  ray:\n    address: 127.0.0.1:6379\n")
    config = load_config(config_file, None, environ={})  # valid without ray: only using it needs the package
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as it does without the extra
    with pytest.raises(ExecutorUnavailable) as caught:
        from_config(config, str(tmp_path / "turns"))
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("executor 'ray': the ray package is not installed")
    assert "pip install 'overstory[ray]'" in message
