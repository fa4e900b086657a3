"""A working bubblewrap probe is remembered (issue 34): `ov sling` and then the agent's loop each ran it,
two processes each, on the way to the agent's first turn. These tests count the probe's real bwrap runs
through a logging wrapper (OV_BWRAP), each in a new process as `ov sling` and a loop are."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from sandbox_helpers import requires_bwrap

PROBE = "from overstory.sandbox.probe import probe; found = probe(); print(found.ok, found.detail)"


def _wrapper(folder: Path, real: str, *, works: bool = True) -> Path:
    script = folder / "bwrap"
    body = f'exec {real} "$@"' if works else "echo 'bwrap: No permissions to create new namespace' >&2; exit 1"
    script.write_text(f'#!/bin/sh\necho run >> {folder / "runs.log"}\n{body}\n')
    script.chmod(0o755)
    return script


def _probe(folder: Path, bwrap: Path) -> tuple[list[str], int]:
    env = {**{k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}, "OV_BWRAP": str(bwrap),
           "TMPDIR": str(folder / "tmp")}
    log = folder / "runs.log"
    before = len(log.read_text().splitlines()) if log.exists() else 0
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, check=True,
                          timeout=60)
    return done.stdout.split(maxsplit=1), len(log.read_text().splitlines()) - before if log.exists() else 0


@requires_bwrap
def test_a_working_probe_is_asked_once_until_bwrap_changes(tmp_path: Path) -> None:
    real = shutil.which("bwrap")
    assert real is not None
    (tmp_path / "tmp").mkdir()
    bwrap = _wrapper(tmp_path, real)
    (ok, detail), runs = _probe(tmp_path, bwrap)
    assert ok == "True" and runs == 2  # the sandboxed `true`, then `bwrap --version`
    assert _probe(tmp_path, bwrap) == ([ok, detail], 0)
    remembered = tmp_path / "tmp" / f"ov-bwrap-probe-{os.getuid()}.json"
    assert remembered.stat().st_mode & 0o777 == 0o600
    with open(bwrap, "a") as handle:
        handle.write("# another bwrap\n")
    assert _probe(tmp_path, bwrap)[1] == 2
    remembered.chmod(0o666)  # writable by others: not trusted
    assert _probe(tmp_path, bwrap)[1] == 2


def test_a_failing_probe_is_never_remembered(tmp_path: Path) -> None:
    (tmp_path / "tmp").mkdir()
    bwrap = _wrapper(tmp_path, "/bin/false", works=False)
    for _ in range(2):
        (ok, detail), runs = _probe(tmp_path, bwrap)
        assert ok == "False" and "No permissions" in detail and runs == 1
    assert list((tmp_path / "tmp").iterdir()) == []
