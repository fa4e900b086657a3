"""The watchdog and turns that run on a cluster (``executor: ray``): what it asks their executor.

A local turn is a process group on this machine, which the watchdog checks and kills by its recorded group
and start ticks. A turn on a cluster has no group here (``turn_pgid`` is empty) and outlives its agent's
loop (the turn hub owns it), so when the loop is gone only the executor knows what became of the turn.
``settle`` asks it before the watchdog re-adopts the agent:

- ``lost`` (its node or its worker died: Ray says so within a second): there is nothing to kill; the turn
  is settled as lost (``transient``, as the loop settles a lost turn) under the same retry rules as a local
  crash;
- queued or running: it is stopped through the executor (the node kills the turn's process group and what
  carries its id), so the retry never runs beside it; nothing else on any node is touched (Ray's processes
  are not ov's);
- ended by itself: nothing to stop (the loop's death is the failure, as for a local turn);
- the executor cannot be asked (the cluster does not answer: ``ClusterUnreachable``), or a stop did not end
  the turn (``TurnStillRunning``): the error propagates and the agent is left as it is this tick (the tick
  reports it), since the turn may still be running.

A live loop settles its own lost turn: it reads the same status while it watches the turn.
"""

from __future__ import annotations

import typing as t
from dataclasses import dataclass

from overstory.errors import ConfigError, TurnNotFound, TurnStillRunning

if t.TYPE_CHECKING:
    from overstory.paths import ProjectPaths
    from overstory.store.sessions import Session


@dataclass(frozen=True)
class RemoteEnd:
    """What became of a dead loop's turn on a cluster."""

    detail: str        # for the watchdog's action and event
    lost: str | None   # the turn row's error when the turn was lost with its node or worker


def settle(project: ProjectPaths, agent: Session, turn_id: str | None, grace: float) -> RemoteEnd | None:
    """End ``turn_id`` of ``agent`` on its executor if it runs elsewhere; None for a local turn (or none)."""
    if not turn_id or agent.turn_pgid is not None:
        return None  # a turn with a process group here is local: the watchdog's own rules
    from overstory.agents import turn_exec
    from overstory.config.load import load

    try:
        config = load(project.config_file, project.local_config_file)
    except ConfigError:  # no executor can be built (nor can a new loop run): the local rules, as before executors
        return None
    if turn_exec.executor_kind(config, agent) == "local":
        return None
    executor = turn_exec.executor_for(project, config, agent)
    try:
        status = executor.status(turn_id)
    except TurnNotFound:
        return RemoteEnd(f"its turn {turn_id} is no longer known to the {executor.kind} executor", None)
    where = f"on node {status.node}" if status.node else f"on the {executor.kind} executor"
    if status.state == "lost":
        end = RemoteEnd(f"its turn was lost {where}: {status.reason}",
                        f"the turn was lost on its executor ({executor.kind}): {status.reason}")
    elif status.ended:
        end = RemoteEnd(f"its turn had ended {where} ({status.state})", None)
    else:
        stopped = executor.stop(turn_id, grace=grace)
        if not stopped.ended:  # its node did not answer: a retry could run beside it
            raise TurnStillRunning(turn_id, executor.kind, stopped.state)
        end = RemoteEnd(f"stopped its turn {where} through the {executor.kind} executor ({stopped.state})", None)
    executor.forget(turn_id)
    return end
