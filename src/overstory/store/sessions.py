"""Agent rows and the state machine. ``transition`` is the only writer of ``state``.

Every change is one compare-and-swap inside a ``BEGIN IMMEDIATE`` transaction: the
row must still carry the generation the caller believes in and be in a state the
transition table allows as a predecessor. The losing writer gets a typed outcome
and decides what to do; nobody retries blindly.
"""

from __future__ import annotations

from overstory import jsontext as json
from overstory.capabilities import CAPABILITIES as CAPABILITIES
from overstory.clock import now_ms
from overstory.records import Record
from overstory.store.db import write_transaction

TYPE_CHECKING = False  # typing costs milliseconds and hot commands import this module
if TYPE_CHECKING:
    import sqlite3
    import typing as t

    from overstory.errors import AgentNotFound
# overstory.errors is imported where an error is made: `ov status` reads sessions and raises none of them.

STATES = ("booting", "in_turn", "between_turns", "working", "stalled", "parked", "completed", "zombie")
TERMINAL_STATES = frozenset({"completed", "zombie"})
ACTIVE_STATES = frozenset(STATES) - TERMINAL_STATES

# to-state -> the states it may be entered from. The one place the rules live.
ALLOWED_FROM: dict[str, frozenset[str]] = {
    "booting": frozenset(),  # only by create_session, as a new generation
    "in_turn": frozenset({"booting", "between_turns", "stalled", "parked"}),
    "between_turns": frozenset({"booting", "in_turn", "stalled", "parked"}),
    "working": frozenset({"booting", "stalled", "parked"}),
    "stalled": frozenset({"booting", "in_turn", "between_turns", "working"}),  # between_turns: no report
    "parked": frozenset({"booting", "in_turn", "between_turns", "working", "stalled"}),
    "completed": frozenset({"booting", "in_turn", "between_turns", "working", "stalled", "parked", "zombie"}),
    "zombie": frozenset({"booting", "in_turn", "between_turns", "working", "stalled", "parked"}),
}



def is_allowed(prev: str, to: str) -> bool:
    return prev in ALLOWED_FROM.get(to, frozenset())


# ---- outcomes -------------------------------------------------------------


# Records, not dataclasses: `ov status` imports this module (records.py says why). ``ok`` is not a field.
class Ok(Record):
    """The transition happened: the state it left and the row's new version."""

    __slots__ = ("prev", "version")
    prev: str
    version: int
    ok = True


class NotFound(Record):
    """No such agent."""

    ok = False


class StaleGeneration(Record):
    """The agent was replaced by a newer generation."""

    __slots__ = ("current",)
    current: int
    ok = False


class IllegalTransition(Record):
    """The agent's state may not move to the requested one."""

    __slots__ = ("prev",)
    prev: str
    ok = False


if TYPE_CHECKING:
    Outcome = Ok | NotFound | StaleGeneration | IllegalTransition
    AfterTransition = t.Callable[[sqlite3.Connection, Ok], None]


# ---- rows -----------------------------------------------------------------


_LATER_COLUMNS = {"provider": None, "park_kind": None, "park_until": None, "nudges": 0}  # and their defaults


class Session(Record):  # a Record, not a dataclass: `ov status` imports this module (records.py says why)
    """One agent's row (``extra`` holds columns this version does not know)."""

    __slots__ = ("name", "generation", "version", "state", "state_reason", "capability", "task_id", "parent",
                 "depth", "run_id", "runtime", "mode", "model", "worktree", "branch", "base_branch", "spec",
                 "runtime_session_id", "loop_pid", "loop_start_ticks", "turn_pgid", "turn_start_ticks",
                 "current_turn_id", "current_tool", "tmux_session", "turns", "failed_turns", "retries",
                 "input_tokens", "output_tokens", "cost_usd", "terminal_mail_sent", "created_at", "updated_at",
                 "last_activity", "provider", "park_kind", "park_until", "nudges", "extra")

    name: str
    generation: int
    version: int
    state: str
    state_reason: str | None
    capability: str
    task_id: str
    parent: str
    depth: int
    run_id: str | None
    runtime: str
    mode: str
    model: str | None
    worktree: str | None
    branch: str | None
    base_branch: str | None
    spec: dict[str, t.Any]
    runtime_session_id: str | None
    loop_pid: int | None
    loop_start_ticks: int | None
    turn_pgid: int | None
    turn_start_ticks: int | None
    current_turn_id: str | None
    current_tool: str | None
    tmux_session: str | None
    turns: int
    failed_turns: int
    retries: int
    input_tokens: int
    output_tokens: int
    cost_usd: float
    terminal_mail_sent: int
    created_at: int
    updated_at: int
    last_activity: int
    provider: str | None             # whose quota window the agent shares (store.quota)
    park_kind: str | None            # why it is parked: budget | quota | auth | ... (store.lifecycle.park)
    park_until: int | None           # when a parked agent may go on by itself (ms); None: a person decides
    nudges: int                      # idle nudges sent since the agent last reported (agents.idle)
    extra: dict[str, t.Any]

    # Unlike other Records, a Session may be changed in place (a loop keeps its copy up to date), as the
    # dataclass it replaces could; so, like that dataclass, it is not hashable.
    __setattr__ = object.__setattr__  # type: ignore[assignment]
    __hash__ = None  # type: ignore[assignment]

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @classmethod
    def from_rows(cls, rows: t.Sequence[sqlite3.Row]) -> list[Session]:
        """``from_row`` of each, with the columns looked up once (`ov status` reads every agent's row)."""
        if not rows:
            return []
        index = {name: i for i, name in enumerate(rows[0].keys())}
        fields = cls.__slots__[:-1]
        picks = [index.get(name, -1) for name in fields]
        spec = fields.index("spec")
        others = [(name, i) for name, i in index.items() if name not in fields]
        sessions = []
        for row in rows:
            values = [row[i] if i >= 0 else _LATER_COLUMNS[name] for name, i in zip(fields, picks)]
            values[spec] = json.loads(values[spec] or "{}")  # type: ignore[arg-type]
            sessions.append(cls(*values, {name: row[i] for name, i in others}))
        return sessions

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Session:
        values = dict(row)
        values["spec"] = json.loads(values.get("spec") or "{}")
        # every field but ``extra`` (columns added by later migrations may be missing from an older, read-only file)
        fields = [values.pop(name) if name in values else _LATER_COLUMNS[name] for name in cls.__slots__[:-1]]
        return cls(*fields, values)  # what is left are the columns this version does not know


def get(conn: sqlite3.Connection, name: str) -> Session | None:
    row = conn.execute("SELECT * FROM sessions WHERE name = ?", (name,)).fetchone()
    return Session.from_row(row) if row else None


def list_sessions(conn: sqlite3.Connection, *, include_terminal: bool = True) -> list[Session]:
    if include_terminal:
        rows = conn.execute("SELECT * FROM sessions ORDER BY created_at, name").fetchall()
    else:
        marks = ",".join("?" * len(TERMINAL_STATES))
        rows = conn.execute(
            f"SELECT * FROM sessions WHERE state NOT IN ({marks}) ORDER BY created_at, name",
            tuple(TERMINAL_STATES),
        ).fetchall()
    return Session.from_rows(rows)


def similar_names(conn: sqlite3.Connection, name: str) -> list[str]:
    """The agents' names closest to a mistyped ``name``, best first (for "did you mean"; [] when none is close)."""
    from overstory.names import closest  # an error path: difflib only now

    return closest(name, [row[0] for row in conn.execute("SELECT name FROM sessions")])


def agent_not_found(conn: sqlite3.Connection, name: str, *, option: str = "", detail: str = "",
                    hint: str | None = None) -> AgentNotFound:
    """``AgentNotFound(name)`` with the existing names close to it (its "did you mean"); ``hint``: its own
    (``AgentNotFound.LISTS_THEM`` when not given)."""
    from overstory.errors import AgentNotFound

    return AgentNotFound(name, similar_names(conn, name), option=option, detail=detail,
                         hint=AgentNotFound.LISTS_THEM if hint is None else hint)


def no_agent_named(conn: sqlite3.Connection, name: str) -> str:
    """``no agent named 'x'``, with the closest existing names when some are close (inside another error)."""
    from overstory.errors import no_agent_named

    return no_agent_named(name, similar_names(conn, name))


# ---- writes ---------------------------------------------------------------


def create_session(conn: sqlite3.Connection, *, name: str, capability: str, task_id: str, runtime: str,
                   actor: str, parent: str = "operator", depth: int = 0, **columns: t.Any) -> int:
    """Insert ``name`` as a new generation in ``booting``; returns the generation.

    An existing row is replaced only when it is terminal; an active agent of that
    name raises AgentExists. The generation counter is never reused. Mail to the name
    that is still unread belonged to an earlier generation: in the same transaction it
    is closed (``read_at``) and marked ``superseded_by`` this generation, never delivered.
    """
    now = now_ms()
    if "spec" in columns and not isinstance(columns["spec"], str):
        columns["spec"] = json.dumps(columns["spec"])
    with write_transaction(conn):
        existing = conn.execute("SELECT state FROM sessions WHERE name = ?", (name,)).fetchone()
        if existing is not None and existing["state"] not in TERMINAL_STATES:
            from overstory.errors import AgentExists

            raise AgentExists(f"agent {name} is already active (state {existing['state']}); stop it first or pick another --name")
        row = conn.execute(
            "INSERT INTO generations(name, generation) VALUES (?, 1) "
            "ON CONFLICT(name) DO UPDATE SET generation = generation + 1 RETURNING generation",
            (name,),
        ).fetchone()
        generation = int(row[0])
        conn.execute("DELETE FROM sessions WHERE name = ?", (name,))
        values = {
            "name": name, "generation": generation, "version": 0, "state": "booting",
            "capability": capability, "task_id": task_id, "runtime": runtime, "parent": parent,
            "depth": depth, "created_at": now, "updated_at": now, "last_activity": now, **columns,
        }
        names = ", ".join(values)
        marks = ", ".join(f":{k}" for k in values)
        conn.execute(f"INSERT INTO sessions ({names}) VALUES ({marks})", values)
        _record(conn, name, generation, None, "booting", actor, "spawned", now)
        conn.execute("UPDATE mail SET read_at = ?, superseded_by = ? WHERE recipient = ? AND read_at IS NULL",
                     (now, generation, name))
    return generation


def discard_session(conn: sqlite3.Connection, name: str, generation: int) -> None:
    """Undo ``create_session`` for a spawn that failed half-way (its history goes too)."""
    with write_transaction(conn):
        conn.execute("DELETE FROM sessions WHERE name = ? AND generation = ?", (name, generation))
        conn.execute("DELETE FROM transitions WHERE name = ? AND generation = ?", (name, generation))


def transition(conn: sqlite3.Connection, name: str, generation: int, to: str, *, actor: str,
               reason: str | None = None, fields: t.Mapping[str, t.Any] | None = None,
               expect: t.Collection[str] | None = None, then: AfterTransition | None = None) -> Outcome:
    """Move ``name`` (as of ``generation``) to ``to`` by compare-and-swap.

    ``expect`` narrows the allowed predecessors further (e.g. the watchdog only
    stalls an agent it saw ``in_turn``). ``then`` runs inside the same transaction
    after a successful swap, so side effects such as the parent's ``worker_died``
    mail happen exactly once, with the transition that caused them.
    """
    if to not in ALLOWED_FROM:
        raise ValueError(f"unknown state {to!r}")
    allowed = ALLOWED_FROM[to] if expect is None else ALLOWED_FROM[to] & frozenset(expect)
    now = now_ms()
    with write_transaction(conn):
        row = conn.execute("SELECT state, generation, version FROM sessions WHERE name = ?", (name,)).fetchone()
        if row is None:
            return NotFound()
        if row["generation"] != generation:
            return StaleGeneration(current=row["generation"])
        prev = row["state"]
        if prev not in allowed:
            return IllegalTransition(prev=prev)
        assignments = {"state": to, "state_reason": reason, "updated_at": now, **(fields or {})}
        if "state" in (fields or {}):
            raise ValueError("state is set only through the `to` argument")
        sets = ", ".join(f"{k} = :{k}" for k in assignments)
        params = {**assignments, "_name": name, "_gen": generation, "_prev": prev}
        updated = conn.execute(
            f"UPDATE sessions SET {sets}, version = version + 1 "
            "WHERE name = :_name AND generation = :_gen AND state = :_prev RETURNING version",
            params,
        ).fetchone()
        ok = Ok(prev=prev, version=int(updated[0]))
        _record(conn, name, generation, prev, to, actor, reason, now)
        if then is not None:
            then(conn, ok)
    return ok


def update_fields(conn: sqlite3.Connection, name: str, generation: int, **fields: t.Any) -> bool:
    """Write non-state columns (activity, pgid, tokens…) fenced by generation. True if written."""
    if not fields:
        return True
    if "state" in fields or "generation" in fields:
        raise ValueError("state and generation change only through transition/create_session")
    fields.setdefault("updated_at", now_ms())
    sets = ", ".join(f"{k} = :{k}" for k in fields)
    cursor = conn.execute(
        f"UPDATE sessions SET {sets} WHERE name = :_name AND generation = :_gen",
        {**fields, "_name": name, "_gen": generation},
    )
    return cursor.rowcount == 1


def add_usage(conn: sqlite3.Connection, name: str, generation: int, *, input_tokens: int = 0,
              output_tokens: int = 0, cost_usd: float = 0.0) -> None:
    conn.execute(
        "UPDATE sessions SET input_tokens = input_tokens + ?, output_tokens = output_tokens + ?, "
        "cost_usd = cost_usd + ? WHERE name = ? AND generation = ?",
        (input_tokens, output_tokens, cost_usd, name, generation),
    )


def count_finished_turn(conn: sqlite3.Connection, name: str, generation: int) -> None:
    """A turn ended cleanly: one more turn, and the retry count starts over."""
    conn.execute("UPDATE sessions SET turns = turns + 1, retries = 0 WHERE name = ? AND generation = ?",
                 (name, generation))


def count_failed_turn(conn: sqlite3.Connection, name: str, generation: int, retries: int) -> None:
    """A turn failed and will be retried (``retries`` is the new count)."""
    conn.execute("UPDATE sessions SET retries = ?, failed_turns = failed_turns + 1 WHERE name = ? AND generation = ?",
                 (retries, name, generation))


def _record(conn: sqlite3.Connection, name: str, generation: int, prev: str | None, to: str, actor: str,
            reason: str | None, at: int) -> None:
    conn.execute(
        "INSERT INTO transitions(name, generation, from_state, to_state, actor, reason, at) VALUES (?,?,?,?,?,?,?)",
        (name, generation, prev, to, actor, reason, at),
    )


def history(conn: sqlite3.Connection, name: str) -> list[dict[str, t.Any]]:
    rows = conn.execute("SELECT * FROM transitions WHERE name = ? ORDER BY id", (name,)).fetchall()
    return [dict(r) for r in rows]


def transition_table() -> list[tuple[str, list[str]]]:
    """(to, sorted predecessors) rows for `ov doctor` and the README."""
    return [(to, sorted(ALLOWED_FROM[to])) for to in STATES]


# ---- small reads and counters other layers ask for (the SQL stays in store/) ----------------


def exists(conn: sqlite3.Connection, name: str) -> bool:
    return conn.execute("SELECT 1 FROM sessions WHERE name = ?", (name,)).fetchone() is not None


def parent_of(conn: sqlite3.Connection, name: str) -> str | None:
    """``name``'s parent; None when there is no such agent (or it has none)."""
    row = conn.execute("SELECT parent FROM sessions WHERE name = ?", (name,)).fetchone()
    return row[0] if row is not None else None


def mode_of(conn: sqlite3.Connection, name: str) -> str | None:
    row = conn.execute("SELECT mode FROM sessions WHERE name = ?", (name,)).fetchone()
    return row[0] if row is not None else None


def state_of(conn: sqlite3.Connection, name: str, generation: int) -> str | None:
    """The state of that generation of ``name``; None when the row is gone or newer."""
    row = conn.execute("SELECT state FROM sessions WHERE name = ? AND generation = ?", (name, generation)).fetchone()
    return row[0] if row is not None else None


def live_row(conn: sqlite3.Connection, name: str) -> sqlite3.Row | None:
    """(state, state_reason, generation) of ``name``: what a running turn checks between its steps."""
    return conn.execute("SELECT state, state_reason, generation FROM sessions WHERE name = ?", (name,)).fetchone()


def fence_row(conn: sqlite3.Connection, name: str) -> sqlite3.Row | None:
    """(generation, loop_pid) of ``name``: what tells a reader that the agent was replaced under it."""
    return conn.execute("SELECT generation, loop_pid FROM sessions WHERE name = ?", (name,)).fetchone()


def usage_row(conn: sqlite3.Connection, name: str, generation: int) -> sqlite3.Row | None:
    """(cost_usd, input_tokens, output_tokens) of that generation of ``name``."""
    return conn.execute("SELECT cost_usd, input_tokens, output_tokens FROM sessions WHERE name = ? AND generation = ?",
                        (name, generation)).fetchone()


def branch_row(conn: sqlite3.Connection, name: str) -> sqlite3.Row | None:
    """(branch, base_branch, spec) of ``name``."""
    return conn.execute("SELECT branch, base_branch, spec FROM sessions WHERE name = ?", (name,)).fetchone()


def count_active(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT count(*) FROM sessions WHERE state NOT IN ('completed','zombie')").fetchone()[0])


def count_active_children(conn: sqlite3.Connection, parent: str) -> int:
    return int(conn.execute("SELECT count(*) FROM sessions WHERE parent = ? AND state NOT IN ('completed', 'zombie')",
                            (parent,)).fetchone()[0])


def has_active_children(conn: sqlite3.Connection, parent: str) -> bool:
    return conn.execute("SELECT 1 FROM sessions WHERE parent = ? AND state NOT IN ('completed', 'zombie') LIMIT 1",
                        (parent,)).fetchone() is not None


def active_names(conn: sqlite3.Connection) -> list[str]:
    ended = tuple(TERMINAL_STATES)
    return [r[0] for r in conn.execute(
        f"SELECT name FROM sessions WHERE state NOT IN ({','.join('?' * len(ended))}) ORDER BY name", ended)]


def names_and_states(conn: sqlite3.Connection) -> list[tuple[str, str]]:
    """(name, state) of every agent, active ones first (shell completion)."""
    return conn.execute("SELECT name, state FROM sessions ORDER BY state IN ('completed', 'zombie'), name").fetchall()


def names_in_run(conn: sqlite3.Connection, run_id: str, *, by_depth: bool = False) -> list[str]:
    """The run's agents, oldest first (``by_depth``: parents before their children)."""
    order = "depth, created_at, name" if by_depth else "created_at"
    return [r[0] for r in conn.execute(f"SELECT name FROM sessions WHERE run_id = ? ORDER BY {order}",
                                       (run_id,)).fetchall()]


def budget_parked_in_run(conn: sqlite3.Connection, run_id: str) -> list[str]:
    """The run's agents parked on a budget, parents first."""
    return [r[0] for r in conn.execute("SELECT name FROM sessions WHERE run_id = ? AND state = 'parked' "
                                       "AND park_kind = 'budget' ORDER BY depth, created_at", (run_id,)).fetchall()]


def auth_parked(conn: sqlite3.Connection) -> list[sqlite3.Row]:
    """(name, runtime, state_reason) of the agents parked because their runtime could not log in."""
    return conn.execute("SELECT name, runtime, state_reason FROM sessions WHERE state = 'parked' "
                        "AND park_kind = 'auth' ORDER BY name").fetchall()


def names_on_branch(conn: sqlite3.Connection, branch: str) -> list[str]:
    return [r[0] for r in conn.execute("SELECT name FROM sessions WHERE branch = ?", (branch,)).fetchall()]


def newest_on_branch(conn: sqlite3.Connection, branch: str) -> str | None:
    row = conn.execute("SELECT name FROM sessions WHERE branch = ? ORDER BY generation DESC", (branch,)).fetchone()
    return row[0] if row is not None else None


def owned_tmux_sessions(conn: sqlite3.Connection) -> set[str]:
    """The tmux sessions that active tmux agents own."""
    return {row[0] for row in conn.execute(
        "SELECT tmux_session FROM sessions WHERE mode = 'tmux' AND tmux_session IS NOT NULL "
        "AND state NOT IN ('completed', 'zombie')").fetchall()}


def coordinator_name(conn: sqlite3.Connection, *, active: bool) -> str | None:
    """The newest active coordinator's name (``active``), else the one touched last, active or not."""
    if active:
        marks = ",".join("?" * len(TERMINAL_STATES))
        row = conn.execute(f"SELECT name FROM sessions WHERE capability = 'coordinator' AND state NOT IN ({marks}) "
                           "ORDER BY created_at DESC LIMIT 1", tuple(TERMINAL_STATES)).fetchone()
    else:
        row = conn.execute("SELECT name FROM sessions WHERE capability = 'coordinator' "
                           "ORDER BY updated_at DESC LIMIT 1").fetchone()
    return row[0] if row is not None else None


def fork_names_taken(conn: sqlite3.Connection, source: str) -> set[str]:
    """Names ever used by forks of ``source`` (``SOURCE-forkN``)."""
    return {r[0] for r in conn.execute("SELECT name FROM generations WHERE name LIKE ?", (f"{source}-fork%",))}


def count_nudge(conn: sqlite3.Connection, name: str, generation: int, seen: int) -> bool:
    """One more nudge for an idle agent, if nobody counted one since it read ``seen``; whether it counted."""
    return bool(conn.execute("UPDATE sessions SET nudges = nudges + 1 WHERE name = ? AND generation = ? "
                             "AND nudges = ? AND state = 'between_turns'", (name, generation, seen)).rowcount)


def recent_transitions(conn: sqlite3.Connection, name: str, generation: int, limit: int) -> list[sqlite3.Row]:
    """That generation's newest ``limit`` state changes, newest first."""
    return conn.execute("SELECT from_state, to_state, actor, reason, at FROM transitions WHERE name = ? "
                        "AND generation = ? ORDER BY id DESC LIMIT ?", (name, generation, limit)).fetchall()


def completed_at(conn: sqlite3.Connection, name: str, generation: int) -> int | None:
    """When that generation moved to completed, if it did."""
    row = conn.execute("SELECT max(at) FROM transitions WHERE name = ? AND generation = ? AND to_state = 'completed'",
                       (name, generation)).fetchone()
    return int(row[0]) if row and row[0] is not None else None


def parkings_after(conn: sqlite3.Connection, after_id: int) -> tuple[list[sqlite3.Row], int]:
    """Moves to parked after transition ``after_id`` (with the agent's current row), and the newest transition id."""
    rows = conn.execute("SELECT t.id, t.name, t.generation, t.reason, s.park_kind, s.state, s.generation AS g "
                        "FROM transitions t LEFT JOIN sessions s ON s.name = t.name "
                        "WHERE t.id > ? AND t.to_state = 'parked' ORDER BY t.id", (after_id,)).fetchall()
    top = conn.execute("SELECT COALESCE(MAX(id), 0) FROM transitions").fetchone()[0]
    return rows, int(top)
