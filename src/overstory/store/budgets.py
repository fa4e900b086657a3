"""Budgets: the four spending limits of an agent and of a run, and what was used against them.

One ``budgets`` row per agent generation (scope ``agent``) and per run (scope ``run``).
Limits are optional (NULL: none):

- ``max_usd``: dollars. ``spent_usd`` holds settled turns (the runtime's real figure,
  or the estimate of a turn that was stopped before reporting one); ``live_usd`` the
  estimate of the turn in progress, priced from streamed usage.
- ``max_turns``: turns started. A turn is counted when it starts (``begin_turn``, which
  refuses a turn past a limit) and refunded if it turned out to do nothing (a quota or
  auth failure).
- ``max_tool_calls``: counted by `ov guard` (``store.tool_count``); the call past the
  limit is refused and counted in ``refused_tool_calls``.
- ``max_wallclock``: seconds since ``started_at`` (the sling, or the run's start).

A trigger (migration m005) adds every change of an agent's counters to its run's row
in the same statement, so a run's totals survive its agents' later generations.
"""

from __future__ import annotations

from overstory.clock import now_ms
from overstory.records import Record
from overstory.store.db import write_transaction

TYPE_CHECKING = False  # typing costs milliseconds and `ov status` imports this module
if TYPE_CHECKING:
    import sqlite3
    import typing as t

LIMITS = ("max_usd", "max_turns", "max_tool_calls", "max_wallclock")
AGENT = "agent"
RUN = "run"


def format_limit(limit: str, value: float | None) -> str:
    if value is None:
        return "-"
    if limit == "max_usd":
        return f"{value:.2f}"
    if limit == "max_wallclock":
        return format_seconds(value)
    return str(int(value))


def format_seconds(seconds: float) -> str:
    seconds = max(0.0, float(seconds))
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


class Crossing(Record):  # Records, not dataclasses: `ov status` imports this module (records.py says why)
    """A limit that is reached: why an agent (or every agent of a run) parks."""

    __slots__ = ("scope", "name", "limit", "maximum", "used")

    scope: str          # agent | run
    name: str           # the agent, or the run id
    limit: str          # max_usd | max_turns | max_tool_calls | max_wallclock
    maximum: float
    used: float

    @property
    def reason(self) -> str:
        where = f"run {self.name} " if self.scope == RUN else ""
        return (f"budget: {where}{self.limit} {format_limit(self.limit, self.maximum)} reached "
                f"({format_limit(self.limit, self.used)})")

    def as_dict(self) -> dict[str, t.Any]:
        return {"scope": self.scope, "name": self.name, "limit": self.limit, "maximum": self.maximum,
                "used": round(self.used, 6)}


class Budget(Record):
    """One budget row: an agent's (a generation) or a run's limits and what was used."""

    __slots__ = ("scope", "name", "generation", "run_id", "max_usd", "max_turns", "max_tool_calls", "max_wallclock",
                 "started_at", "spent_usd", "live_usd", "turns", "tool_calls", "refused_tool_calls")

    scope: str
    name: str
    generation: int
    run_id: str | None
    max_usd: float | None
    max_turns: int | None
    max_tool_calls: int | None
    max_wallclock: float | None
    started_at: int
    spent_usd: float
    live_usd: float
    turns: int
    tool_calls: int
    refused_tool_calls: int

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Budget:
        return cls(*(row[name] for name in cls.__slots__))

    def limit(self, name: str) -> float | None:
        value: float | None = getattr(self, name)
        return value

    def used(self, limit: str, now: int | None = None) -> float:
        if limit == "max_usd":
            return self.spent_usd + self.live_usd
        if limit == "max_turns":
            return float(self.turns)
        if limit == "max_tool_calls":
            return float(self.tool_calls)
        return max(0, (now_ms() if now is None else now) - self.started_at) / 1000

    def left(self, limit: str, now: int | None = None) -> float | None:
        maximum = self.limit(limit)
        return None if maximum is None else max(0.0, maximum - self.used(limit, now))

    def crossing(self, now: int, *, starting_turn: bool, refused: bool = False) -> Crossing | None:
        """The first limit this budget has reached, if any.

        Turns and tool calls count as reached at the limit only when a turn is about to
        start (no turn, no tool call left for it). During a turn, tool calls cross when
        the guard refused a call past the limit (``refused``).
        """
        for limit in LIMITS:
            maximum = self.limit(limit)
            if maximum is None:
                continue
            if limit == "max_turns" and not starting_turn:
                continue
            if limit == "max_tool_calls" and not (starting_turn or refused):
                continue
            used = self.used(limit, now)
            if used >= maximum:
                return Crossing(self.scope, self.name, limit, float(maximum), used)
        return None

    def as_dict(self, now: int | None = None) -> dict[str, t.Any]:
        now = now_ms() if now is None else now
        limits = {}
        for limit in LIMITS:
            maximum = self.limit(limit)
            used = self.used(limit, now)
            limits[limit.removeprefix("max_")] = {
                "limit": maximum, "used": round(used, 6) if limit != "max_wallclock" else round(used, 1),
                "left": None if maximum is None else round(max(0.0, maximum - used), 6)}
        limits["usd"]["settled"] = round(self.spent_usd, 6)
        limits["usd"]["live_estimate"] = round(self.live_usd, 6)
        limits["tool_calls"]["refused"] = self.refused_tool_calls
        return {"scope": self.scope, "name": self.name, "generation": self.generation, "run_id": self.run_id,
                "started_at": self.started_at, "limits": limits}


# ---- reading ------------------------------------------------------------------------


def get_agent(conn: sqlite3.Connection, name: str, generation: int) -> Budget | None:
    row = conn.execute("SELECT * FROM budgets WHERE scope = 'agent' AND name = ? AND generation = ?",
                       (name, generation)).fetchone()
    return Budget.from_row(row) if row else None


def get_run(conn: sqlite3.Connection, run_id: str) -> Budget | None:
    row = conn.execute("SELECT * FROM budgets WHERE scope = 'run' AND name = ? AND generation = 0",
                       (run_id,)).fetchone()
    return Budget.from_row(row) if row else None


def agent_budget(conn: sqlite3.Connection, name: str) -> dict[str, t.Any] | None:
    """The budget of ``name``'s current generation as `ov budget --json` shows it; None when it has none."""
    row = conn.execute("SELECT b.* FROM budgets b JOIN sessions s ON s.name = b.name AND s.generation = b.generation "
                       "WHERE b.scope = 'agent' AND b.name = ?", (name,)).fetchone()
    return Budget.from_row(row).as_dict() if row else None


def current_agents(conn: sqlite3.Connection, names: t.Collection[str] | None = None) -> dict[str, Budget]:
    """The budget of each agent's current generation, by name (one query)."""
    rows = conn.execute(
        "SELECT b.* FROM budgets b JOIN sessions s ON s.name = b.name AND s.generation = b.generation "
        "WHERE b.scope = 'agent'").fetchall()
    found = {row["name"]: Budget.from_row(row) for row in rows}
    return found if names is None else {name: found[name] for name in names if name in found}


def runs(conn: sqlite3.Connection, run_ids: t.Collection[str]) -> dict[str, Budget]:
    if not run_ids:
        return {}
    marks = ",".join("?" * len(run_ids))
    rows = conn.execute(f"SELECT * FROM budgets WHERE scope = 'run' AND generation = 0 AND name IN ({marks})",
                        tuple(run_ids)).fetchall()
    return {row["name"]: Budget.from_row(row) for row in rows}


def check(conn: sqlite3.Connection, name: str, generation: int, *, now: int | None = None,
          starting_turn: bool = False, refused_since: int | None = None) -> Crossing | None:
    """The limit of the agent, or else of its run, that is reached, if any.

    ``refused_since``: the agent's refused tool calls when its turn started; more than
    that means the guard refused a call past a tool-call limit during the turn.
    """
    now = now_ms() if now is None else now
    own = get_agent(conn, name, generation)
    if own is None:
        return None
    refused = refused_since is not None and own.refused_tool_calls > refused_since
    run = get_run(conn, own.run_id) if own.run_id else None
    for budget in (own, run):
        if budget is not None:
            crossing = budget.crossing(now, starting_turn=starting_turn, refused=refused)
            if crossing is not None:
                return crossing
    return None


# ---- writing ------------------------------------------------------------------------


def _clean(limits: t.Mapping[str, t.Any] | None) -> dict[str, t.Any]:
    return {limit: (limits or {}).get(limit) for limit in LIMITS}


def clamp_to_run(limits: t.Mapping[str, t.Any], run: Budget | None, now: int) -> tuple[dict[str, t.Any], list[str]]:
    """A child's limits, none beyond what is left of its run's; notes say what was lowered."""
    wanted = _clean(limits)
    if run is None:
        return wanted, []
    notes = []
    for limit in LIMITS:
        left = run.left(limit, now)
        if left is None:
            continue
        if limit in ("max_turns", "max_tool_calls"):
            left = int(left)
        if wanted[limit] is None or wanted[limit] > left:
            if wanted[limit] is not None:
                notes.append(f"{limit} lowered from {format_limit(limit, wanted[limit])} to "
                             f"{format_limit(limit, left)}, what is left of run {run.name}'s")
            wanted[limit] = left
    return wanted, notes


def create_agent(conn: sqlite3.Connection, name: str, generation: int, *, run_id: str | None,
                 limits: t.Mapping[str, t.Any] | None, now: int | None = None) -> None:
    now = now_ms() if now is None else now
    values = _clean(limits)
    conn.execute(
        "INSERT INTO budgets(scope, name, generation, run_id, max_usd, max_turns, max_tool_calls, max_wallclock, "
        "started_at) VALUES ('agent', :name, :generation, :run_id, :max_usd, :max_turns, :max_tool_calls, "
        ":max_wallclock, :now)", {"name": name, "generation": generation, "run_id": run_id, "now": now, **values})


def discard_agent(conn: sqlite3.Connection, name: str, generation: int) -> None:
    """Undo ``create_agent`` for a spawn that failed half-way."""
    conn.execute("DELETE FROM budgets WHERE scope = 'agent' AND name = ? AND generation = ?", (name, generation))


def discard_run(conn: sqlite3.Connection, run_id: str) -> None:
    """Undo ``ensure_run`` for a run that was discarded before any agent joined it."""
    conn.execute("DELETE FROM budgets WHERE scope = 'run' AND name = ? AND generation = 0", (run_id,))


def ensure_run(conn: sqlite3.Connection, run_id: str, *, started_at: int,
               limits: t.Mapping[str, t.Any] | None = None) -> Budget:
    """The run's budget row, created if missing; ``limits`` replace the given (non-None) ones."""
    conn.execute("INSERT INTO budgets(scope, name, generation, started_at) VALUES ('run', ?, 0, ?) "
                 "ON CONFLICT DO NOTHING", (run_id, started_at))
    given = {k: v for k, v in _clean(limits).items() if v is not None}
    if given:
        sets = ", ".join(f"{k} = :{k}" for k in given)
        conn.execute(f"UPDATE budgets SET {sets} WHERE scope = 'run' AND name = :_run AND generation = 0",
                     {**given, "_run": run_id})
    found = get_run(conn, run_id)
    assert found is not None
    return found


def begin_turn(conn: sqlite3.Connection, name: str, generation: int, *, now: int | None = None) -> Crossing | None:
    """Count a turn about to start, unless a limit of the agent or its run is reached (then that one)."""
    now = now_ms() if now is None else now
    with write_transaction(conn):
        crossing = check(conn, name, generation, now=now, starting_turn=True)
        if crossing is None:
            conn.execute("UPDATE budgets SET turns = turns + 1 WHERE scope = 'agent' AND name = ? AND generation = ?",
                         (name, generation))
    return crossing


def refund_turn(conn: sqlite3.Connection, name: str, generation: int) -> None:
    """A counted turn that did no work (a quota or auth failure): it does not count."""
    conn.execute("UPDATE budgets SET turns = turns - 1 WHERE scope = 'agent' AND name = ? AND generation = ? "
                 "AND turns > 0", (name, generation))


def set_live(conn: sqlite3.Connection, name: str, generation: int, usd: float) -> None:
    conn.execute("UPDATE budgets SET live_usd = ? WHERE scope = 'agent' AND name = ? AND generation = ?",
                 (usd, name, generation))


def settle_turn(conn: sqlite3.Connection, name: str, generation: int, usd: float) -> None:
    """The turn is over: its cost (real, or the last estimate) is spent; nothing is live any more."""
    conn.execute("UPDATE budgets SET spent_usd = spent_usd + ?, live_usd = 0 WHERE scope = 'agent' AND name = ? "
                 "AND generation = ?", (usd, name, generation))


def settle_interrupted(conn: sqlite3.Connection, name: str, generation: int) -> float:
    """A turn whose runner died: its last live estimate becomes spent (the money is gone). Returns that estimate,
    so the turn's own row can carry it (``ov costs`` and the budget then agree)."""
    row = conn.execute("SELECT live_usd FROM budgets WHERE scope = 'agent' AND name = ? AND generation = ? "
                       "AND live_usd > 0", (name, generation)).fetchone()
    if row is None:
        return 0.0
    conn.execute("UPDATE budgets SET spent_usd = spent_usd + live_usd, live_usd = 0 WHERE scope = 'agent' "
                 "AND name = ? AND generation = ?", (name, generation))
    return float(row[0])


def raise_limits(conn: sqlite3.Connection, scope: str, name: str, generation: int, *, add_usd: float = 0,
                 add_turns: int = 0, add_tool_calls: int = 0, add_seconds: float = 0,
                 now: int | None = None) -> Budget | None:
    """Raise the limits that exist by the given amounts; None when there is no such budget.

    Wall clock is raised from *now* (``max(limit, elapsed) + add``): time went on while
    the agent was parked, and ``--add-time 30m`` means thirty more minutes. The others
    are raised from the limit itself. A limit that is not set stays unset.
    """
    now = now_ms() if now is None else now
    with write_transaction(conn):
        row = conn.execute("SELECT * FROM budgets WHERE scope = ? AND name = ? AND generation = ?",
                           (scope, name, generation)).fetchone()
        if row is None:
            return None
        budget = Budget.from_row(row)
        changes: dict[str, t.Any] = {}
        if add_usd and budget.max_usd is not None:
            changes["max_usd"] = budget.max_usd + add_usd
        if add_turns and budget.max_turns is not None:
            changes["max_turns"] = budget.max_turns + add_turns
        if add_tool_calls and budget.max_tool_calls is not None:
            changes["max_tool_calls"] = budget.max_tool_calls + add_tool_calls
        if add_seconds and budget.max_wallclock is not None:
            changes["max_wallclock"] = max(budget.max_wallclock, budget.used("max_wallclock", now)) + add_seconds
        if changes:
            sets = ", ".join(f"{k} = :{k}" for k in changes)
            conn.execute(f"UPDATE budgets SET {sets} WHERE scope = :_s AND name = :_n AND generation = :_g",
                         {**changes, "_s": scope, "_n": name, "_g": generation})
        fresh = conn.execute("SELECT * FROM budgets WHERE scope = ? AND name = ? AND generation = ?",
                             (scope, name, generation)).fetchone()
    return Budget.from_row(fresh)


def live_usd_total(conn: sqlite3.Connection) -> float:
    """The live spend estimate of every running turn of a current agent generation."""
    return float(conn.execute("SELECT coalesce(sum(b.live_usd), 0) FROM budgets b JOIN sessions s ON s.name = b.name "
                              "AND s.generation = b.generation WHERE b.scope = 'agent' AND b.live_usd > 0"
                              ).fetchone()[0])
