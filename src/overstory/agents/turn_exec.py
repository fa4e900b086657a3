"""The turn runner's side of a turn executor (``overstory.executors``): which one runs an agent's turn,
its output lines as the stream reader wants them, and whether its process has ended.

``agents.turns`` hands every turn to an executor (``launch`` step) and reads it back through
``ExecutorLines`` and ``ExecutorProcess`` (``watch`` step); ``local`` (the default) runs the turn's
command on this machine under the executor's shim, ``ray`` as a task on a node of a Ray cluster.

The kind: the agent's own ``ov sling --executor`` (``spec["executor"]``), else config ``executor.kind``.
Executors are kept per process (a Ray connection is made once).

A turn on another machine takes its workspace with it (``travel_for``; ``executors.travel_node`` on the node,
``executors.travel_control`` here): the node fetches the branch and the run dir over the loop's endpoint
(``REMOTE_ENDPOINT_ENV``, with the turn's secret), runs the turn in the same paths and sandbox, and sends the
commits back, which move the agent's branch here by compare-and-swap.
"""

from __future__ import annotations

import select
import sys
import threading
import time
import typing as t

from overstory.errors import OrchestratorError
from overstory.store.sqlite_module import sqlite3

if t.TYPE_CHECKING:
    from overstory.agents.spending import ToolCallGate
    from overstory.config.model import Config
    from overstory.executors.base import TurnExecutor, TurnStatus
    from overstory.paths import ProjectPaths
    from overstory.store.sessions import Session

LOCAL_SLICE = 0.05  # how often a local turn's stdout file is read while the reader waits
# ... at first, and again after each line: the wait doubles from this up to LOCAL_SLICE while nothing comes. A
# runtime writes in bursts (its init right after it starts, a tool call's lines together, its result then exit),
# so the next line is read within milliseconds of a burst's first, and a quiet model costs no more reads than before.
LOCAL_FIRST_SLICE = 0.002
REMOTE_SLICE = 0.5  # the longest a read from the hub waits (the hub answers as soon as a line comes)
GATE_SLICE = 0.1    # the same, when a tool call may wake the reader (the gate is watched between reads)
# How often a local turn's stdout file is read once a refused call's answer is awaited (``hurry``): the runtime
# may ask for its next, billed, message within milliseconds of taking the refusal, as a pipe's reader would see.
HURRY_SLICE = 0.002
REMOTE_ENDPOINT_ENV = "OVERSTORY_REMOTE_ENDPOINT"  # HOST:PORT of the loop's endpoint for turns on other machines
LOCAL_TURNS_DIR = "turns"  # under the agent's run dir: the local executor's folder per turn (executors.local)

_executors: dict[tuple[t.Any, ...], TurnExecutor] = {}
_lock = threading.Lock()


def executor_kind(config: Config, agent: Session) -> str:
    """``local`` for an agent without a worktree of its own (the coordinator, at the project's root: its turns
    work on the control node's checkout, which does not travel); else its own ``--executor`` or the config's."""
    if not agent.worktree:
        return "local"
    return str(agent.spec.get("executor") or config.executor.kind)


def executor_for(project: ProjectPaths, config: Config, agent: Session) -> TurnExecutor:
    """The executor of ``agent``'s turns (made once per process). OrchestratorError when it cannot be had."""
    from overstory.executors import get_executor

    kind = executor_kind(config, agent)
    if kind == "local":
        from overstory import sandbox

        # In bubblewrap a turn dies with its loop (--die-with-parent): with the shim in between, the shim does it.
        dies = sandbox.effective_mode(config).name == "bwrap"
        # The turns' folders are the agent's own files, in its run dir (read-only in its sandbox, as the rest of
        # it): not beside the run dirs, where every agent's sandbox and the containment check see other agents.
        folder = project.run_dir / agent.name / LOCAL_TURNS_DIR
        key: tuple[t.Any, ...] = ("local", str(folder), dies)
        settings: dict[str, t.Any] = {"state_dir": folder, "die_with_submitter": dies}
    else:
        ray = config.executor.ray
        if not ray.address:
            raise OrchestratorError(f"agent {agent.name} runs its turns on the {kind} executor, which needs "
                                    f"executor.ray.address (HOST:PORT of a running cluster) in the configuration")
        resources = dict(ray.turn_resources)
        key = (kind, ray.address, ray.namespace, tuple(sorted(resources.items())))
        settings = {"address": ray.address, "turn_resources": resources, "namespace": ray.namespace}
    with _lock:
        found = _executors.get(key)
        if found is None:
            found = _executors[key] = get_executor(kind, **settings)
        return found


def prepare_local(project: ProjectPaths, config: Config, agent: Session) -> TurnExecutor | None:
    """Start a local turn's shim now, as its turn begins (``LocalExecutor.prepare``), so that it is ready by the
    launch. The executor, whose ``discard_prepared`` ends the shim if the launch never comes; None (nothing
    prepared) for a turn on another executor."""
    if executor_kind(config, agent) != "local":
        discard_early_shim()  # a warm loop started one for a local first turn: not this agent's
        return None
    try:
        executor = executor_for(project, config, agent)
    except (OSError, OrchestratorError):  # the launch meets it again and says so: preparing changes no outcome
        return None
    executor.prepare()
    return executor


def discard_early_shim() -> None:
    """End the shim a warm loop started for its first turn (``executors.local.start_early``) if no turn took it;
    nothing is imported to find out there is none."""
    local = sys.modules.get("overstory.executors.local")
    if local is not None:
        local.discard_early()


def travel_for(project: ProjectPaths, config: Config, agent: Session, env: t.Mapping[str, str],
               command: t.Sequence[str], command_env: t.Mapping[str, str]) -> dict[str, t.Any]:
    """What a node needs to bring the turn's workspace to itself (``TurnSpec.travel``): the endpoint to fetch it
    from, the project's root and the sandbox layout's paths (the node rebuilds them at the same paths), and the
    runtime's command before the sandbox (the node builds the sandbox's command line over its own copy)."""
    from overstory import sandbox
    from overstory.runtimes import get_runtime

    endpoint = env.get(REMOTE_ENDPOINT_ENV)
    if not endpoint or not agent.worktree:
        raise OrchestratorError(f"agent {agent.name} cannot run a turn on another machine: "
                                + ("it has no worktree of its own" if endpoint else "its loop serves no endpoint there"))
    layout = sandbox.layout_for(project, agent, get_runtime(agent.runtime))
    paths: dict[str, t.Any] = {key: (str(value) if value is not None and not isinstance(value, (bool, tuple)) else value)
             for key, value in vars(layout).items()}
    paths["pinned"] = [str(path) for path in layout.pinned]
    sandboxed = sandbox.effective_mode(config).name == "bwrap"
    return {"endpoint": endpoint, "root": str(layout.root), "layout": paths, "sandboxed": sandboxed,
            "command": list(command),
            "bwrap": sandbox.bwrap_params(config, agent, layout, command_env) if sandboxed else {}}


def local_group(executor: TurnExecutor, turn_id: str) -> tuple[int | None, int | None]:
    """The turn's process group on THIS machine and its leader's start ticks (the watchdog and `ov stop` signal
    it): the runtime's own group, the one ov had the shim start. (None, None) when the turn runs elsewhere."""
    from overstory.executors.local import LocalExecutor

    if not isinstance(executor, LocalExecutor):
        return None, None
    group = executor.process_group(turn_id)
    return group if group is not None else (None, None)


class ExecutorLines:
    """A turn's stdout from its executor, read like ``turn_stream._LineReader`` reads a pipe: whole lines
    (bytes, without their newline) within a timeout, ``eof`` once the turn has ended and all is read.

    With a ``gate`` (``spending.ToolCallGate``) it wakes when a tool call asks the gate, takes the gate's
    tickets (``ticket``) and reads everything the turn has written at that moment."""

    def __init__(self, executor: TurnExecutor, turn_id: str, gate: ToolCallGate | None = None) -> None:
        self.executor, self.turn_id, self.gate = executor, turn_id, gate
        self.cursor = 0
        self.eof = False
        self.ticket = 0
        self.slice = LOCAL_SLICE if executor.kind == "local" else GATE_SLICE if gate is not None else REMOTE_SLICE
        self.quiet = 0  # reads in a row that found nothing (a local turn's wait grows with it)
        # A local turn's folder watched (executors.changes): a wait ends as soon as the turn writes or ends.
        self.changes = executor.watch(turn_id) if executor.kind == "local" else None

    def lines(self, timeout: float) -> list[bytes]:
        if self.eof:
            return []
        deadline = time.monotonic() + timeout
        while True:
            wait = min(self._slice(), max(0.0, deadline - time.monotonic()))
            if self.gate is None and self.changes is not None:  # read, then sleep until the folder changes
                found = self._read(0.0)
                if not found and not self.eof and select.select([self.changes], [], [], wait)[0]:
                    self.changes.drain()
            elif self.gate is not None:
                woken = select.select([w for w in (self.gate, self.changes) if w is not None], [], [], wait)[0]
                if self.changes is not None and self.changes in woken:
                    self.changes.drain()  # before reading: what woke it is then read
                if self.gate is not None and self.gate in woken:
                    self.ticket = self.gate.take()  # before reading: what the runtime wrote before it asked is there
                    return self._read(0.0)
                found = self._read(0.0)
            else:
                found = self._read(wait if self.executor.kind != "local" else 0.0)
                if not found and not self.eof and self.executor.kind == "local":
                    time.sleep(wait)
            if found or self.eof or time.monotonic() >= deadline:
                return found

    def _slice(self) -> float:
        if self.executor.kind != "local":
            return self.slice
        return min(self.slice, LOCAL_FIRST_SLICE * 2 ** min(self.quiet, 8))

    def hurry(self) -> None:
        if self.executor.kind == "local":
            self.slice = min(self.slice, HURRY_SLICE)  # a remote read already returns as soon as a line comes

    def _read(self, timeout: float) -> list[bytes]:
        batch = self.executor.lines(self.turn_id, self.cursor, timeout=timeout)
        self.cursor = batch.cursor
        self.eof = batch.done
        self.quiet = 0 if batch.lines else self.quiet + 1
        return [line.encode("utf-8") for line in batch.lines]

    def close(self) -> None:
        """The folder's watch is let go of; the lines stay with the executor until the turn is forgotten."""
        if self.changes is not None:
            self.changes.close()
            self.changes = None


class ExecutorProcess:
    """What the stream reader asks of the turn's process (``poll``), answered by the executor; it also notes
    the node the turn runs on in the turn's row the first time it is known."""

    def __init__(self, executor: TurnExecutor, turn_id: str, state: sqlite3.Connection,
                 node: str | None = None) -> None:
        self.executor, self.turn_id, self.state = executor, turn_id, state
        self.node = node
        self.last: TurnStatus | None = None

    def poll(self) -> int | None:
        status = self.last = self.executor.status(self.turn_id)
        if status.node and status.node != self.node:
            from overstory.store import turns as turn_rows

            self.node = status.node
            turn_rows.set_node(self.state, self.turn_id, status.node)
        if not status.ended:
            return None
        return status.exit_code if status.exit_code is not None else -1


def end_of(executor: TurnExecutor, turn_id: str, *, stopping: bool, grace: float) -> TurnStatus:
    """The turn's final status: waited for when it ended by itself (``stopping`` False: its runtime finished),
    else stopped (SIGTERM, SIGKILL after ``grace``; at once for 0); what it left running on its node goes with it."""
    status = executor.wait(turn_id, timeout=30) if not stopping else executor.status(turn_id)
    if not status.ended:
        status = executor.stop(turn_id, grace=grace)
    return status
