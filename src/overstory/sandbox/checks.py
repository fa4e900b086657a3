"""Running a check or gate over agent-written code: in the agent's boundary, tied to whoever runs it.

A loop's check, a phase's gate and a merge gate run what an agent wrote (its tests, a
``conftest.py``, a ``pytest.py`` that shadows pytest). ``run_check`` runs one such shell
command in a scratch checkout (``check_tree``):

- inside bubblewrap, with the same boundary as the agent's turns (``bwrap.build_check_argv``):
  nothing outside the checkout, the private /tmp and ``sandbox.writable`` is writable,
  ``.overstory`` is read-only, every agent's run dir (endpoint sockets, secrets) and worktree
  is hidden. ``sandbox.mode: off`` runs it without one, as the agents' turns run then;
- with an environment that holds no agent secret: no ``OVERSTORY_*`` variable (the endpoint's
  token), no model API key of any runtime or configured provider;
- in the project's Python environment, not ov's: the virtual environment ov itself runs from is
  taken off PATH (and out of ``VIRTUAL_ENV``), and the project's own (``loop.check_env``, else
  ``.venv`` at the project root, when there is one) goes first on PATH (``CheckEnv`` says which
  was used and which ``python`` the command finds);
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
import shutil
import subprocess
import sys
import time
import typing as t
from dataclasses import dataclass
from pathlib import Path

from overstory import procs
from overstory.config.snapshot import network_for
from overstory.errors import SandboxError
from overstory.sandbox.gitrefs import _REDIRECTING

if t.TYPE_CHECKING:
    from overstory.config.model import Config
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
    environment: CheckEnv | None = None


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


@dataclass(frozen=True)
class CheckEnv:
    """The Python environment a check ran in: its virtual environment (None: none) and what `python` was."""
    venv: str | None
    python: str | None   # what ``python`` (else ``python3``) on the check's PATH is; None: neither is there
    configured: bool = False  # the venv came from ``loop.check_env``

    def describe(self) -> str:
        python = f"`python` is {self.python}" if self.python else "no `python` (or `python3`) on its PATH"
        if self.venv is not None:
            return f"{python} (virtual environment {self.venv}" + (", loop.check_env)" if self.configured else ")")
        return (f"{python} (no project virtual environment: no .venv at the project root; "
                "make one, or name one with loop.check_env)")

    def as_dict(self) -> dict[str, t.Any]:
        return {"venv": self.venv, "python": self.python, "configured": self.configured}


def _own_venv_bins() -> set[str]:
    """The bin directories of the virtual environment ov runs from (none when it runs from a system Python)."""
    if sys.prefix == sys.base_prefix:
        return set()
    bins = {os.path.join(sys.prefix, "bin"), os.path.dirname(sys.executable)}
    return bins | {os.path.realpath(b) for b in bins}


def project_venv(config: Config, root: Path) -> tuple[Path | None, bool]:
    """(the virtual environment checks use, whether ``loop.check_env`` named it). SandboxError when the
    configured one is not a virtual environment (the check must not silently run in another)."""
    configured = getattr(config.loop, "check_env", None)
    if configured:
        venv = Path(os.path.expanduser(configured))
        venv = venv if venv.is_absolute() else root / venv
        if not (venv / "bin" / "python").exists():
            raise SandboxError(f"loop.check_env {configured}: {venv} is not a virtual environment (no bin/python)")
        return venv, True
    venv = root / ".venv"
    return (venv, False) if (venv / "bin" / "python").exists() else (None, False)


def check_env(environ: t.Mapping[str, str], config: Config, root: Path) -> tuple[dict[str, str], CheckEnv]:
    """The environment a check starts from: ``environ`` without agent secrets and without ov's own virtual
    environment, the project's first on PATH; and what that environment is."""
    secret = credential_names(config)
    env = {k: v for k, v in environ.items()
           if not k.startswith("OVERSTORY_") and k not in secret and k not in _REDIRECTING
           and not k.startswith("GIT_CONFIG_") and not (k.startswith("OV_") and k.endswith("_API_KEY"))}
    own = _own_venv_bins()
    if own:
        kept = [d for d in env.get("PATH", os.defpath).split(os.pathsep)
                if d and d not in own and os.path.realpath(d) not in own]
        env["PATH"] = os.pathsep.join(kept)
        active = env.get("VIRTUAL_ENV")
        if active and {os.path.join(active, "bin"), os.path.realpath(os.path.join(active, "bin"))} & own:
            env.pop("VIRTUAL_ENV")
    venv, configured = project_venv(config, root)
    if venv is not None:
        env["VIRTUAL_ENV"] = str(venv)
        env["PATH"] = str(venv / "bin") + os.pathsep + env.get("PATH", os.defpath)
        env.pop("PYTHONHOME", None)
    path = env.get("PATH", os.defpath)
    python = shutil.which("python", path=path) or shutil.which("python3", path=path)
    return env, CheckEnv(str(venv) if venv is not None else None, python, configured)


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
    env, described = check_env(environ, config, root)
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
    return Ran(None if timed_out or stopped else code, time.monotonic() - started, sandboxed, timed_out, stopped,
               described)


def _write_record(record: Path, data: dict[str, t.Any]) -> None:
    """Atomically: a reader sees the whole record or none."""
    record.parent.mkdir(parents=True, exist_ok=True)
    partial = record.with_name(record.name + ".partial")
    partial.write_text(json.dumps(data), encoding="utf-8")
    os.replace(partial, record)
