"""Which agents `ov status` and `ov tree` show: --capability, --state, --parent, --run.

Light: `ov status` is a hot command and builds a Selection on every call, so nothing is
imported until an option is given (the valid names come from ``store.sessions`` then).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs milliseconds on a hot path
if TYPE_CHECKING:
    import sqlite3
    import typing as t

    from overstory.store.sessions import Session


class Selection:
    """Which agents `ov status` and `ov tree` show: --capability, --state (each may list several, comma-separated),
    --parent NAME (its children) and --run RUN (id or unique prefix). None: any. Unknown states and capabilities
    are usage errors, found before any database is opened."""

    def __init__(self, capability: str | None = None, state: str | None = None, parent: str | None = None,
                 run: str | None = None) -> None:
        self.capabilities: tuple[str, ...] | None = None
        self.states: tuple[str, ...] | None = None
        if capability is not None or state is not None:
            from overstory.store.sessions import CAPABILITIES, STATES

            self.capabilities = _choices(capability, CAPABILITIES, "--capability", "capability")
            self.states = _choices(state, STATES, "--state", "state")
        self.parent = parent
        self.run = run
        self.run_id: str | None = None  # --run, resolved by ``resolve``

    @property
    def empty(self) -> bool:
        return self.capabilities is None and self.states is None and self.parent is None and self.run is None

    def as_dict(self) -> dict[str, str | None]:
        """The options as given, to pass along (an agent's `ov status` goes through its endpoint)."""
        return {"capability": ",".join(self.capabilities) if self.capabilities else None,
                "state": ",".join(self.states) if self.states else None, "parent": self.parent, "run": self.run}

    def resolve(self, conn: sqlite3.Connection) -> Selection:
        """Check --parent names an agent (or the operator) and find --run's run; raises as the other commands do."""
        from overstory.store.sessions import exists

        if self.parent is not None and self.parent != "operator" and not exists(conn, self.parent):
            from overstory.store.sessions import agent_not_found

            raise agent_not_found(conn, self.parent, option="--parent")
        if self.run is not None and self.run_id is None:
            from overstory.store import runs

            self.run_id = runs.resolve(conn, self.run).id
        return self

    def matches(self, agent: Session, *, parent: bool = True) -> bool:
        """``agent`` is selected (``parent=False``: whoever its parent is; `ov tree` places it under --parent)."""
        return ((self.capabilities is None or agent.capability in self.capabilities)
                and (self.states is None or agent.state in self.states)
                and (not parent or self.parent is None or agent.parent == self.parent)
                and (self.run_id is None or agent.run_id == self.run_id))


def _choices(value: str | None, valid: t.Sequence[str], option: str, what: str) -> tuple[str, ...] | None:
    """The comma-separated ``value`` as a tuple, each one of ``valid`` (else a usage error); None for None."""
    if value is None:
        return None
    given = tuple(part.strip() for part in value.split(","))
    for part in given:
        if part not in valid:
            from overstory.errors import UsageError

            raise UsageError(f"{option}: unknown {what} {part!r}; choose from {', '.join(valid)}")
    return given
