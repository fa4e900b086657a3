"""Running a check or gate over agent-written code: in the agent's boundary, tied to whoever runs it.

A loop's check, a phase's gate and a merge gate run what an agent wrote (its tests, a
``conftest.py``, a ``pytest.py`` that shadows pytest). ``run_check`` runs one such shell
command in a scratch checkout (``check_tree``):

- inside bubblewrap, with the same boundary as the agent's turns (``bwrap.build_check_argv``):
  nothing outside the checkout, the private /tmp and ``sandbox.writable`` is writable,
  ``.overstory`` is read-only, every agent's run dir (endpoint sockets, secrets) and worktree
  is hidden. ``sandbox.mode: off`` runs it without one, as the agents' turns run then;
- with an environment that holds no agent secret: no ``OVERSTORY_*`` variable (the endpoint's
  token), no model API key of any runtime or configured provider; the project's own virtual
  environment (``.venv`` at the project root) first on PATH when there is one;
- in a process group of its own, recorded in ``record`` (pgid, leader start time, a tag in the
  environment of everything it starts) while it runs, and tied to the calling process: bwrap's
  ``--die-with-parent`` (without a sandbox, the shell's parent-death signal) kills it when the
  caller dies, and ``kill_leftover`` kills what a caller killed before it could finish left
  running (only processes that carry the recorded tag, or the recorded group while its leader
  is the one ov started), so a restarted loop never runs a second copy beside the first.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import typing as t
from dataclasses import dataclass
from pathlib import Path

from overstory import procs
from overstory.config_snapshot import network_for
from overstory.sandbox.gitrefs import _REDIRECTING

if t.TYPE_CHECKING:
    from overstory.config import Config
    from overstory.paths import ProjectPaths

CHECK_TAG = "OVERSTORY_CHECK_ID"
LOOP_RECORD = "check.json"  # in an agent's run dir while its loop runs a check
POLL_SECONDS = 0.2
# Without a sandbox: the shell gets SIGKILL when the process that started it dies (PR_SET_PDEATHSIG).
_DIE_WITH_PARENT = ("import ctypes, os, sys\n"
                    "ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)\n"
                    "if os.getppid() != int(sys.argv[1]):\n"
                    "    os._exit(137)\n"
                    "os.execv(sys.argv[2], sys.argv[2:])\n")


@dataclass(frozen=True)
class Ran:
    exit_code: int | None   # None when ov stopped it (``timed_out`` or ``stopped``)
    seconds: float
    sandboxed: bool
    timed_out: bool = False
    stopped: bool = False   # the caller is stopping: the check was killed, its result means nothing


def credential_names(config: Config) -> set[str]:
    """Variables that hold a model API key: every runtime's, and each configured provider's."""
    from overstory.runtimes import RUNTIME_NAMES, get_runtime

    names: set[str] = set()
    for runtime in RUNTIME_NAMES:
        names.update(getattr(get_runtime(runtime), "credential_vars", ()) or ())
    for provider in (config.providers or {}).values():
        key = getattr(provider, "api_key_env", None)
        if key:
            names.add(key)
    return names


def check_env(environ: t.Mapping[str, str], config: Config, root: Path) -> dict[str, str]:
    """The environment a check starts from: ``environ`` without agent secrets, the project's venv first."""
    secret = credential_names(config)
    env = {k: v for k, v in environ.items()
           if not k.startswith("OVERSTORY_") and k not in secret and k not in _REDIRECTING
           and not k.startswith("GIT_CONFIG_") and not (k.startswith("OV_") and k.endswith("_API_KEY"))}
    venv = root / ".venv"
    if (venv / "bin" / "python").exists():
        env["VIRTUAL_ENV"] = str(venv)
        env["PATH"] = str(venv / "bin") + os.pathsep + env.get("PATH", os.defpath)
        env.pop("PYTHONHOME", None)
    return env


def loop_record(run_dir: Path, agent: str) -> Path:
    """Where the loop of ``agent`` records the check it runs (read-only inside the agent's sandbox)."""
    return run_dir / agent / LOOP_RECORD


def kill_leftover(record: Path) -> bool:
    """Kill what a check recorded in ``record`` left running (its caller died); True if there was one."""
    try:
        found = json.loads(record.read_text(encoding="utf-8"))
        pgid, ticks, tag = int(found["pgid"]), found.get("ticks"), str(found["tag"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    alive = procs.group_alive(pgid, ticks) or bool(procs.tagged_processes(tag, tag=CHECK_TAG))
    if alive:
        procs.kill_turn(pgid, ticks, tag, force=True, tag=CHECK_TAG)
    try:
        record.unlink()
    except OSError:
        pass
    return alive


def run_check(project: ProjectPaths, config: Config, command: str, tree: Path, *, capability: str,
              environ: t.Mapping[str, str], timeout: float | None, output: t.BinaryIO, record: Path,
              should_stop: t.Callable[[], bool] | None = None) -> Ran:
    """Run ``command`` (bash) in ``tree`` (a scratch checkout under ``.overstory``) as ``capability``'s
    code; its output goes to ``output``. SandboxError when ``sandbox.mode`` is bwrap and bubblewrap does
    not work (the check must not run outside it then)."""
    from overstory.sandbox import effective_mode
    from overstory.sandbox.bwrap import build_check_argv
    from overstory.sandbox.probe import probe

    kill_leftover(record)
    root = project.root.resolve()
    ov_dir = root / project.ov_dir.name
    tree = tree.resolve()
    sandboxed = effective_mode(config).name == "bwrap"
    tag = secrets.token_hex(8)
    env = check_env(environ, config, root)
    env.update({CHECK_TAG: tag, "PWD": str(tree)})
    shell = ["/bin/bash", "-c", command]
    if sandboxed:
        env["TMPDIR"] = "/tmp"
        bwrap = probe().path
        assert bwrap is not None
        argv = build_check_argv(bwrap, root=root, ov_dir=ov_dir, tree=tree, command=shell,
                                network=network_for(config.sandbox, capability),
                                tmp_size_mb=config.sandbox.tmp_size_mb, writable=list(config.sandbox.writable),
                                serve_token=ov_dir / project.serve_token_file.name)
    else:
        argv = [sys.executable, "-I", "-S", "-c", _DIE_WITH_PARENT, str(os.getpid()), *shell]
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=tree, env=env, stdin=subprocess.DEVNULL, stdout=output,
                            stderr=subprocess.STDOUT, start_new_session=True)
    ticks = procs.start_ticks(proc.pid)
    _write_record(record, {"pgid": proc.pid, "ticks": ticks, "tag": tag, "by": os.getpid()})
    code: int | None = None
    timed_out = stopped = False
    try:
        while True:
            try:
                code = proc.wait(timeout=POLL_SECONDS)
                break
            except subprocess.TimeoutExpired:
                pass
            if timeout is not None and time.monotonic() - started > timeout:
                timed_out = True
                break
            if should_stop is not None and should_stop():
                stopped = True
                break
    finally:
        # What it left running in the background goes too; killed by a signal, nothing of it stays.
        procs.kill_turn(proc.pid, ticks, tag, force=True, tag=CHECK_TAG)
        if proc.returncode is None:
            proc.wait()
        try:
            record.unlink()
        except OSError:
            pass
    if code is not None and code < 0:
        code = 128 - code  # killed by a signal: the shell's convention
    return Ran(None if timed_out or stopped else code, time.monotonic() - started, sandboxed, timed_out, stopped)


def _write_record(record: Path, data: dict[str, t.Any]) -> None:
    """Atomically: a reader sees the whole record or none."""
    record.parent.mkdir(parents=True, exist_ok=True)
    partial = record.with_name(record.name + ".partial")
    partial.write_text(json.dumps(data), encoding="utf-8")
    os.replace(partial, record)
