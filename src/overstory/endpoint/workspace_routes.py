"""The routes a remote turn's node calls to take its workspace out and bring it back (``executors.travel_control``).

The turn is the caller's current one (from the secret it presented, never from the request): a node can fetch
and finish only the turn it runs, and only while that turn's secret is the endpoint's.
"""

from __future__ import annotations

import typing as t

from overstory.errors import WorkspaceRefused

if t.TYPE_CHECKING:
    from overstory.endpoint.server import Caller


def _turn(caller: Caller) -> str:
    turn_id = caller.turn_env.get("OVERSTORY_TURN_ID", "")
    if not turn_id:
        raise WorkspaceRefused("?", "no turn is running for this agent")
    return turn_id


def _bytes(caller: Caller, args: dict[str, t.Any], key: str) -> bytes:
    import base64  # here: only turns on other machines send files, and every agent's loop imports this module
    import binascii

    try:
        return base64.b64decode(str(args.get(key) or ""), validate=True)
    except (binascii.Error, ValueError):
        raise WorkspaceRefused(_turn(caller), f"{key} is not base64") from None


def _state_dir(caller: Caller) -> t.Any:
    from overstory.runtimes import get_runtime

    return get_runtime(caller.agent.runtime).state_dir(caller.project.run_dir / caller.name)


def fetch(caller: Caller, args: dict[str, t.Any]) -> t.Any:
    from overstory.executors import travel_control

    return travel_control.send(caller.project, caller.agent, _turn(caller), _state_dir(caller))


def finish(caller: Caller, args: dict[str, t.Any]) -> t.Any:
    from overstory.executors import travel_control
    from overstory.store import events as event_store

    turn_id = _turn(caller)
    outcome = travel_control.finish(caller.project, caller.agent, turn_id, str(args["head"]), str(args["end"]),
                                    _bytes(caller, args, "bundle"))
    if caller.events is not None:
        event_store.record(caller.events, "workspace_returned", agent=caller.name,
                           generation=caller.agent.generation, turn_id=turn_id,
                           summary=f"turn {turn_id} came back from node {args.get('node') or '?'}: {outcome}"[:300],
                           data={"outcome": outcome, "head": args["head"], "node": args.get("node")})
    return {"outcome": outcome}


def state(caller: Caller, args: dict[str, t.Any]) -> t.Any:
    from overstory.executors import travel_control
    from overstory.sandbox.layout import _pinned

    turn_id = _turn(caller)
    state_dir = _state_dir(caller)
    pinned = _pinned(caller.project.run_dir / caller.name, state_dir.resolve()) if state_dir is not None else ()
    return {"state": travel_control.receive_state(caller.project, caller.agent, turn_id, _bytes(caller, args, "state"),
                                                  state_dir, pinned)}


for _route in (fetch, finish, state):
    _route.takes_back = False  # type: ignore[attr-defined]  # the node's branch comes back by finish, not from the sandbox

ROUTES = {"workspace.fetch": fetch, "workspace.finish": finish, "workspace.state": state}
