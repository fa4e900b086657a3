"""The small process between an executor and a turn's command (``python -m overstory.executors.shim``).

It starts the command in a process group of its own, says which process that is, waits for it, stops what it
left running in its group or tagged with its turn id, and records how it ended. The shim is not in the
command's group and does not carry the turn's tag (``procs.TURN_TAG``), so stopping the turn never stops the
shim before it has recorded the end.

The command's spec comes as JSON on ``--spec-fd``: {"argv", "cwd", "env", "turn_id"}, and from the local
executor also "record_dir" and "stdio".

- "record_dir" (the local executor): ``proc.json`` once the command runs and ``exit.json`` when it ends are
  written there, so a turn outlives the process that submitted it and any process can read how it ended (as
  containerd's shim does for a container). "stdio" names the files the shim opens as the command's fds 0/1/2
  (stdout and stderr to append). So a shim can be started before its turn's folder exists and wait for its
  spec (``LocalExecutor.prepare``): one whose pipe ends with no spec exits having started and written nothing.
- ``--report-fd N`` (a Ray node): the same records as lines on that pipe, with the stdio the shim was given.
- ``--watch-parent PID`` (a Ray node, and a sandboxed local turn): when the process that started the shim dies,
  the shim kills the turn's group and every process tagged with the turn id: a turn whose worker or node died
  must not go on committing on nobody's behalf.

Standard library and ``procs`` (with ``jsontext``, json without the json package) only, and few of those (no
argparse, socket, typing or subprocess: its imports, signal's enum among them, were half the shim's start-up):
every turn starts one, between the loop and the runtime.
"""

from __future__ import annotations

import os
import sys

from overstory import jsontext, procs
from overstory.clock import now_ms

TYPE_CHECKING = False
if TYPE_CHECKING:
    import typing as t

POLL_SECONDS = 0.1
LEFTOVER_GRACE = 1.0  # seconds between SIGTERM and SIGKILL for what a command left running


def shim_command(python: str = sys.executable) -> list[str]:
    return [python, "-m", "overstory.executors.shim"]


def shim_environment(environ: t.Mapping[str, str]) -> dict[str, str]:
    """The shim's own environment: the launcher's, without a turn tag (the shim must not look like the turn)."""
    return {key: value for key, value in environ.items() if key != procs.TURN_TAG}


def _write_json(directory: str | None, name: str, data: dict[str, t.Any], *, durable: bool = True) -> None:
    """``data`` as ``directory/name``, whole or not at all (a temporary file renamed over it). ``durable``: synced
    to disk first, for what must survive the machine; ``proc.json`` need not (after a reboot its pids name
    nothing), and its sync (a few ms on ext4) would delay every turn's start."""
    if not directory:
        return
    temporary = os.path.join(directory, f".{name}.{os.getpid()}")
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(jsontext.dumps(data))
        handle.flush()
        if durable:
            os.fsync(handle.fileno())
    os.replace(temporary, os.path.join(directory, name))


def _report(fd: int | None, data: dict[str, t.Any]) -> None:
    if fd is None:
        return
    try:
        os.write(fd, (jsontext.dumps(data) + "\n").encode())
    except OSError:
        pass  # the reader is gone (its worker died): the record dir, or the kill below, still hold


def _take_stdio(files: t.Mapping[str, str]) -> None:
    """Put the spec's files on fds 0/1/2: the command inherits them, and so do the shim's own errors from here on."""
    for fd, (name, flags) in enumerate((("stdin", os.O_RDONLY), ("stdout", os.O_WRONLY | os.O_APPEND | os.O_CREAT),
                                        ("stderr", os.O_WRONLY | os.O_APPEND | os.O_CREAT))):
        opened = os.open(files[name], flags, 0o644)
        if opened != fd:
            os.dup2(opened, fd)
            os.close(opened)


def _read_spec(fd: int) -> dict[str, t.Any] | None:
    """The spec, or None when the pipe ended without a whole one (the turn was never submitted: its loop
    failed before the launch, discarded this shim, or died)."""
    with os.fdopen(fd, encoding="utf-8") as handle:
        text = handle.read()
    if not text.strip():
        return None
    try:
        spec = jsontext.loads(text)
    except ValueError:  # cut off: its writer died while writing
        return None
    return spec if isinstance(spec, dict) else None


def _detach_stdio() -> None:
    """Drop our copies of the command's stdio: its reader sees the end of stdout when the command's side ends."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


def _start(argv: list[str], cwd: str, env: dict[str, str]) -> int:
    """Start ``argv`` in a session (and process group) of its own, as ``subprocess.Popen(start_new_session=True)``
    would: its pid, or the OSError that kept it from running (told back on a pipe that exec closes)."""
    import _signal  # type: ignore[import-not-found]  # signal's C half (the module imports enum)

    failed, failing = os.pipe()  # both close-on-exec
    pid = os.fork()
    if pid == 0:  # the child: only os calls until exec (this process has one thread)
        code = 127
        try:
            os.close(failed)
            for number in ("SIGPIPE", "SIGXFSZ"):  # Python ignores these; the command gets the defaults
                if hasattr(_signal, number):
                    _signal.signal(getattr(_signal, number), _signal.SIG_DFL)
            os.setsid()
            os.chdir(cwd)
            os.execvpe(argv[0], argv, env)
        except OSError as exc:
            os.write(failing, f"{exc.errno or 0} {exc.strerror or exc}".encode())
        finally:
            os._exit(code)
    os.close(failing)
    with os.fdopen(failed, "rb") as pipe:
        told = pipe.read()
    if told:
        os.waitpid(pid, 0)
        number, _, text = told.decode(errors="replace").partition(" ")
        raise OSError(int(number) if number.isdigit() else 0, text)
    return pid


class _Ended:
    """The command's exit status, waited for at most a while at a time (a pidfd where Linux has them)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        try:
            self.pidfd: int | None = os.pidfd_open(pid)
        except (OSError, AttributeError):
            self.pidfd = None

    def wait(self, seconds: float) -> int | None:
        """The exit code (negative: the signal that ended it), or None if it still runs after ``seconds``."""
        if self.pidfd is not None:
            import select

            select.select([self.pidfd], [], [], seconds)
        done, status = os.waitpid(self.pid, os.WNOHANG)
        if done == 0:
            if self.pidfd is None:
                import time

                time.sleep(min(seconds, 0.01))
            return None
        if self.pidfd is not None:
            os.close(self.pidfd)
        return os.waitstatus_to_exitcode(status)


class _Args:
    def __init__(self, argv: t.Sequence[str]) -> None:
        """``--spec-fd N [--report-fd N] [--watch-parent PID]``: only ov starts the shim."""
        options = dict(zip(argv[::2], argv[1::2], strict=True))
        unknown = set(options) - {"--spec-fd", "--report-fd", "--watch-parent"}
        if unknown or "--spec-fd" not in options:
            raise SystemExit(f"overstory.executors.shim: bad arguments {list(argv)}")
        self.spec_fd = int(options["--spec-fd"])
        self.report_fd = int(options["--report-fd"]) if "--report-fd" in options else None
        self.watch_parent = int(options["--watch-parent"]) if "--watch-parent" in options else None


def main(argv: t.Sequence[str] | None = None) -> int:
    try:
        args = _Args(sys.argv[1:] if argv is None else argv)
    except ValueError as exc:  # an odd count of words, or a number that is not one
        raise SystemExit(f"overstory.executors.shim: bad arguments ({exc})") from None
    spec = _read_spec(args.spec_fd)
    if spec is None:
        return 0  # nothing to run, nothing to record
    turn_id = str(spec["turn_id"])
    record_dir = spec.get("record_dir")
    if spec.get("stdio"):
        try:
            _take_stdio(spec["stdio"])
        except OSError as exc:  # the turn's folder went away (forgotten) before its shim got here
            _write_json(record_dir, "failed.json", {"reason": f"cannot open the turn's stdio: {exc.strerror or exc}",
                                                    "ended_ms": now_ms()})
            return 127
    if record_dir and os.path.exists(os.path.join(record_dir, "stop.json")):
        _write_json(record_dir, "failed.json", {"reason": "stopped", "ended_ms": now_ms()})
        return 143  # stopped before it started
    if args.report_fd is not None:
        os.set_inheritable(args.report_fd, False)  # ours, not the command's
    try:
        pid = _start(spec["argv"], spec["cwd"], spec["env"])
    except OSError as exc:
        reason = f"cannot start {spec['argv'][0]}: {exc.strerror or exc}"
        _write_json(record_dir, "failed.json", {"reason": reason, "ended_ms": now_ms()})
        _report(args.report_fd, {"error": reason})
        return 127
    ticks = procs.start_ticks(pid)
    started = {"pid": pid, "pgid": pid, "ticks": ticks, "node": os.uname().nodename,
               "started_ms": now_ms(), "shim_pid": os.getpid()}
    _write_json(record_dir, "proc.json", started, durable=False)
    _report(args.report_fd, started)
    _detach_stdio()
    orphaned = False
    ended = _Ended(pid)
    while (code := ended.wait(POLL_SECONDS)) is None:
        if args.watch_parent and not orphaned and os.getppid() != args.watch_parent:
            orphaned = True  # the worker that ran the turn died: take the turn down with it
            procs.kill_turn(pid, ticks, turn_id, force=True)
    # What the command left behind (background shells, a tool that left the group) ends with it.
    procs.kill_turn(pid, ticks, turn_id, grace=LEFTOVER_GRACE, force=orphaned)
    exit_code = code if code >= 0 else 128 - code
    _write_json(record_dir, "exit.json", {"exit_code": exit_code, "ended_ms": now_ms(), "orphaned": orphaned})
    _report(args.report_fd, {"exit_code": exit_code})
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
