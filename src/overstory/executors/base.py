"""The interface every turn executor implements: where one turn's process runs.

The agent loop will hand each turn to an executor instead of starting the runtime itself.
An executor answers five small questions, like Ray's ``JobSubmissionClient``:

- ``submit(spec)``: start this command for this turn id. Idempotent per turn id: a second
  submit of the same id (from any process) starts nothing and says so (``Submitted.created``).
- ``lines(turn_id, cursor)``: the turn's stdout, whole lines in order, from an opaque cursor;
  a reader that stops and comes back later (another process too) resumes where it was.
- ``status(turn_id)``: one of five states (``TurnState``), with the reason of a failure, the
  exit code and the node the turn ran on.
- ``stop(turn_id)``: end the turn and everything it started (its process group and the
  processes tagged with its id that left the group), SIGTERM first, SIGKILL after a grace
  (a grace of 0: SIGKILL at once, with no SIGTERM the runtime could act on).
- ``wait(turn_id, timeout)``: block until the turn ends or the timeout passes.

plus ``forget(turn_id)`` to drop what the executor keeps for an ended turn, and ``prepare()`` /
``discard_prepared()`` to get ready for a submit that is coming (the local executor starts its shim early).

An executor never retries a turn by itself: a turn that died with its node is ``lost``, and
what runs again is ov's decision (the ledger's rules), as for a local crash.

Failures that a caller can act on are ``ExecutorError`` subclasses with fields
(``errors.py``); a verb never answers ``None``. Standard library only.
"""

from __future__ import annotations

import abc
import typing as t
from dataclasses import dataclass, field

from overstory.records import Record

# queued: accepted, not yet running (waiting for a node or a slot)
# running: the process runs
# finished: the process exited by itself (``exit_code`` says how: the runtime's result is the turn runner's business)
# failed: it could not run, or it was stopped (``reason`` says which)
# lost: what ran it died (a node or the process that watched it): nobody knows how the turn ended
if t.TYPE_CHECKING:
    TurnState = t.Literal["queued", "running", "finished", "failed", "lost"]
else:  # typing is deferred in an agent loop (overstory.deferred)
    TurnState = str
TURN_STATES: tuple[TurnState, ...] = ("queued", "running", "finished", "failed", "lost")
ENDED: frozenset[str] = frozenset({"finished", "failed", "lost"})
STOPPED = "stopped"  # the reason of a failed turn that was stopped through the executor


@dataclass(frozen=True)
class TurnSpec:
    """What to run for one turn: the same shape for every executor, and on the wire to a node."""

    turn_id: str
    argv: tuple[str, ...]
    cwd: str
    env: t.Mapping[str, str] = field(default_factory=dict)
    stdin: bytes = b""
    labels: t.Mapping[str, str] = field(default_factory=dict)  # e.g. {"agent": NAME}: shown, never interpreted
    # A turn whose workspace travels to its node by git (``executors.travel_node``): the control node's endpoint
    # (HOST:PORT), the sandbox layout's paths, whether it is sandboxed. Empty: the node runs it in place.
    travel: t.Mapping[str, t.Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.turn_id or "/" in self.turn_id or self.turn_id in (".", ".."):
            raise ValueError(f"unusable turn id {self.turn_id!r}")
        if not self.argv:
            raise ValueError("a turn needs a command")

    def to_wire(self) -> dict[str, t.Any]:
        return {"turn_id": self.turn_id, "argv": list(self.argv), "cwd": self.cwd, "env": dict(self.env),
                "stdin": self.stdin.decode("latin-1"), "labels": dict(self.labels),
                "travel": dict(self.travel)}

    @classmethod
    def from_wire(cls, data: t.Mapping[str, t.Any]) -> TurnSpec:
        return cls(turn_id=str(data["turn_id"]), argv=tuple(str(a) for a in data["argv"]), cwd=str(data["cwd"]),
                   env={str(k): str(v) for k, v in dict(data.get("env") or {}).items()},
                   stdin=str(data.get("stdin") or "").encode("latin-1"),
                   labels={str(k): str(v) for k, v in dict(data.get("labels") or {}).items()},
                   travel=dict(data.get("travel") or {}))


class Submitted(Record):
    """A turn handed to an executor."""

    __slots__ = ("turn_id", "created")

    turn_id: str
    created: bool  # False: the id was submitted before; nothing new was started


class TurnStatus(Record):
    """Where a submitted turn is."""

    __slots__ = ("turn_id", "state", "reason", "exit_code", "node", "pid", "started_ms", "ended_ms")
    _defaults = {"reason": "", "exit_code": None, "node": None, "pid": None, "started_ms": None, "ended_ms": None}

    turn_id: str
    state: TurnState
    reason: str
    exit_code: int | None
    node: str | None  # where it ran: a host name (local) or a Ray node id
    pid: int | None   # the command's process id on that node
    started_ms: int | None
    ended_ms: int | None

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    def as_dict(self) -> dict[str, t.Any]:
        return {"turn_id": self.turn_id, "state": self.state, "reason": self.reason, "exit_code": self.exit_code,
                "node": self.node, "pid": self.pid, "started_ms": self.started_ms, "ended_ms": self.ended_ms}


class Lines(Record):
    """A batch of a turn's stdout lines (without their newline) and the cursor to read on from."""

    __slots__ = ("lines", "cursor", "done")

    lines: tuple[str, ...]
    cursor: int
    done: bool  # the turn ended and there is nothing more to read after ``cursor``


class TurnExecutor(abc.ABC):
    """Where turns run. One instance may be used from several threads; every verb may be called from
    any process of the project (the state it needs lives with the executor, not in the caller)."""

    kind: t.ClassVar[str]

    @abc.abstractmethod
    def submit(self, spec: TurnSpec) -> Submitted: ...

    @abc.abstractmethod
    def lines(self, turn_id: str, cursor: int = 0, *, timeout: float = 0.0) -> Lines:
        """Lines after ``cursor``; waits up to ``timeout`` seconds for at least one (or the end)."""

    @abc.abstractmethod
    def status(self, turn_id: str) -> TurnStatus: ...

    @abc.abstractmethod
    def stop(self, turn_id: str, *, grace: float = 5.0) -> TurnStatus:
        """End the turn (no-op if it ended); returns its status once it has ended. ``grace`` 0 kills at once
        (SIGKILL, no SIGTERM first): a turn stopped for its budget, a park or a stall must not take one more step."""

    def wait(self, turn_id: str, timeout: float | None = None, *, poll: float = 0.1) -> TurnStatus:
        """The status once the turn has ended, or its current one when ``timeout`` passes first."""
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.status(turn_id)
            if status.ended or (deadline is not None and time.monotonic() >= deadline):
                return status
            time.sleep(poll if deadline is None else max(0.0, min(poll, deadline - time.monotonic())))

    @abc.abstractmethod
    def forget(self, turn_id: str) -> None:
        """Drop what is kept for an ended turn (its lines); a turn that still runs is stopped first."""

    def prepare(self) -> None:  # noqa: B027 - optional, like close
        """Get ready for a submit that is coming soon (a turn being prepared), so it starts faster. Whoever
        calls it and then does not submit calls ``discard_prepared``. By default there is nothing to prepare."""

    def discard_prepared(self) -> None:  # noqa: B027 - optional, like close
        """Let go of what ``prepare`` made and no submit used (no-op when there is none)."""

    def stderr_tail(self, turn_id: str, size: int = 4096) -> str:
        """The end of an ended turn's stderr (what a runtime says when it fails), as far as it is kept."""
        return ""

    def watch(self, turn_id: str) -> t.Any:
        """Something with ``fileno``, ``drain`` and ``close`` whose descriptor becomes readable when the turn
        writes or ends (``executors.changes.FolderWatch``), for a reader to sleep on; None: read again later."""
        return None

    def close(self) -> None:  # noqa: B027 - an optional verb with a safe default, like a runtime's hooks
        """Let go of connections; turns keep running."""
