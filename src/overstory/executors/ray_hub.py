"""What runs inside the Ray cluster for the ray executor (``ray_executor`` is the side ov talks to).

- ``TurnHub``: one actor per namespace, detached and pinned to the control node (the node ov runs
  on, where the project's state is). It is the turn id's registry (a second submit of an id finds
  the first and starts nothing), the OWNER of every turn's task (so Ray tells it first, within a
  second, when a task's worker or node dies), and the keeper of each turn's output lines, which any
  process can read from a cursor. Being detached, it outlives the ov process that submitted: a
  restarted loop, the watchdog or ``ov stop`` find the same turns.
- ``run_turn``: the task. It starts the turn's command under the shim (``executors.shim``, which takes
  the turn down if this worker dies) and pushes its stdout lines to the hub in small batches; each push
  answers whether the turn was asked to stop. Ray's retries are off (``max_retries=0``,
  ``retry_exceptions=False``): ov decides what runs again.
- ``kill_on_node``: the last resort of a stop, a task pinned to the turn's node that kills its group.

Why a hub actor rather than the task's own return values or one object ref per chunk: object refs
belong to the process that submitted the task, and die with it; a reader in another process (the
watchdog, ``ov stop``, a re-adopted loop) could neither find the turn nor resume its lines. One actor
costs one worker process on the control node for all turns. Nothing here imports ray at module level.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import threading
import time
import typing as t
from collections import deque

from overstory import procs
from overstory.clock import now_ms
from overstory.executors.base import STOPPED, TurnSpec
from overstory.executors.shim import shim_command, shim_environment

HUB_NAME = "ov-turn-hub"
PUSH_SECONDS = 0.1     # lines go to the hub at least this often while they come
POLL_SECONDS = 0.5     # a silent turn still asks the hub whether it was stopped this often
BATCH_LINES = 500
STDERR_TAIL = 4096
# Ray's error types (state API) and exceptions that mean the turn's worker or node died: nobody knows how it ended.
LOST_ERROR_TYPES = frozenset({"WORKER_DIED", "NODE_DIED", "LOCAL_RAYLET_DIED", "OWNER_DIED", "OBJECT_LOST",
                              "OUT_OF_MEMORY", "OBJECT_UNRECONSTRUCTABLE", "OBJECT_FREED"})
LOST_EXCEPTIONS = ("WorkerCrashedError", "NodeDiedError", "LocalRayletDiedError", "OwnerDiedError",
                   "ObjectLostError", "OutOfMemoryError", "ObjectReconstructionFailedError", "ObjectFreedError")


class _Turn:
    def __init__(self, submitted_ms: int) -> None:
        self.submitted_ms = submitted_ms
        self.ref: t.Any = None
        self.task_id: str | None = None
        self.lines: list[str] = []
        self.started: dict[str, t.Any] | None = None
        self.stop_grace: float | None = None
        self.outcome: dict[str, t.Any] | None = None


class TurnHub:
    """The hub actor's class (made an actor by ``ray_executor``: ``ray.remote(TurnHub).options(...)``)."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._turns: dict[str, _Turn] = {}
        self._task: t.Any = None
        self._killer: t.Any = None

    def submit(self, wire: dict[str, t.Any], task_options: dict[str, t.Any]) -> bool:
        """Start the turn's task unless this turn id was submitted before; True if it started now."""
        import ray

        turn_id = str(wire["turn_id"])
        with self._lock:
            if turn_id in self._turns:
                return False
            turn = self._turns[turn_id] = _Turn(now_ms())
            if self._task is None:
                self._task = ray.remote(run_turn)
            me = ray.get_runtime_context().current_actor
            turn.ref = self._task.options(**task_options, name=f"ov-turn:{turn_id}", max_retries=0,
                                          retry_exceptions=False).remote(wire, me)
            turn.task_id = turn.ref.task_id().hex()
            return True

    def begin(self, turn_id: str, node: str) -> str:
        """The task asks to start the command on ``node``: "" (go) once per turn, else why not.

        Ray's retries are off; this is the second lock on the door: an attempt that is not the first (a
        retry someone configured, a duplicate) never starts the command, so a turn never runs twice.
        """
        with self._lock:
            turn = self._turns.get(turn_id)
            if turn is None:
                return "the turn was forgotten before it started"
            if turn.stop_grace is not None:
                return STOPPED
            if turn.started is not None:
                return f"an earlier attempt already started it on node {turn.started.get('node')}"
            turn.started = {"node": node}
            return ""

    def started(self, turn_id: str, info: dict[str, t.Any]) -> float | None:
        """The task says as which process the turn runs; answers the stop grace if it was asked to stop."""
        with self._lock:
            turn = self._turns.get(turn_id)
            if turn is None:
                return 0.0  # forgotten meanwhile: stop it
            turn.started = {**(turn.started or {}), **info}
            self._lock.notify_all()
            return turn.stop_grace

    def push(self, turn_id: str, seq: int, lines: list[str]) -> float | None:
        """Lines ``seq``.. of the turn's stdout (a repeated push adds nothing twice); answers the stop grace."""
        with self._lock:
            turn = self._turns.get(turn_id)
            if turn is None:
                return 0.0
            known = len(turn.lines)
            if seq <= known < seq + len(lines):
                turn.lines.extend(lines[known - seq:])
            if lines:
                self._lock.notify_all()
            return turn.stop_grace

    def read(self, turn_id: str, cursor: int, timeout: float) -> dict[str, t.Any] | None:
        """Lines after ``cursor``, waiting up to ``timeout`` s for one or for the end."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                turn = self._turns.get(turn_id)
                if turn is None:
                    return None
                ended = self._outcome(turn) is not None
                if len(turn.lines) > cursor or ended or time.monotonic() >= deadline:
                    found = turn.lines[cursor:cursor + 5000]
                    return {"lines": found, "cursor": cursor + len(found),
                            "done": ended and cursor + len(found) >= len(turn.lines)}
                self._lock.wait(min(0.2, max(0.0, deadline - time.monotonic())))

    def view(self, turn_id: str) -> dict[str, t.Any] | None:
        with self._lock:
            turn = self._turns.get(turn_id)
            if turn is None:
                return None
            return {"task_id": turn.task_id, "started": turn.started, "outcome": self._outcome(turn),
                    "stop_requested": turn.stop_grace is not None, "submitted_ms": turn.submitted_ms}

    def request_stop(self, turn_id: str, grace: float) -> dict[str, t.Any] | None:
        """Ask the turn to stop: a queued task is cancelled; a running one stops its group at its next push."""
        import ray

        with self._lock:
            turn = self._turns.get(turn_id)
            if turn is None:
                return None
            if self._outcome(turn) is None and turn.stop_grace is None:
                turn.stop_grace = grace
                if turn.started is None:
                    ray.cancel(turn.ref)  # queued: it never starts (if its task runs already, ``begin`` refuses)
        return self.view(turn_id)

    def force_stop(self, turn_id: str) -> dict[str, t.Any] | None:
        """The turn did not stop in time: kill its group on its node, and its task (the worker with it)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        with self._lock:
            turn = self._turns.get(turn_id)
            if turn is None:
                return None
            started = dict(turn.started or {})
        if started.get("pgid") and started.get("node"):
            if self._killer is None:
                self._killer = ray.remote(kill_on_node)
            killer = self._killer.options(num_cpus=0, max_retries=0, name=f"ov-turn-kill:{turn_id}",
                                          scheduling_strategy=NodeAffinitySchedulingStrategy(started["node"],
                                                                                             soft=False))
            try:
                ray.get(killer.remote(started["pgid"], started.get("ticks"), turn_id), timeout=30)
            except Exception:  # noqa: BLE001 - a dead node cannot run it; its shim has done the same
                pass
        try:
            ray.cancel(turn.ref, force=True)
        except Exception:  # noqa: BLE001 - it ended meanwhile
            pass
        return self.view(turn_id)

    def forget(self, turn_id: str) -> None:
        with self._lock:
            self._turns.pop(turn_id, None)

    def turn_ids(self) -> list[str]:
        with self._lock:
            return list(self._turns)

    @staticmethod
    def _outcome(turn: _Turn) -> dict[str, t.Any] | None:
        """How the task ended, once it has (from its object ref: Ray's own word); None while it runs."""
        if turn.outcome is not None:
            return turn.outcome
        import ray

        ready, _ = ray.wait([turn.ref], timeout=0)
        if not ready:
            return None
        try:
            result = ray.get(turn.ref, timeout=0)
        except Exception as exc:  # noqa: BLE001 - Ray's exceptions, sorted by class name below
            name = type(exc).__name__
            first = (str(exc).strip().splitlines() or [name])[0][:300]
            if name == "TaskCancelledError":
                turn.outcome = {"state": "failed", "reason": STOPPED}
            elif name in LOST_EXCEPTIONS or (name == "RayTaskError" and "WorkerCrashedError" in str(exc)):
                turn.outcome = {"state": "lost", "reason": f"{name}: {first}"}
            else:
                turn.outcome = {"state": "failed", "reason": f"{name}: {first}"}
        else:
            turn.outcome = dict(result)
        turn.outcome["ended_ms"] = now_ms()
        return turn.outcome


def run_turn(wire: dict[str, t.Any], hub: t.Any) -> dict[str, t.Any]:
    """The turn's task on a node: run the command under the shim, stream its lines to the hub, return how it ended."""
    import ray

    spec = TurnSpec.from_wire(wire)
    node = ray.get_runtime_context().get_node_id()
    if not spec.travel and not os.path.isdir(spec.cwd):
        return {"state": "failed", "exit_code": None, "reason": f"node {node} does not see the turn's folder {spec.cwd}"
                " (a turn without a travelling workspace runs in the control node's paths)"}
    refused = ray.get(hub.begin.remote(spec.turn_id, node))
    if refused:
        return {"state": "failed", "reason": refused, "exit_code": None}
    away = None
    if spec.travel:  # the workspace comes by git into a mount namespace of the turn's own (executors.travel_node)
        from overstory.executors.travel_node import NodeTurn

        away = NodeTurn(spec.turn_id, spec.travel, spec.env, spec.cwd, node)
        if not away.prepare():
            away.close()
            return {"state": "failed", "exit_code": None,
                    "reason": f"node {node} could not fetch the turn's workspace: {away.error}"}
    try:
        ended = _run_on_node(spec, hub, node, away)
    finally:
        if away is not None:
            away.close()
    return ended


def _run_on_node(spec: TurnSpec, hub: t.Any, node: str, away: t.Any) -> dict[str, t.Any]:
    import ray

    env = dict(spec.env)
    env.setdefault(procs.TURN_TAG, spec.turn_id)
    spec_read, spec_write = os.pipe()
    report_read, report_write = os.pipe()
    try:
        shim = subprocess.Popen([*shim_command(), "--spec-fd", str(spec_read), "--report-fd", str(report_write),
                                 "--watch-parent", str(os.getpid())],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                pass_fds=(spec_read, report_write), start_new_session=True,
                                env=shim_environment(os.environ), cwd="/")
    finally:
        os.close(spec_read)
        os.close(report_write)
    with os.fdopen(spec_write, "w", encoding="utf-8") as handle:
        json.dump({"turn_id": spec.turn_id, "argv": away.command(spec.argv) if away else list(spec.argv),
                   "cwd": "/" if away else spec.cwd, "env": env}, handle)
    reports = os.fdopen(report_read, encoding="utf-8")
    first = json.loads(reports.readline() or '{"error": "the shim exited before starting the command"}')
    if "error" in first:
        shim.wait()
        return {"state": "failed", "reason": str(first["error"]), "exit_code": None}
    stop_grace = ray.get(hub.started.remote(spec.turn_id, {**first, "node": node}))
    stderr_tail: deque[bytes] = deque(maxlen=64)
    threads = [threading.Thread(target=_feed, args=(shim.stdin, spec.stdin), daemon=True),
               threading.Thread(target=_drain, args=(shim.stderr, stderr_tail), daemon=True)]
    for thread in threads:
        thread.start()
    stopping = _Stopper(first["pgid"], first.get("ticks"), spec.turn_id)
    if stop_grace is not None:
        stopping.start(stop_grace)
    assert shim.stdout is not None
    seq = 0
    pending: list[str] = []
    buffer = b""
    last_push = time.monotonic()
    selector = selectors.DefaultSelector()
    selector.register(shim.stdout, selectors.EVENT_READ)
    eof = False
    while not eof or pending:
        if not eof and selector.select(timeout=PUSH_SECONDS):
            chunk = os.read(shim.stdout.fileno(), 65536)
            if chunk:
                buffer += chunk
                *complete, buffer = buffer.split(b"\n")
                pending.extend(line.decode("utf-8", errors="replace") for line in complete)
            else:
                eof = True
                if buffer:
                    pending.append(buffer.decode("utf-8", errors="replace"))
                    buffer = b""
        now = time.monotonic()
        if eof or len(pending) >= BATCH_LINES or (pending and now - last_push >= PUSH_SECONDS) \
                or now - last_push >= POLL_SECONDS:
            grace = ray.get(hub.push.remote(spec.turn_id, seq, pending))
            seq += len(pending)
            pending = []
            last_push = now
            if grace is not None:
                stopping.start(grace)
    selector.close()
    code = shim.wait()
    last = reports.readline()
    reports.close()
    exit_code = json.loads(last).get("exit_code", code) if last.strip() else code
    tail = b"".join(stderr_tail)[-STDERR_TAIL:].decode("utf-8", errors="replace")
    if away is not None and away.finish() is None:  # the result did not reach the control node: nobody has it
        return {"state": "lost", "reason": f"the turn's workspace did not come back from node {node}: {away.error}",
                "exit_code": exit_code, "stderr_tail": tail}
    if stopping.started:
        stopping.join()
        return {"state": "failed", "reason": STOPPED, "exit_code": exit_code, "stderr_tail": tail}
    return {"state": "finished", "reason": f"exited with {exit_code}", "exit_code": exit_code, "stderr_tail": tail}


def kill_on_node(pgid: int, ticks: int | None, turn_id: str) -> bool:
    """On the turn's node: kill its process group and the processes tagged with its id."""
    return procs.kill_turn(pgid, ticks, turn_id, force=True)


class _Stopper:
    """Stops the turn's group once (SIGTERM, SIGKILL after the grace; SIGKILL at once for a grace of 0) in a thread,
    while its lines still flow."""

    def __init__(self, pgid: int, ticks: int | None, turn_id: str) -> None:
        self.pgid, self.ticks, self.turn_id = pgid, ticks, turn_id
        self.thread: threading.Thread | None = None

    @property
    def started(self) -> bool:
        return self.thread is not None

    def start(self, grace: float) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=procs.kill_turn, args=(self.pgid, self.ticks, self.turn_id),
                                           kwargs={"grace": grace, "force": grace <= 0}, daemon=True)
            self.thread.start()

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join(timeout=30)


def _feed(pipe: t.IO[bytes] | None, data: bytes) -> None:
    if pipe is None:
        return
    try:
        pipe.write(data)
    except OSError:
        pass
    finally:
        try:
            pipe.close()
        except OSError:
            pass


def _drain(pipe: t.IO[bytes] | None, tail: deque[bytes]) -> None:
    if pipe is None:
        return
    while True:
        chunk = pipe.read1(4096) if hasattr(pipe, "read1") else pipe.read(4096)
        if not chunk:
            return
        tail.append(chunk)
