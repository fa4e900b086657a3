"""The local executor: a turn is a process group on this machine, as ``agents/turns.py`` starts it today.

Each turn has a folder ``<state_dir>/<turn_id>/``, and the folder is the truth, so every verb works
from any process of the project (the loop that submitted, the watchdog, ``ov stop``):

- ``mkdir`` of the folder is the claim: a second submit of the same id finds it and starts nothing;
- the command runs under the shim (``executors.shim``) in a process group of its own, reading
  ``stdin`` and writing ``stdout``/``stderr`` in the folder; the shim writes ``proc.json`` (pid, group,
  start ticks) once it runs and ``exit.json`` when it ends, so a turn outlives whoever submitted it;
- ``stop.json`` says the turn was stopped through the executor (its status is then ``failed: stopped``);
- a cursor is a byte offset into ``stdout``.

The shim can be started before its turn is known (``prepare``, as the agent loop begins a turn): it waits
on its spec pipe with its stdio on /dev/null, and the spec names the folder and the files it takes as the
command's stdin/stdout/stderr. A cold submit starts one the same way, so both run one path. A prepared
shim that gets no spec (discarded, or the process holding its pipe died) exits having started nothing.

Any argv runs this way, the sandbox's bwrap command line included; stopping uses ``procs.kill_turn``
(SIGTERM to the sandboxed commands or the group, then SIGKILL, then the processes tagged with the turn id).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
import typing as t
from pathlib import Path

from overstory import jsontext, procs
from overstory.clock import now_ms
from overstory.errors import TurnNotFound
from overstory.executors.base import STOPPED, Lines, Submitted, TurnExecutor, TurnSpec, TurnStatus
from overstory.executors.changes import FolderWatch
from overstory.executors.shim import shim_command, shim_environment

START_WAIT_SECONDS = 30.0
POLL_SECONDS = 0.02
FIRST_POLL_SECONDS = 0.001  # a submit's first look for the shim's proc.json; the wait doubles up to POLL_SECONDS


class LocalExecutor(TurnExecutor):
    kind = "local"

    def __init__(self, state_dir: str | os.PathLike[str], *, die_with_submitter: bool = False) -> None:
        """``die_with_submitter``: a turn is killed when the process that submitted it dies (as a bubblewrap
        sandbox's ``--die-with-parent`` would do without the shim in between); otherwise it outlives it."""
        self.root = Path(state_dir)
        self.die_with_submitter = die_with_submitter
        self.root.mkdir(parents=True, exist_ok=True)
        self._prepared: _Shim | None = None  # a shim started ahead of the next submit (``prepare``)
        self._lock = threading.Lock()

    def _dir(self, turn_id: str) -> Path:
        TurnSpec(turn_id, ("-",), "")  # the same rule for ids as a spec's (no path separators)
        return self.root / turn_id

    def _read(self, turn_id: str, name: str) -> dict[str, t.Any] | None:
        try:
            return dict(jsontext.loads((self._dir(turn_id) / name).read_text(encoding="utf-8")))
        except (OSError, ValueError):
            return None

    def prepare(self) -> None:
        """Start the next turn's shim now, while the turn is being prepared: it waits for its spec, and its
        Python start-up (milliseconds) is then off the turn's critical path. ``submit`` uses it; whoever
        prepared it and did not submit calls ``discard_prepared``. A shim this process started early
        (``start_early``) is taken instead when it was started the same way."""
        with self._lock:
            if self._prepared is not None:
                return
        shim = _take_early(self.die_with_submitter)
        if shim is None:
            try:
                shim = _new_shim(self.die_with_submitter)
            except OSError:
                return  # submit starts one itself, and says why when it cannot either
        with self._lock:
            taken = self._prepared is None
            if taken:
                self._prepared = shim
        if not taken:  # another thread prepared one meanwhile
            _end_shim(shim)

    def discard_prepared(self) -> None:
        """End a prepared shim that no submit took: its pipe closes, it reads the end and exits having started
        nothing; it is our child, so it is waited for here."""
        with self._lock:
            shim, self._prepared = self._prepared, None
        if shim is not None:
            _end_shim(shim)

    def _take_prepared(self) -> _Shim | None:
        with self._lock:
            shim, self._prepared = self._prepared, None
        if shim is not None and shim.process.poll() is not None:  # it died waiting: not one to hand a turn to
            _end_shim(shim)
            return None
        return shim

    def submit(self, spec: TurnSpec) -> Submitted:
        folder = self._dir(spec.turn_id)
        try:
            folder.mkdir()
        except FileExistsError:
            return Submitted(spec.turn_id, created=False)
        _write_json(folder / "claim.json", {"pid": os.getpid(), "ticks": procs.start_ticks(os.getpid()),
                                            "ms": now_ms(), "labels": dict(spec.labels)})
        (folder / "stdin").write_bytes(spec.stdin)
        env = dict(spec.env)
        env.setdefault(procs.TURN_TAG, spec.turn_id)  # how stragglers that leave the group are found
        text = jsontext.dumps({"turn_id": spec.turn_id, "argv": list(spec.argv), "cwd": spec.cwd, "env": env,
                               "record_dir": str(folder),
                               "stdio": {name: str(folder / name) for name in ("stdin", "stdout", "stderr")}})
        shim = self._take_prepared()
        if shim is not None and not shim.hand(text):  # it died before reading it: start one as if none was ready
            _end_shim(shim)
            shim = None
        if shim is None:
            try:
                with open(folder / "stderr", "ab") as stderr:
                    shim = _new_shim(self.die_with_submitter, stderr)
            except OSError as exc:
                _write_json(folder / "failed.json", {"reason": f"cannot start the shim: {exc.strerror or exc}",
                                                     "ended_ms": now_ms()})
                return Submitted(spec.turn_id, created=True)
            shim.hand(text)
        process = shim.process
        deadline = time.monotonic() + START_WAIT_SECONDS
        pause = FIRST_POLL_SECONDS
        while time.monotonic() < deadline:  # until the command runs (or could not start): milliseconds, mostly
            if any((folder / name).exists() for name in ("proc.json", "failed.json")) or process.poll() is not None:
                break
            time.sleep(pause)
            pause = min(pause * 2, POLL_SECONDS)
        if process.poll() is not None and not (folder / "proc.json").exists() and not (folder / "failed.json").exists():
            tail = _tail(folder / "stderr", 300).strip()
            reason = f"the shim exited ({process.returncode}) before the command started: {tail}"
            _write_json(folder / "failed.json", {"reason": reason, "ended_ms": now_ms()})
        return Submitted(spec.turn_id, created=True)

    def status(self, turn_id: str) -> TurnStatus:
        folder = self._dir(turn_id)
        if not folder.is_dir():
            raise TurnNotFound(turn_id, self.kind)
        failed = self._read(turn_id, "failed.json")
        if failed is not None:
            return TurnStatus(turn_id, "failed", str(failed.get("reason") or "could not start"),
                              ended_ms=failed.get("ended_ms"))
        proc = self._read(turn_id, "proc.json")
        stop = self._read(turn_id, "stop.json")
        if proc is None:  # claimed; the submit that claimed it is starting it, or died doing so
            if self._submitting(turn_id):
                return TurnStatus(turn_id, "queued")
            if stop is not None:
                return TurnStatus(turn_id, "failed", STOPPED)
            return TurnStatus(turn_id, "lost", "the process that submitted it died before it started")
        where: dict[str, t.Any] = {"node": proc.get("node"), "pid": proc.get("pid"),
                                   "started_ms": proc.get("started_ms")}
        ended = self._read(turn_id, "exit.json")
        if ended is not None:
            code = ended.get("exit_code")
            if stop is not None:
                return TurnStatus(turn_id, "failed", STOPPED, exit_code=code, ended_ms=ended.get("ended_ms"), **where)
            return TurnStatus(turn_id, "finished", f"exited with {code}", exit_code=code,
                              ended_ms=ended.get("ended_ms"), **where)
        if procs.is_alive(proc.get("shim_pid")) or procs.group_alive(proc.get("pgid"), proc.get("ticks")):
            return TurnStatus(turn_id, "running", **where)
        if (folder / "exit.json").exists():  # written between our two reads
            return self.status(turn_id)
        return TurnStatus(turn_id, "lost", "its process ended and nothing recorded how (its shim was killed)",
                          **where)

    def _submitting(self, turn_id: str) -> bool:
        """The process that claimed the turn lives (and, as the turn has no proc.json yet, is starting it)."""
        claim = self._read(turn_id, "claim.json")
        if claim is None:  # claimed this instant (claim.json comes right after the folder), or died right there
            try:
                return time.time() - self._dir(turn_id).stat().st_mtime < START_WAIT_SECONDS
            except OSError:
                return False
        return procs.is_alive(claim.get("pid"), claim.get("ticks"))

    def lines(self, turn_id: str, cursor: int = 0, *, timeout: float = 0.0) -> Lines:
        path = self._dir(turn_id) / "stdout"
        deadline = time.monotonic() + timeout
        while True:
            ended = self.status(turn_id).ended  # before reading: a turn that ended has written everything
            try:
                with open(path, "rb") as handle:
                    handle.seek(cursor)
                    chunk = handle.read()
            except FileNotFoundError:
                chunk = b""
            complete = chunk if ended else chunk[: chunk.rfind(b"\n") + 1]
            if complete or ended or time.monotonic() >= deadline:
                text = complete.decode("utf-8", errors="replace")
                found = tuple(text[:-1].split("\n") if text.endswith("\n") else text.split("\n")) if text else ()
                return Lines(found, cursor + len(complete), done=ended)
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    def stop(self, turn_id: str, *, grace: float = 5.0) -> TurnStatus:
        status = self.status(turn_id)
        if status.ended:
            return status
        folder = self._dir(turn_id)
        _write_json(folder / "stop.json", {"ms": now_ms(), "by_pid": os.getpid()})
        # A turn being submitted this instant: its shim either sees stop.json and never starts the command,
        # or has started it and writes proc.json right away.
        deadline = time.monotonic() + START_WAIT_SECONDS
        while (proc := self._read(turn_id, "proc.json")) is None and time.monotonic() < deadline \
                and not (folder / "failed.json").exists() and self._submitting(turn_id):
            time.sleep(POLL_SECONDS)
        if proc is not None:
            procs.kill_turn(proc.get("pgid"), proc.get("ticks"), turn_id, grace=grace, force=grace <= 0)
        return self.wait(turn_id, timeout=grace + 5)

    def watch(self, turn_id: str) -> FolderWatch | None:
        """The turn's folder watched: its stdout written, exit.json renamed into it (None where inotify is not)."""
        return FolderWatch.open(self._dir(turn_id))

    def stderr_tail(self, turn_id: str, size: int = 4096) -> str:
        return _tail(self._dir(turn_id) / "stderr", size)

    def process_group(self, turn_id: str) -> tuple[int, int | None] | None:
        """The command's process group and its leader's start ticks, as the shim recorded them when it started
        the command (not the shim's own: it is outside the group); None before it runs. What the watchdog and
        ``ov stop`` signal: the ticks keep them from signalling a group that reused the id after this one ended."""
        proc = self._read(turn_id, "proc.json")
        if proc is None or not proc.get("pgid"):
            return None
        ticks = proc.get("ticks")
        return int(proc["pgid"]), int(ticks) if ticks is not None else None

    def forget(self, turn_id: str) -> None:
        folder = self._dir(turn_id)
        if not folder.is_dir():
            return
        if not self.status(turn_id).ended:
            self.stop(turn_id)
        _remove_flat(folder)


class _Shim:
    """A started shim and the write end of the pipe it reads its spec from (only this process holds it, so the
    shim sees the pipe's end when we close it or die)."""

    def __init__(self, process: subprocess.Popen[bytes], spec_fd: int) -> None:
        self.process = process
        self.spec_fd: int | None = spec_fd

    def hand(self, text: str) -> bool:
        """Write the spec and close the pipe; False when the shim is gone (it died before reading it)."""
        fd, self.spec_fd = self.spec_fd, None
        if fd is None:
            return False
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
        except BrokenPipeError:
            return False
        return True


def _new_shim(die_with_submitter: bool, stderr: t.IO[bytes] | None = None) -> _Shim:
    """A shim that waits for its spec on a pipe (stdio on /dev/null until the spec names the turn's files;
    ``stderr``: where it complains before then); ``die_with_submitter``: it watches this process."""
    read_spec, write_spec = os.pipe()
    watch = ["--watch-parent", str(os.getpid())] if die_with_submitter else []
    try:
        process = subprocess.Popen([*shim_command(), "--spec-fd", str(read_spec), *watch],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=stderr if stderr is not None else subprocess.DEVNULL,
                                   pass_fds=(read_spec,), start_new_session=True,
                                   env=shim_environment(os.environ), cwd="/")
    except OSError:
        os.close(write_spec)
        raise
    finally:
        os.close(read_spec)
    return _Shim(process, write_spec)


# A shim started before this process knew it would have a turn to run: a warm loop waiting for its word
# (agents.warm_up) starts one for its first turn. Taken by the first prepare that starts shims the same way;
# ended by ``discard_early`` when it will not be (the agent's turns run elsewhere, or it has no turn to run).
# If the process dies first, the shim reads the end of its pipe and exits, having started nothing.
_early: tuple[bool, _Shim] | None = None
_early_lock = threading.Lock()


def start_early(*, die_with_submitter: bool) -> None:
    """Start this process's next turn's shim now, before its executor exists (at most one waits)."""
    global _early
    with _early_lock:
        if _early is not None:
            return
        try:
            _early = (die_with_submitter, _new_shim(die_with_submitter))
        except OSError:
            pass  # the turn starts one itself


def discard_early() -> None:
    """End the early shim if no turn took it (a no-op when there is none)."""
    global _early
    with _early_lock:
        early, _early = _early, None
    if early is not None:
        _end_shim(early[1])


def _take_early(die_with_submitter: bool) -> _Shim | None:
    """The early shim when it was started the way this executor starts them and still waits; else None (and a
    mismatched or dead one is ended)."""
    global _early
    with _early_lock:
        early, _early = _early, None
    if early is None:
        return None
    started_for, shim = early
    if started_for != die_with_submitter or shim.process.poll() is not None:
        _end_shim(shim)
        return None
    return shim


def _end_shim(shim: _Shim, timeout: float = 5.0) -> None:
    """Close a shim's pipe unused and reap it: it exits as soon as it reads the end (SIGKILL if it has not in
    ``timeout`` seconds; it is our own child and has started nothing)."""
    if shim.spec_fd is not None:
        os.close(shim.spec_fd)
        shim.spec_fd = None
    try:
        shim.process.wait(timeout)
    except subprocess.TimeoutExpired:
        shim.process.kill()
        shim.process.wait()


def _write_json(path: Path, data: dict[str, t.Any]) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(jsontext.dumps(data), encoding="utf-8")
    os.replace(temporary, path)


def _remove_flat(folder: Path) -> None:
    """Remove a turn's folder: it holds files only (not shutil.rmtree: an idle agent loop must not import
    shutil, which brings bz2 and lzma; tests/test_idle_loop_imports.py)."""
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
        os.rmdir(folder)
    except OSError:
        pass  # a file appeared meanwhile, or another process removed it first: a leftover folder is harmless


def _tail(path: Path, size: int = 300) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - size))
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
