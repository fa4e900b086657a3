"""The one exception hierarchy: every error a user can cause or act on is defined here.

Each class knows how it is answered at every boundary, so none of them keeps a ladder of
``isinstance`` checks:

- ``exit_code``: what the CLI exits with (``cli.hot.report`` prints the one-line message, or
  ``{"error": {"kind": ..., "message": ...}}`` with ``--json``; the kind is the class name);
- ``http_status``: what `ov serve`'s API answers (``ui.serve.app``);
- ``endpoint_status``: what an agent's endpoint answers (``endpoint.server``; its client reads only
  the body's ``ok`` and ``exit_code``, the status is for logs and Claude's HTTP hooks).

An error whose message is always the same sentence about the same facts takes the facts and
builds the sentence itself (``AgentNotFound(name)``).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs milliseconds, and every command imports this module
if TYPE_CHECKING:
    import typing as t


class OrchestratorError(Exception):
    """Base of every error a user can cause or act on (the project's current state refuses what was asked)."""

    exit_code = 1
    http_status = 409
    endpoint_status = 400


class UsageError(OrchestratorError):
    """The command line itself is wrong (exit 2, like click's usage errors), or a request's fields are."""

    exit_code = 2
    http_status = 400


class NotFound(OrchestratorError):
    """The thing a command or a path names does not exist (HTTP 404)."""

    http_status = 404


class NotAGitRepository(OrchestratorError):
    pass


class ProjectNotFound(OrchestratorError):
    pass


class AlreadyInitialized(OrchestratorError):
    pass


class ConfigError(OrchestratorError):
    pass


class InvalidName(UsageError):
    pass


class AgentNotFound(NotFound):
    """No agent has this name.

    ``similar``: existing names close to it, offered as "did you mean" (``sessions.agent_not_found``
    looks them up); ``option``: the command-line option that named it; ``detail``: what else was
    looked for; ``hint``: where to look instead ("" for none).
    """

    LISTS_THEM = "`ov status --all` lists them"

    def __init__(self, name: str, similar: t.Sequence[str] = (), *, option: str = "", detail: str = "",
                 hint: str = LISTS_THEM) -> None:
        self.name, self.similar, self.option, self.detail, self.hint = name, tuple(similar), option, detail, hint
        super().__init__(no_agent_named(name, self.similar, option=option, detail=detail, hint=hint))


def no_agent_named(name: str, similar: t.Sequence[str] = (), *, option: str = "", detail: str = "",
                   hint: str = "") -> str:
    """``[OPTION: ]no agent named 'x'[ (did you mean 'y'?)][ DETAIL][; HINT]``: ``AgentNotFound``'s message,
    also the reason inside other errors (an unknown parent, mail to an unknown name)."""
    text = f"no agent named {name!r}" + (f" (did you mean {either(similar)}?)" if similar else "")
    return (f"{option}: " if option else "") + text + (f" {detail}" if detail else "") + (f"; {hint}" if hint else "")


def either(names: t.Sequence[str]) -> str:
    """``'a'``, ``'a' or 'b'``, ``'a', 'b' or 'c'``."""
    quoted = [repr(name) for name in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


class CoordinatorNotRunning(NotFound):
    """`ov coordinator send/ask/stop` with no coordinator running."""

    def __init__(self) -> None:
        super().__init__("no coordinator is running; start one with `ov coordinator start`")


class RunNotFound(NotFound):
    """No run has this id (or a prefix matches none, or several)."""


class AgentExists(OrchestratorError):
    pass


class GroupNotFound(NotFound):
    """No task group has this name (``similar``: the existing names close to it)."""

    def __init__(self, name: str, similar: t.Sequence[str] = ()) -> None:
        self.name, self.similar = name, tuple(similar)
        super().__init__(f"no group named {name!r}" + (f" (did you mean {either(self.similar)}?)" if similar else "")
                         + "; `ov group list` lists them, `ov group create NAME` makes one")


class GroupExists(OrchestratorError):
    """`ov group create NAME` when NAME is taken."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"a group named {name!r} exists already; add agents to it with `ov group add {name} AGENT`")


class CoordinatorRunning(AgentExists):
    """`ov coordinator start` while one runs: ``name``, its ``state`` and ``run_id`` are in the message."""

    def __init__(self, name: str, state: str, run_id: str | None) -> None:
        self.name, self.state, self.run_id = name, state, run_id
        super().__init__(f"a coordinator is already running ({name}, {state}, run {run_id or '-'}); mail it with "
                         "`ov coordinator send`, or stop it first with `ov coordinator stop`")


class RunStillActive(OrchestratorError):
    """`ov run complete` on a run whose agents are still working (without --force)."""


class NoReply(OrchestratorError):
    """`ov coordinator ask` gave up: timeout, or the coordinator stopped first.

    Its exit code follows `ov wait`'s contract (``overstory.views.waiting``), so it is the instance's.
    """

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class BudgetExhausted(OrchestratorError):
    """A run (or agent) has no budget left for what was asked."""


class ApprovalError(OrchestratorError):
    """Deciding a gate that does not exist, was decided already, or expired."""


class DiffError(OrchestratorError):
    """The agent has nothing that can be diffed (no branch, branch and worktree gone)."""


class TokenError(OrchestratorError):
    """`ov serve`'s token file exists but cannot be used."""


class BadBody(UsageError):
    """A request body `ov serve`'s API cannot accept; ``status`` is the HTTP status to answer with
    (400, 413 too large, 415 not JSON, 422 fields the schema refuses)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.http_status = status


class MailError(OrchestratorError):
    pass


class PayloadError(MailError):
    pass


class SpawnError(OrchestratorError):
    pass


class GuardDenied(OrchestratorError):
    pass


class RuntimeNotAvailable(OrchestratorError):
    pass


class LockHeld(OrchestratorError):
    pass


class MergeError(OrchestratorError):
    pass


class HierarchyError(OrchestratorError):
    pass


class TmuxError(OrchestratorError):
    pass


class StoreError(OrchestratorError):
    """The state or event database is unreadable, from a newer ov, or corrupt."""

    http_status = 503


class DiskFull(StoreError):
    """No space left on the device that holds .overstory/ (the write was rolled back)."""


class UnknownCapability(UsageError):
    """A capability name that has no role definition (see agents/)."""


class OverlayError(OrchestratorError):
    """An agent's instructions could not be rendered (missing placeholder value or template)."""


class CleanRefused(OrchestratorError):
    """`ov stop --clean` would lose work: the branch is not merged or the worktree has changes."""


class SandboxError(OrchestratorError):
    """An agent's turn cannot be put in its sandbox (bubblewrap missing or not working, a bad layout)."""


class EndpointError(OrchestratorError):
    """An agent's request to ov through its endpoint failed or was refused."""


class NotPermitted(EndpointError):
    """The calling agent may not do this (capability or hierarchy)."""

    http_status = 403
    endpoint_status = 403


class LoopError(OrchestratorError):
    """An `ov loop` spec or request that cannot run (no objective, a bad gate, an unknown loop)."""


class ScheduleError(OrchestratorError):
    """An `ov schedule` that cannot be added or found (a bad cron expression, a taken name)."""


class WebhookRefused(ScheduleError):
    """A POST to a webhook trigger without its secret (or to no such trigger: the answer is the same)."""

    http_status = 401


class ExecutorError(OrchestratorError):
    """A turn executor (``overstory.executors``) could not do what was asked. Subclasses carry the facts."""


class ExecutorUnavailable(ExecutorError):
    """The executor named in the configuration cannot be used here (an optional extra is not installed)."""

    def __init__(self, kind: str, detail: str, hint: str = "") -> None:
        self.kind, self.detail, self.hint = kind, detail, hint
        super().__init__(f"executor {kind!r}: {detail}" + (f" ({hint})" if hint else ""))


class ClusterUnreachable(ExecutorError):
    """The cluster at ``address`` did not answer (ov never starts a cluster by itself)."""

    def __init__(self, address: str, detail: str) -> None:
        self.address, self.detail = address, detail
        super().__init__(f"cannot reach the Ray cluster at {address}: {detail}")


class TurnStillRunning(ExecutorError):
    """A stop through the executor did not end the turn in time (its node did not answer): it may still run."""

    def __init__(self, turn_id: str, executor: str, state: str) -> None:
        self.turn_id, self.executor, self.state = turn_id, executor, state
        super().__init__(f"turn {turn_id} is still {state} on the {executor} executor after a stop")


class TurnNotFound(ExecutorError):
    """An executor knows no turn with this id (never submitted there, or already forgotten)."""

    def __init__(self, turn_id: str, executor: str) -> None:
        self.turn_id, self.executor = turn_id, executor
        super().__init__(f"turn {turn_id} is not known to the {executor} executor")


class WorkspaceRefused(ExecutorError):
    """A remote turn's workspace could not go out or come back as asked (an unknown turn, a finish that
    contradicts the first one, a bundle without the commits it names). Nothing was changed."""

    endpoint_status = 409

    def __init__(self, turn_id: str, detail: str) -> None:
        self.turn_id, self.detail = turn_id, detail
        super().__init__(f"turn {turn_id}: {detail}")
