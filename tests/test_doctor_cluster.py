"""`ov doctor` with turns on a Ray cluster (``executor: ray``): what it says when the cluster cannot be used.

The checks against a real cluster are in ``test_turns_on_ray.py`` (its module's cluster); here: an address
where nothing listens, the ``ray`` package missing (a Python where ``import ray`` fails), and how a survey's
answer becomes one line per problem.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import typing as t
from pathlib import Path

import pytest

from conftest import run_ov
from overstory.paths import ProjectPaths
from overstory.project.doctor_cluster import judge
from test_watchdog import write_local_config


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])  # closed again when the block ends: nothing listens there


def no_ray(tmp_path: Path) -> dict[str, str]:
    """An environment whose Python cannot import ray (as without the extra): sitecustomize hides it."""
    shim = tmp_path / "no-ray"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text("import sys\nsys.modules['ray'] = None\n", encoding="utf-8")
    return {"PYTHONPATH": str(shim)}


def cluster_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(("[FAIL] cluster", "[FAIL] ray", "[ok  ] cluster",
                                                                      "[FAIL] node", "[warn] node", "[ok  ] nodes"))]


def test_doctor_with_an_unreachable_cluster_says_so_in_one_line_and_fails(project: ProjectPaths) -> None:
    address = f"127.0.0.1:{closed_port()}"
    write_local_config(project, executor={"kind": "ray", "ray": {"address": address}})
    done = run_ov("doctor", cwd=project.root, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    assert cluster_lines(done.stdout) == [f"[FAIL] cluster: cannot reach the Ray cluster at {address}: "
                                          "connection refused"], done.stdout
    assert "Traceback" not in done.stdout + done.stderr
    # --executor ray checks the cluster even when the configuration keeps turns local; --executor local does not.
    write_local_config(project, executor={"kind": "local", "ray": {"address": address}})
    assert cluster_lines(run_ov("doctor", cwd=project.root).stdout) == []
    checked = run_ov("doctor", "--executor", "ray", "--json", cwd=project.root, timeout=60)
    assert checked.returncode == 1
    found = [c for c in json.loads(checked.stdout)["checks"] if c["name"] == "cluster"]
    assert [c["status"] for c in found] == ["fail"] and "connection refused" in found[0]["detail"]


def test_executor_ray_without_the_ray_package_is_one_line_and_a_failure(project: ProjectPaths,
                                                                        tmp_path: Path) -> None:
    env = no_ray(tmp_path)
    probe = subprocess.run([sys.executable, "-c", "import ray"], env={**os.environ, **env}, capture_output=True,
                           text=True, check=False)
    assert probe.returncode != 0  # the shim works: this Python cannot import ray
    write_local_config(project, executor={"kind": "ray", "ray": {"address": f"127.0.0.1:{closed_port()}"}})
    done = run_ov("doctor", cwd=project.root, env=env, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    assert cluster_lines(done.stdout) == ["[FAIL] ray: executor ray needs the ray package, which is not installed "
                                          "here"], done.stdout
    assert "Traceback" not in done.stdout + done.stderr
    # An agent's turns would need it too: sling refuses in one line instead of an agent whose every turn fails.
    slung = run_ov("sling", "builder", "t1", "--runtime", "scripted", cwd=project.root, env=env)
    assert slung.returncode != 0
    assert "executor 'ray': the ray package is not installed" in slung.stderr and "Traceback" not in slung.stderr
    assert len(slung.stderr.strip().splitlines()) == 1, slung.stderr


def node(name: str, **fields: t.Any) -> dict[str, t.Any]:
    return {"id": f"{name}-0123456789", "name": name, "alive": True, "runs_turns": True, "skew_ms": 5,
            "clock_error_ms": 2, "facts": {"version": "0.1.0", "runtimes": {"scripted": {"installed": True}}},
            **fields}


def test_each_problem_of_a_node_is_a_line_of_its_own() -> None:
    findings = judge("h:1", {"CPU": 1.0}, {"nodes": [
        node("head", runs_turns=False, facts={"version": "0.1.0", "runtimes": {}}),
        node("w1"),
        node("w2", facts={"version": "0.0.9", "runtimes": {"claude": {"installed": False, "detail": "not on PATH",
                                                                       "hint": "npm i -g claude"}}}),
        node("w3", skew_ms=-4200, clock_error_ms=100),
        node("w4", facts=None, error="ModuleNotFoundError: No module named 'overstory'"),
        node("w5", facts={"version": "0.1.0", "runtimes": {}, "travel": "unshare not found"}),
        node("gone", alive=False, runs_turns=False)]})
    lines = [(f.name, f.status, f.detail) for f in findings]
    assert lines == [
        ("cluster", "ok", "h:1: 6 node(s) alive, 5 with room for a turn (CPU=1)"),
        ("cluster", "warn", "1 dead node(s) Ray still lists: gone (gone-012)"),
        ("node w2 (w2-01234)", "fail", "ov 0.0.9, not 0.1.0 as here"),
        ("node w2 (w2-01234)", "fail", "runtime claude is missing: not on PATH"),
        ("node w3 (w3-01234)", "warn", "its clock is 4.2 s behind this machine's"),
        ("node w4 (w4-01234)", "fail", "ov does not run there: ModuleNotFoundError: No module named 'overstory'"),
        ("node w5 (w5-01234)", "fail", "cannot take a turn's workspace: unshare not found")]


def test_a_node_that_can_take_a_turns_workspace_says_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from overstory.project.doctor_cluster import travel_problem

    assert travel_problem() == ""  # this machine: git, unshare and a mount namespace
    monkeypatch.setenv("PATH", "/nowhere")
    assert travel_problem() == "git, unshare, mount not found"


def test_a_cluster_without_room_for_a_turn_fails_and_a_sound_one_is_one_line() -> None:
    none = judge("h:1", {"CPU": 1.0}, {"nodes": [node("head", runs_turns=False)]})
    assert [(f.status, f.detail) for f in none][0] == ("fail", "h:1: 1 node(s) alive, none with room for a turn (CPU=1)")
    sound = judge("h:1", {"CPU": 1.0}, {"nodes": [node("head", runs_turns=False), node("w1"), node("w2")]})
    assert [(f.name, f.status) for f in sound] == [("cluster", "ok"), ("nodes", "ok")]
    assert sound[1].detail == "every node has ov 0.1.0 and scripted; clocks within 1 s of this machine's"


def test_the_ray_executor_finds_an_unreachable_cluster_at_once() -> None:
    """A plain connect first: Ray's own ``ray.init`` to an address where nothing answers waits minutes."""
    import time

    import pytest

    from overstory.errors import ClusterUnreachable
    from overstory.executors import get_executor
    from overstory.executors.base import TurnSpec

    address = f"127.0.0.1:{closed_port()}"
    executor = get_executor("ray", address=address)
    began = time.monotonic()
    with pytest.raises(ClusterUnreachable, match=f"cannot reach the Ray cluster at {address}: connection refused"):
        executor.submit(TurnSpec("t-unreachable", ("true",), "/"))
    assert time.monotonic() - began < 5
