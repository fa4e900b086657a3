"""The schema of state.db and events.db as append-only migrations.

A released migration is never edited: a change to the schema is a new function
appended to its list. ``store.db.migrate`` applies those past ``PRAGMA user_version``,
each in its own transaction.
"""

from __future__ import annotations

from overstory.store.migrations_teams import _state_m014_task_groups, _state_m015_sibling_notices

TYPE_CHECKING = False  # hot commands open databases: typing, collections and sqlite3's package are not imported
if TYPE_CHECKING:
    import sqlite3
    from collections.abc import Callable

    Migration = Callable[[sqlite3.Connection], None]


def run_script(conn: sqlite3.Connection, script: str) -> None:
    """Run several statements inside the caller's transaction (``executescript`` would COMMIT first, breaking it)."""
    try:  # the C module, as store.db uses it
        from _sqlite3 import complete_statement
    except ImportError:  # pragma: no cover - an interpreter that only ships the package
        from sqlite3 import complete_statement

    statement = ""
    for line in script.splitlines(keepends=True):
        statement += line
        if complete_statement(statement):
            conn.execute(statement)
            statement = ""
    if statement.strip():
        raise ValueError(f"incomplete SQL statement in migration: {statement.strip()[:80]}")


def _state_m001_initial(conn: sqlite3.Connection) -> None:
    run_script(conn, 
        """
        CREATE TABLE sessions (
            name               TEXT PRIMARY KEY,
            generation         INTEGER NOT NULL,
            version            INTEGER NOT NULL DEFAULT 0,
            state              TEXT NOT NULL,
            state_reason       TEXT,
            capability         TEXT NOT NULL,
            task_id            TEXT NOT NULL,
            parent             TEXT NOT NULL DEFAULT 'operator',
            depth              INTEGER NOT NULL DEFAULT 0,
            run_id             TEXT,
            runtime            TEXT NOT NULL,
            mode               TEXT NOT NULL DEFAULT 'headless',
            model              TEXT,
            worktree           TEXT,
            branch             TEXT,
            base_branch        TEXT,
            spec               TEXT NOT NULL DEFAULT '{}',
            runtime_session_id TEXT,
            loop_pid           INTEGER,
            loop_start_ticks   INTEGER,
            turn_pgid          INTEGER,
            turn_start_ticks   INTEGER,
            current_turn_id    TEXT,
            current_tool       TEXT,
            tmux_session       TEXT,
            turns              INTEGER NOT NULL DEFAULT 0,
            failed_turns       INTEGER NOT NULL DEFAULT 0,
            retries            INTEGER NOT NULL DEFAULT 0,
            input_tokens       INTEGER NOT NULL DEFAULT 0,
            output_tokens      INTEGER NOT NULL DEFAULT 0,
            cost_usd           REAL NOT NULL DEFAULT 0,
            terminal_mail_sent INTEGER NOT NULL DEFAULT 0,
            created_at         INTEGER NOT NULL,
            updated_at         INTEGER NOT NULL,
            last_activity      INTEGER NOT NULL
        );
        CREATE INDEX sessions_state ON sessions(state);
        CREATE INDEX sessions_parent ON sessions(parent);
        CREATE INDEX sessions_run ON sessions(run_id);

        -- Never rolled back or deleted: a name's next generation is always new.
        CREATE TABLE generations (
            name       TEXT PRIMARY KEY,
            generation INTEGER NOT NULL
        );

        CREATE TABLE transitions (
            id         INTEGER PRIMARY KEY,
            name       TEXT NOT NULL,
            generation INTEGER NOT NULL,
            from_state TEXT,
            to_state   TEXT NOT NULL,
            actor      TEXT NOT NULL,
            reason     TEXT,
            at         INTEGER NOT NULL
        );
        CREATE INDEX transitions_name ON transitions(name, id);

        CREATE TABLE mail (
            id          INTEGER PRIMARY KEY,
            thread_id   INTEGER,
            reply_to    INTEGER,
            sender      TEXT NOT NULL,
            recipient   TEXT NOT NULL,
            type        TEXT NOT NULL,
            priority    INTEGER NOT NULL DEFAULT 1,
            subject     TEXT NOT NULL,
            body        TEXT NOT NULL DEFAULT '',
            payload     TEXT,
            created_at  INTEGER NOT NULL,
            read_at     INTEGER,
            claimed_by  TEXT,
            claimed_at  INTEGER,
            dedup_key   TEXT UNIQUE
        );
        CREATE INDEX mail_inbox ON mail(recipient, read_at, id);
        CREATE INDEX mail_claims ON mail(claimed_by);
        CREATE INDEX mail_thread ON mail(thread_id, id);
        CREATE INDEX mail_created ON mail(created_at);

        CREATE TABLE turns (
            id            TEXT PRIMARY KEY,
            agent         TEXT NOT NULL,
            generation    INTEGER NOT NULL,
            number        INTEGER NOT NULL,
            attempt       INTEGER NOT NULL DEFAULT 0,
            status        TEXT NOT NULL,
            pid           INTEGER,
            pgid          INTEGER,
            session_id    TEXT,
            resumed       INTEGER NOT NULL DEFAULT 0,
            started_at    INTEGER NOT NULL,
            ended_at      INTEGER,
            input_tokens  INTEGER NOT NULL DEFAULT 0,
            output_tokens INTEGER NOT NULL DEFAULT 0,
            cost_usd      REAL NOT NULL DEFAULT 0,
            tool_calls    INTEGER NOT NULL DEFAULT 0,
            error         TEXT,
            log_dir       TEXT
        );
        CREATE INDEX turns_agent ON turns(agent, started_at);
        CREATE INDEX turns_status ON turns(status);

        CREATE TABLE runs (
            id              TEXT PRIMARY KEY,
            coordinator     TEXT,
            status          TEXT NOT NULL DEFAULT 'open',
            started_at      INTEGER NOT NULL,
            completed_at    INTEGER,
            summary_sent_at INTEGER
        );

        CREATE TABLE merge_queue (
            id           INTEGER PRIMARY KEY,
            agent        TEXT,
            branch       TEXT NOT NULL,
            target       TEXT,
            task_id      TEXT,
            files        TEXT NOT NULL DEFAULT '[]',
            mail_id      INTEGER UNIQUE,
            status       TEXT NOT NULL DEFAULT 'pending',
            tier         INTEGER,
            result       TEXT,
            enqueued_at  INTEGER NOT NULL,
            processed_at INTEGER
        );
        CREATE INDEX merge_queue_status ON merge_queue(status, id);
        """
    )


def _state_m002_pending_mail_index(conn: sqlite3.Connection) -> None:
    """Mail waiting for delivery, found without walking read or claimed rows (status, loops)."""
    conn.execute(
        "CREATE INDEX IF NOT EXISTS mail_pending ON mail(recipient, priority, id) "
        "WHERE read_at IS NULL AND claimed_by IS NULL"
    )


def _state_m003_intents(conn: sqlite3.Connection) -> None:
    """Records of intent for the two commands that change git and the database together.

    ``spawn_intents``: written before `ov sling` creates anything, deleted when the spawn is
    complete. A row whose spawner is dead is a half-done spawn that a retry, `ov stop` or
    the watchdog undoes. ``merge_intents``: written before `ov merge` starts, deleted once
    its result is announced; a dead merger's row is finished (mail) or rolled back.
    """
    run_script(conn,
        """
        CREATE TABLE spawn_intents (
            name         TEXT PRIMARY KEY,
            pid          INTEGER,
            pid_ticks    INTEGER,
            step         TEXT NOT NULL,
            branch       TEXT,
            base_commit  TEXT,
            worktree     TEXT,
            run_dir      TEXT NOT NULL,
            tmux_session TEXT,
            generation   INTEGER,
            dispatch_id  INTEGER,
            started_at   INTEGER NOT NULL
        );

        CREATE TABLE merge_intents (
            id            INTEGER PRIMARY KEY,
            agent         TEXT,
            generation    INTEGER,
            branch        TEXT NOT NULL,
            target        TEXT NOT NULL,
            source_commit TEXT NOT NULL,
            target_before TEXT NOT NULL,
            queue_id      INTEGER,
            sender        TEXT NOT NULL,
            pid           INTEGER,
            pid_ticks     INTEGER,
            started_at    INTEGER NOT NULL
        );
        CREATE INDEX merge_intents_branch ON merge_intents(branch, target);
        """
    )


def _state_m005_budgets(conn: sqlite3.Connection) -> None:
    """Budgets, parking, quota windows, idle nudges and per-turn cost detail (issue 14).

    ``budgets`` holds one row per agent generation (scope 'agent') and per run (scope
    'run', generation 0): the four limits and what was used against them. A trigger
    rolls every change of an agent's counters up into its run's row in the same
    statement, so `ov guard` counts a tool call against both with one UPDATE and a run
    keeps what earlier generations of its agents spent.
    """
    run_script(conn,
        """
        CREATE TABLE budgets (
            scope              TEXT NOT NULL,
            name               TEXT NOT NULL,
            generation         INTEGER NOT NULL DEFAULT 0,
            run_id             TEXT,
            max_usd            REAL,
            max_turns          INTEGER,
            max_tool_calls     INTEGER,
            max_wallclock      REAL,
            started_at         INTEGER NOT NULL,
            spent_usd          REAL NOT NULL DEFAULT 0,
            live_usd           REAL NOT NULL DEFAULT 0,
            turns              INTEGER NOT NULL DEFAULT 0,
            tool_calls         INTEGER NOT NULL DEFAULT 0,
            refused_tool_calls INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (scope, name, generation)
        );
        CREATE INDEX budgets_run ON budgets(run_id, scope);
        CREATE TRIGGER budgets_roll_up AFTER UPDATE OF spent_usd, live_usd, turns, tool_calls ON budgets
        WHEN NEW.scope = 'agent' AND NEW.run_id IS NOT NULL
        BEGIN
            UPDATE budgets SET spent_usd = spent_usd + NEW.spent_usd - OLD.spent_usd,
                               live_usd = live_usd + NEW.live_usd - OLD.live_usd,
                               turns = turns + NEW.turns - OLD.turns,
                               tool_calls = tool_calls + NEW.tool_calls - OLD.tool_calls
            WHERE scope = 'run' AND name = NEW.run_id AND generation = 0;
        END;

        CREATE TABLE quota_windows (
            provider   TEXT PRIMARY KEY,
            until_ms   INTEGER NOT NULL,
            level      INTEGER NOT NULL DEFAULT 0,
            reset_known INTEGER NOT NULL DEFAULT 0,
            reason     TEXT,
            opened_at  INTEGER NOT NULL,
            updated_at INTEGER NOT NULL
        );

        ALTER TABLE sessions ADD COLUMN provider TEXT;
        ALTER TABLE sessions ADD COLUMN park_kind TEXT;
        ALTER TABLE sessions ADD COLUMN park_until INTEGER;
        ALTER TABLE sessions ADD COLUMN nudges INTEGER NOT NULL DEFAULT 0;
        CREATE INDEX sessions_parked ON sessions(park_until) WHERE state = 'parked';

        ALTER TABLE turns ADD COLUMN capability TEXT;
        ALTER TABLE turns ADD COLUMN run_id TEXT;
        ALTER TABLE turns ADD COLUMN model TEXT;
        ALTER TABLE turns ADD COLUMN cache_read_tokens INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE turns ADD COLUMN cache_write_tokens INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE turns ADD COLUMN cost_estimated INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE turns ADD COLUMN usage_by_model TEXT;
        CREATE INDEX turns_started ON turns(started_at);
        """
    )


def _state_m006_tool_ledger(conn: sqlite3.Connection) -> None:
    """The tool-call ledger (one row per tool call, ARCHITECTURE §13) and one checkpoint per turn.

    ``scope`` names the dispatch a turn answers ("mail:<lowest claimed mail id>"): the
    same for every attempt of that turn, so a retried attempt finds what the crashed one
    did. ``idem_key`` hashes agent, task, class, tool, normalized input and scope.
    """
    run_script(conn,
        """
        CREATE TABLE tool_calls (
            id           INTEGER PRIMARY KEY,
            run_id       TEXT,
            agent        TEXT NOT NULL,
            generation   INTEGER NOT NULL,
            turn_id      TEXT,
            attempt      INTEGER NOT NULL DEFAULT 0,
            scope        TEXT,
            dispatch     TEXT,
            tool_use_id  TEXT,
            tool         TEXT NOT NULL,
            input        TEXT NOT NULL,
            class        TEXT NOT NULL,
            idem_key     TEXT NOT NULL,
            status       TEXT NOT NULL,
            reason       TEXT,
            replay_of    INTEGER,
            flagged      INTEGER NOT NULL DEFAULT 0,
            exit_code    INTEGER,
            receipt      TEXT,
            duration_ms  INTEGER,
            source       TEXT NOT NULL DEFAULT 'hook',
            started_at   INTEGER NOT NULL,
            ended_at     INTEGER
        );
        CREATE INDEX tool_calls_key ON tool_calls(idem_key, id);
        CREATE INDEX tool_calls_agent ON tool_calls(agent, id);
        CREATE INDEX tool_calls_turn ON tool_calls(turn_id, id);
        CREATE INDEX tool_calls_use ON tool_calls(tool_use_id);
        CREATE INDEX tool_calls_flagged ON tool_calls(flagged) WHERE flagged = 1;

        CREATE TABLE checkpoints (
            turn_id       TEXT PRIMARY KEY,
            agent         TEXT NOT NULL,
            generation    INTEGER NOT NULL,
            attempt       INTEGER NOT NULL DEFAULT 0,
            scope         TEXT,
            mail_ids      TEXT NOT NULL DEFAULT '[]',
            session_id    TEXT,
            head          TEXT,
            git_status    TEXT,
            cost_usd      REAL NOT NULL DEFAULT 0,
            input_tokens  INTEGER NOT NULL DEFAULT 0,
            output_tokens INTEGER NOT NULL DEFAULT 0,
            phase         TEXT NOT NULL,
            turn_status   TEXT,
            started_at    INTEGER NOT NULL,
            at            INTEGER NOT NULL
        );
        CREATE INDEX checkpoints_agent ON checkpoints(agent, started_at);
        CREATE INDEX checkpoints_scope ON checkpoints(agent, scope);
        """
    )


def _state_m007_approvals(conn: sqlite3.Connection) -> None:
    """Approval gates (one row per gated tool call or turn) and the notification outbox.

    ``approvals.key`` is the call's idempotency key without the dispatch scope: the
    approved call runs in a later turn (answering the approval mail), so only
    agent, task, class, tool and normalized input name it. ``used_at`` marks the one run
    an approval allows. ``notify_outbox`` rows are written in the transaction of the
    state change they announce (or found later from durable state) and sent after it
    commits; ``dedup_key`` makes a restart send nothing twice.
    """
    run_script(conn,
        """
        CREATE TABLE approvals (
            id           TEXT PRIMARY KEY,
            agent        TEXT NOT NULL,
            generation   INTEGER NOT NULL,
            turn_id      TEXT,
            task_id      TEXT,
            tool         TEXT NOT NULL,
            input        TEXT NOT NULL,
            key          TEXT NOT NULL,
            rule         TEXT,
            reason       TEXT,
            decider      TEXT NOT NULL,
            status       TEXT NOT NULL DEFAULT 'pending',
            on_timeout   TEXT NOT NULL DEFAULT 'reject',
            timeout_s    REAL NOT NULL,
            escalations  INTEGER NOT NULL DEFAULT 0,
            requested_at INTEGER NOT NULL,
            deadline     INTEGER NOT NULL,
            decided_at   INTEGER,
            decided_by   TEXT,
            note         TEXT,
            used_at      INTEGER,
            mail_id      INTEGER
        );
        CREATE INDEX approvals_pending ON approvals(status, deadline);
        CREATE INDEX approvals_agent ON approvals(agent, generation, status);
        CREATE INDEX approvals_key ON approvals(key, status);

        CREATE TABLE notify_outbox (
            id          INTEGER PRIMARY KEY,
            dedup_key   TEXT NOT NULL UNIQUE,
            kind        TEXT NOT NULL,
            agent       TEXT,
            title       TEXT NOT NULL,
            body        TEXT NOT NULL,
            created_at  INTEGER NOT NULL,
            attempts    INTEGER NOT NULL DEFAULT 0,
            next_at     INTEGER NOT NULL,
            delivered   TEXT NOT NULL DEFAULT '[]',
            sent_at     INTEGER,
            last_error  TEXT
        );
        CREATE INDEX notify_outbox_due ON notify_outbox(sent_at, next_at);

        CREATE TABLE notify_cursor (
            name  TEXT PRIMARY KEY,
            value INTEGER NOT NULL
        );
        """
    )


def _state_m008_loops_and_schedules(conn: sqlite3.Connection) -> None:
    """`ov loop` (its loop, every iteration, the checkpoints at phase boundaries) and `ov schedule`."""
    run_script(conn,
        """
        CREATE TABLE loops (
            name            TEXT NOT NULL,
            generation      INTEGER NOT NULL,
            definition      TEXT NOT NULL,
            status          TEXT NOT NULL DEFAULT 'running',
            iterations      INTEGER NOT NULL DEFAULT 0,
            max_iterations  INTEGER,
            phase_index     INTEGER NOT NULL DEFAULT 0,
            phase_round     INTEGER NOT NULL DEFAULT 0,
            phase_started   INTEGER NOT NULL DEFAULT 0,
            extra_phase_iterations INTEGER NOT NULL DEFAULT 0,
            extra_phase_usd REAL NOT NULL DEFAULT 0,
            same_failures   INTEGER NOT NULL DEFAULT 0,
            last_fingerprint TEXT,
            last_check_exit INTEGER,
            last_check_tail TEXT,
            critic_agent    TEXT,
            critic_since    INTEGER,
            critic_notes    TEXT,
            created_at      INTEGER NOT NULL,
            updated_at      INTEGER NOT NULL,
            PRIMARY KEY (name, generation)
        );

        CREATE TABLE loop_iterations (
            name            TEXT NOT NULL,
            generation      INTEGER NOT NULL,
            number          INTEGER NOT NULL,
            attempt         INTEGER NOT NULL DEFAULT 1,
            phase           TEXT,
            phase_round     INTEGER NOT NULL DEFAULT 0,
            status          TEXT NOT NULL,
            turn_id         TEXT,
            session_id      TEXT,
            cost_usd        REAL NOT NULL DEFAULT 0,
            promise_seen    INTEGER,
            check_exit      INTEGER,
            check_seconds   REAL,
            check_tail      TEXT,
            fingerprint     TEXT,
            progress        TEXT,
            outcome         TEXT,
            started_at      INTEGER NOT NULL,
            ended_at        INTEGER,
            PRIMARY KEY (name, generation, number, attempt)
        );

        CREATE TABLE loop_checkpoints (
            name            TEXT NOT NULL,
            generation      INTEGER NOT NULL,
            seq             INTEGER NOT NULL,
            phase           TEXT NOT NULL,
            phase_round     INTEGER NOT NULL DEFAULT 0,
            commit_sha      TEXT NOT NULL,
            ref             TEXT NOT NULL,
            progress        TEXT,
            verdict         TEXT,
            created_at      INTEGER NOT NULL,
            PRIMARY KEY (name, generation, seq)
        );

        CREATE TABLE schedules (
            id          INTEGER PRIMARY KEY AUTOINCREMENT,
            name        TEXT NOT NULL UNIQUE,
            kind        TEXT NOT NULL,
            cron        TEXT,
            mail_type   TEXT,
            mail_from   TEXT,
            argv        TEXT NOT NULL,
            paused      INTEGER NOT NULL DEFAULT 0,
            cursor      INTEGER NOT NULL,
            fired       INTEGER NOT NULL DEFAULT 0,
            created_at  INTEGER NOT NULL,
            updated_at  INTEGER NOT NULL
        );

        CREATE TABLE schedule_fires (
            id           INTEGER PRIMARY KEY,
            schedule_id  INTEGER NOT NULL REFERENCES schedules(id) ON DELETE CASCADE,
            occasion     TEXT NOT NULL,
            n            INTEGER NOT NULL,
            due_at       INTEGER,
            mail_id      INTEGER,
            argv         TEXT NOT NULL,
            status       TEXT NOT NULL,
            claimer_pid  INTEGER,
            claimer_ticks INTEGER,
            runner_pid   INTEGER,
            runner_ticks INTEGER,
            exit_code    INTEGER,
            output       TEXT,
            claimed_at   INTEGER NOT NULL,
            started_at   INTEGER,
            ended_at     INTEGER,
            UNIQUE (schedule_id, occasion)
        );
        CREATE INDEX schedule_fires_open ON schedule_fires(status) WHERE status IN ('claimed', 'running');
        """
    )


def _state_m009_schedule_overlap(conn: sqlite3.Connection) -> None:
    """Schedules: an overlap policy, the agent each fire starts, skipped occasions, failures in a row and back-off."""
    run_script(conn,
        """
        ALTER TABLE schedules ADD COLUMN overlap TEXT NOT NULL DEFAULT 'skip';
        ALTER TABLE schedules ADD COLUMN agent TEXT;
        ALTER TABLE schedules ADD COLUMN skipped INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE schedules ADD COLUMN last_skip TEXT;
        ALTER TABLE schedules ADD COLUMN last_skip_at INTEGER;
        ALTER TABLE schedules ADD COLUMN failures INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE schedules ADD COLUMN backoff_until INTEGER;
        ALTER TABLE schedule_fires ADD COLUMN agent TEXT;
        CREATE INDEX schedule_fires_agent ON schedule_fires(schedule_id, agent);
        """
    )


def _state_m010_superseded_mail_and_worktree_admin(conn: sqlite3.Connection) -> None:
    """``mail.superseded_by``: the generation that took the recipient's name before the mail was delivered
    (kept, closed, never shown to it); ``spawn_intents.worktree_admin``: git's folder for the worktree a
    spawn adds, named before the add, so a spawn killed inside `git worktree add` can be undone."""
    conn.execute("ALTER TABLE mail ADD COLUMN superseded_by INTEGER")
    conn.execute("ALTER TABLE spawn_intents ADD COLUMN worktree_admin TEXT")


def _state_m011_loop_check_env_and_held_report(conn: sqlite3.Connection) -> None:
    """`ov loop`: where each check's full output is (``check_log``) and the Python environment it ran in
    (``check_env``, JSON); the loop agent's own ``worker_done``, held while its loop runs (``held_report``)."""
    run_script(conn,
        """
        ALTER TABLE loop_iterations ADD COLUMN check_log TEXT;
        ALTER TABLE loop_iterations ADD COLUMN check_env TEXT;
        ALTER TABLE loops ADD COLUMN held_report TEXT;
        """
    )


def _state_m012_webhook_secret(conn: sqlite3.Connection) -> None:
    """`ov schedule add --on-webhook`: the SHA-256 of the trigger's secret (the secret itself is never stored)."""
    conn.execute("ALTER TABLE schedules ADD COLUMN secret_hash TEXT")


def _state_m013_turn_node(conn: sqlite3.Connection) -> None:
    conn.execute("ALTER TABLE turns ADD COLUMN node TEXT")  # where it ran: a Ray node id, or this host's name


STATE_MIGRATIONS: list[Migration] = [_state_m001_initial, _state_m002_pending_mail_index, _state_m003_intents,
                                     _state_m005_budgets, _state_m006_tool_ledger,
                                     _state_m008_loops_and_schedules,
                                     _state_m007_approvals,  # m007 lands after m008: databases at m008 exist
                                     _state_m009_schedule_overlap, _state_m010_superseded_mail_and_worktree_admin,
                                     _state_m011_loop_check_env_and_held_report, _state_m012_webhook_secret,
                                     _state_m013_turn_node, _state_m014_task_groups,
                                     _state_m015_sibling_notices]
