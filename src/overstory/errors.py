"""The one exception hierarchy. The CLI turns any OrchestratorError into a one-line message."""

from __future__ import annotations


class OrchestratorError(Exception):
    """Base of every error a user can cause or act on. ``exit_code`` is what the CLI exits with."""

    exit_code = 1


class UsageError(OrchestratorError):
    """The command line itself is wrong (exit 2, like click's usage errors)."""

    exit_code = 2


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


class AgentNotFound(OrchestratorError):
    pass


class AgentExists(OrchestratorError):
    pass


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


class LoopError(OrchestratorError):
    """An `ov loop` spec or request that cannot run (no objective, a bad gate, an unknown loop)."""


class ScheduleError(OrchestratorError):
    """An `ov schedule` that cannot be added or found (a bad cron expression, a taken name)."""


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


class TurnNotFound(ExecutorError):
    """An executor knows no turn with this id (never submitted there, or already forgotten)."""

    def __init__(self, turn_id: str, executor: str) -> None:
        self.turn_id, self.executor = turn_id, executor
        super().__init__(f"turn {turn_id} is not known to the {executor} executor")
