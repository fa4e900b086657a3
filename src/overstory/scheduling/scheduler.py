"""Work that starts by itself: `ov schedule` cron schedules and mail triggers, fired by the watchdog.

Each watchdog tick calls ``Scheduler.tick``. A cron schedule is due when the latest time
its expression names (in the local time zone; 5 fields, or 6 with seconds last) is past
its cursor; a mail trigger when mail of its type (from its sender) reached the operator
past its cursor. A due fire is *claimed* first: one transaction inserts its row, unique
by (schedule, occasion), and moves the cursor (``store.schedules.claim``), so two
watchdogs that race, or one that restarts mid-fire, never fire one occasion twice. Then
a detached runner (``schedule_runner``) takes the claim and runs the command, so a
watchdog that dies does not take the fire with it.

What is left behind by a death is settled on the next tick, by whichever watchdog:
a claim whose claimer died before any runner took it is taken over and launched; a
fire whose runner died while the command ran is ``lost`` (reported, not repeated: the
command may already have started work). Missed occasions while no watchdog ran:
``schedules.catch_up: latest`` fires once, for the latest; ``none`` skips them.

Overlap and failures: the claim first asks whether the occasion is held back (in the
same transaction, ``store.schedules.holding_back``): after failed fires the schedule
backs off (``schedules.backoff``, doubling up to ``schedules.backoff_max``); with the
overlap policy ``skip`` (the default, like a Kubernetes CronJob's ``Forbid``) it does not
fire while its previous fire runs or an agent a fire started is still active or waits
for an approval. A held-back occasion is a ``schedule_skipped`` event and a count on the
schedule, never a fire. Only the first failed fire of a row mails a person.

``croniter`` is imported only here and by `ov schedule`, never on a hot path.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import typing as t
from datetime import datetime

from overstory import procs
from overstory.clock import now_ms
from overstory.errors import ScheduleError
from overstory.paths import ProjectPaths
from overstory.store import schedules
from overstory.store.schedules import Schedule

# The `ov` command lines a schedule may run: those that start work.
STARTS_WORK = (("sling",), ("loop",), ("coordinator", "send"))
LATE_AFTER_MS = 60_000  # a due time older than this (or than 3 ticks) when first seen was missed


# ---- cron arithmetic, in the local time zone -------------------------------------------


def _local(ms: int) -> datetime:
    from dateutil import tz

    return datetime.fromtimestamp(ms / 1000, tz.tzlocal())


def check_cron(expression: str, seconds: str | None = None) -> str:
    """The stored (croniter-order) expression: five fields, plus ``seconds`` as a sixth, last, field.

    A six-field expression is refused: croniter (and ov) read the sixth field as seconds, while Quartz and
    node-cron put seconds first, so ``*/20 * * * * *`` would fire every second of minutes 0, 20 and 40."""
    from croniter import croniter

    fields = expression.split()
    if len(fields) == 6:
        raise ScheduleError(f"six-field cron {expression!r} refused: ov would read the LAST field as seconds "
                            "(croniter order), Quartz and node-cron read the first; give five fields (minute hour "
                            "day month weekday) and the seconds with --seconds, or use --every (e.g. --every 20s)")
    expression = " ".join(fields)
    if seconds is not None:
        if len(seconds.split()) != 1 or not croniter.is_valid(f"* * * * * {seconds}"):
            raise ScheduleError(f"not a seconds field: {seconds!r} (e.g. \"0\", \"*/20\", \"0,30\")")
        expression = f"{expression} {seconds}"
    if len(fields) != 5 or not croniter.is_valid(expression):
        raise ScheduleError(f"not a cron expression: {' '.join(fields)!r} (five fields, minute hour day month "
                            "weekday, e.g. \"0 2 * * *\"; seconds go in --seconds)")
    return expression


def every_cron(interval: str) -> str:
    """``--every 20s`` / ``5m`` / ``2h`` as a cron expression; the interval must divide a minute, an hour or a
    day evenly (so every fire is the same distance apart, counted from the top of the minute, hour or day)."""
    text = interval.strip().lower()
    unit = text[-1:]
    try:
        n = int(text[:-1])
    except ValueError:
        n = 0
    whole = {"s": 60, "m": 60, "h": 24}.get(unit)
    if whole is None or n <= 0:
        raise ScheduleError(f"not an interval: {interval!r} (a whole number of s, m or h, e.g. 20s, 5m, 2h)")
    if whole % n and n != whole:
        raise ScheduleError(f"--every {interval} does not divide a {'minute' if unit == 's' else 'hour' if unit == 'm' else 'day'} "
                            "evenly; use --cron (with --seconds) for other timings")
    if unit == "s":
        return "* * * * *" if n == 60 else f"* * * * * */{n}"
    if unit == "m":
        return "0 * * * *" if n == 60 else f"*/{n} * * * *"
    return "0 0 * * *" if n == 24 else f"0 */{n} * * *"


def next_fires(expression: str, after_ms: int, count: int = 3) -> list[int]:
    """The next ``count`` times the expression names strictly after ``after_ms``."""
    out: list[int] = []
    for _ in range(count):
        after_ms = next_due(expression, after_ms)
        out.append(after_ms)
    return out


def next_due(expression: str, after_ms: int) -> int:
    """The first time the expression names strictly after ``after_ms``."""
    from croniter import croniter

    return int(croniter(expression, _local(after_ms)).get_next(datetime).timestamp() * 1000)


def latest_due(expression: str, now: int) -> int:
    """The latest time the expression names at or before ``now``."""
    from croniter import croniter

    return int(croniter(expression, _local(now + 1)).get_prev(datetime).timestamp() * 1000)


def zone_label(at_ms: int | None = None) -> str:
    moment = _local(now_ms() if at_ms is None else at_ms)
    return f"{moment.tzname()} (UTC{moment.strftime('%z')})"


def local_text(ms: int | None) -> str:
    return "-" if ms is None else _local(ms).strftime("%Y-%m-%d %H:%M:%S")


# ---- command lines ---------------------------------------------------------------------


def check_command(argv: t.Sequence[str]) -> list[str]:
    """The schedule's `ov` command line (a leading ``ov`` is dropped); only commands that start work."""
    args = list(argv)
    if args[:1] == ["ov"]:
        args = args[1:]
    if not args:
        raise ScheduleError("give the command to run after `--`, e.g. `-- sling builder deps-{date} --prompt ...`")
    if any(a == "--project" or a.startswith("--project=") for a in args):
        raise ScheduleError("a schedule runs in its own project: leave out --project")
    if not any(tuple(args[: len(words)]) == words for words in STARTS_WORK):
        raise ScheduleError(f"`ov {' '.join(args[:2])}` does not start work; a schedule runs `ov sling`, `ov loop` "
                            "or `ov coordinator send`")
    return args


def render(argv: t.Sequence[str], *, at_ms: int, n: int, mail: t.Mapping[str, t.Any] | None = None,
           delivery: str | None = None) -> list[str]:
    """Fill the placeholders: {date} (YYYYMMDD), {time} (HHMM), {n} (the fire's number); for a mail trigger
    also {from} and {mail_id}; for a webhook {delivery} (its delivery id). The date and time are the due
    time's, in the local zone."""
    moment = _local(at_ms)
    values = {"date": moment.strftime("%Y%m%d"), "time": moment.strftime("%H%M"), "n": str(n)}
    if mail is not None:
        values.update({"from": str(mail["sender"]), "mail_id": str(mail["id"])})
    if delivery is not None:
        values["delivery"] = delivery
    filled = []
    for arg in argv:
        for key, value in values.items():
            arg = arg.replace("{" + key + "}", value)
        filled.append(arg)
    return filled


def agent_name(schedule: Schedule, *, at_ms: int, n: int, mail: t.Mapping[str, t.Any] | None = None,
               delivery: str | None = None) -> str | None:
    """The agent a fire of ``schedule`` starts (its template with the fire's placeholders filled), if known."""
    return render([schedule.agent], at_ms=at_ms, n=n, mail=mail, delivery=delivery)[0] if schedule.agent else None


def backoff_of(settings: t.Any) -> tuple[int, int]:
    """(first, cap) of the back-off after failed fires, in ms, from config ``schedules``."""
    return int(settings.backoff * 1000), int(settings.backoff_max * 1000)


# ---- telling a person ----------------------------------------------------------------


def failure_notice(fire: t.Mapping[str, t.Any], reason: str, status: str = "failed") -> dict[str, t.Any]:
    """The one ``escalation`` mail to the operator that tells a person a fire failed (or was lost).

    It is written with the fire's settled row, in one transaction (``schedules.finish``),
    and only for the first failure of a row (later ones are events); its dedup key
    (``schedule_fire:<fire id>``) keeps it single and keeps mail triggers off it."""
    name = fire.get("schedule") or "-"
    argv = " ".join(fire.get("argv") or [])
    what = "was lost (its runner died mid-command; not run again)" if status == "lost" else "failed"
    return {
        "sender": "ov", "recipient": "operator", "type": "escalation", "priority": "high",
        "subject": f"schedule {name}: fire {fire['n']} {what.split(' (')[0]}",
        "body": (f"The fire {fire['n']} of schedule {name} (`ov {argv}`) {what}: {reason}\n"
                 f"The schedule goes on, backing off: after each further failure it waits twice as long before "
                 f"firing again (schedules.backoff, up to schedules.backoff_max). Until a fire succeeds, further "
                 f"failures are events, not mail. See `ov schedule list`; the runner's output is in "
                 f".overstory/logs/schedules/fire-{fire['id']}.log."),
        "payload": {"severity": "warning", "agent": None, "task_id": None, "kind": "schedule_" + status,
                    "reason": reason[:300], "details": {"schedule": name, "fire": fire["id"], "n": fire["n"]}},
        "dedup_key": f"{schedules.NOTICE_KEY}{fire['id']}",
    }


# ---- the scheduler ---------------------------------------------------------------------


Launch = t.Callable[[ProjectPaths, int], "subprocess.Popen[bytes] | None"]


def launch_runner(project: ProjectPaths, fire_id: int) -> subprocess.Popen[bytes]:
    """Start the detached runner of one fire (its own session: it outlives the watchdog)."""
    log = project.logs_dir / "schedules" / f"fire-{fire_id}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as handle:
        return subprocess.Popen([sys.executable, "-m", "overstory.scheduling.runner", "--project", str(project.root),
                                 "--fire", str(fire_id)], stdin=subprocess.DEVNULL, stdout=handle, stderr=handle,
                                start_new_session=True, close_fds=True, cwd=str(project.root))


class Scheduler:
    """Fires due schedules; the watchdog calls ``tick`` once per tick. ``clock`` is injectable for tests."""

    def __init__(self, project: ProjectPaths, state: sqlite3.Connection, *, interval: float = 5.0,
                 clock: t.Callable[[], int] = now_ms, launch: Launch = launch_runner,
                 catch_up: str | None = None, backoff: tuple[int, int] | None = None) -> None:
        self.project = project
        self.state = state
        self.clock = clock
        self.launch = launch
        self.late_after = max(LATE_AFTER_MS, int(3 * interval * 1000))
        self._catch_up = catch_up
        self._backoff = backoff
        self._runners: dict[int, subprocess.Popen[bytes]] = {}
        self._me: tuple[int, int | None] | None = None
        self._events: sqlite3.Connection | None = None

    @property
    def me(self) -> tuple[int, int | None]:
        if self._me is None:
            self._me = (os.getpid(), procs.start_ticks(os.getpid()))
        return self._me

    @property
    def catch_up(self) -> str:
        if self._catch_up is None:
            self._catch_up = self._settings().catch_up
        return self._catch_up

    @property
    def backoff(self) -> tuple[int, int]:
        if self._backoff is None:
            self._backoff = backoff_of(self._settings())
        return self._backoff

    def _settings(self) -> t.Any:
        from overstory.config.load import load as load_config

        return load_config(self.project.config_file, self.project.local_config_file).schedules

    def tick(self) -> list[tuple[str, str, str]]:
        """Settle what dead processes left, then claim and launch what is due: (schedule, kind, detail) each."""
        now = self.clock()
        actions = self._settle_open()
        for schedule in schedules.active(self.state):
            try:
                if schedule.kind == schedules.CRON:
                    actions.extend(self._cron(schedule, now))
                elif schedule.kind == schedules.MAIL:
                    actions.extend(self._mail(schedule, now))
                # a webhook fires when `ov serve` receives its POST (``receive_webhook``); the tick settles it
            except (ScheduleError, ValueError, KeyError) as exc:  # a bad row must not stop the others
                actions.append((schedule.name, "error", str(exc)[:300]))
        return actions

    def close(self) -> None:
        if self._events is not None:
            self._events.close()
            self._events = None

    def _cron(self, schedule: Schedule, now: int) -> list[tuple[str, str, str]]:
        assert schedule.cron is not None
        due = latest_due(schedule.cron, now)
        if due <= schedule.cursor:
            return []
        missed = next_due(schedule.cron, schedule.cursor) < due or now - due > self.late_after
        if missed and self.catch_up == "none":
            schedules.advance(self.state, schedule.id, due)
            self.event("schedule_skipped", schedule.name, f"missed fires up to {local_text(due)} skipped "
                                                          "(schedules.catch_up: none)", {"due_at": due})
            return [(schedule.name, "skipped", f"missed fires up to {local_text(due)} (catch_up: none)")]
        fire = schedules.claim(self.state, schedule, f"cron:{due}", cursor=due, claimer_pid=self.me[0],
                               claimer_ticks=self.me[1], due_at=due, hold_at=now,
                               render=lambda n: render(schedule.argv, at_ms=due, n=n),
                               agent=lambda n: agent_name(schedule, at_ms=due, n=n))
        if fire is None:
            return []  # another watchdog claimed (or skipped) it first
        if isinstance(fire, schedules.Skip):
            return [self._skipped(schedule, f"the fire due {local_text(due)}", fire.reason, due_at=due)]
        procs.kill_point("schedule_claimed")
        return [self._start(fire, f"due {local_text(due)}" + (" (caught up)" if missed else ""))]

    def _mail(self, schedule: Schedule, now: int) -> list[tuple[str, str, str]]:
        assert schedule.mail_type is not None
        actions = []
        for row in schedules.mail_after(self.state, schedule.cursor, schedule.mail_type, schedule.mail_from):
            mail = {"id": row["id"], "sender": row["sender"]}
            fire = schedules.claim(self.state, schedule, f"mail:{row['id']}", cursor=int(row["id"]),
                                   claimer_pid=self.me[0], claimer_ticks=self.me[1], mail_id=int(row["id"]),
                                   due_at=now, hold_at=now,
                                   render=lambda n, mail=mail: render(schedule.argv, at_ms=now, n=n, mail=mail),
                                   agent=lambda n, mail=mail: agent_name(schedule, at_ms=now, n=n, mail=mail))
            if isinstance(fire, schedules.Skip):
                actions.append(self._skipped(schedule, f"the fire for mail #{row['id']} from {row['sender']}",
                                             fire.reason, mail_id=int(row["id"])))
            elif fire is not None:
                procs.kill_point("schedule_claimed")
                actions.append(self._start(fire, f"mail #{row['id']} from {row['sender']}"))
        return actions

    def _skipped(self, schedule: Schedule, what: str, reason: str, **data: t.Any) -> tuple[str, str, str]:
        """An occasion held back (recorded on the schedule by the claim): the event a person sees."""
        self.event("schedule_skipped", schedule.name, f"{what} skipped: {reason}"[:300], {"reason": reason, **data})
        return schedule.name, "skipped", f"{what}: {reason}"

    def _start(self, fire: dict[str, t.Any], why: str) -> tuple[str, str, str]:
        name = fire["schedule"] or "-"
        try:
            runner = self.launch(self.project, int(fire["id"]))
        except OSError as exc:
            self._fail(fire, f"the runner could not start: {exc}", None)
            return name, "failed", f"{why}: the runner could not start: {exc}"
        if runner is not None:
            self._runners[int(fire["id"])] = runner
        self.event("schedule_claimed", name, f"fire {fire['n']} ({why}): ov {' '.join(fire['argv'])}"[:300],
                   {"fire": fire["id"], "n": fire["n"], "argv": fire["argv"]})
        return name, "fired", f"fire {fire['n']} ({why}): ov {' '.join(fire['argv'])}"

    def _settle_open(self) -> list[tuple[str, str, str]]:
        actions = []
        for fire_id, runner in list(self._runners.items()):
            if runner.poll() is not None:
                del self._runners[fire_id]
                found = schedules.fire(self.state, fire_id)
                if found is not None and found["status"] == "claimed":  # died before taking the fire
                    self._fail(found, f"its runner exited ({runner.returncode}) before starting", runner.returncode)
        for fire in schedules.open_fires(self.state):
            name = fire["schedule"] or "-"
            if fire["status"] == "claimed":
                if fire["id"] in self._runners or procs.is_alive(fire["claimer_pid"], fire["claimer_ticks"]):
                    continue
                if schedules.reclaim(self.state, int(fire["id"]), was_pid=fire["claimer_pid"], pid=self.me[0],
                                     ticks=self.me[1]):
                    actions.append(self._start(fire, "taken over: its claimer died before running it"))
            elif not procs.is_alive(fire["runner_pid"], fire["runner_ticks"]):
                if self._fail(fire, "its runner died while the command ran; whether it started work is unknown, "
                                    "so it is not run again", None, status="lost"):
                    actions.append((name, "lost", f"fire {fire['n']}: its runner died mid-command"))
        return actions

    def _fail(self, fire: t.Mapping[str, t.Any], reason: str, code: int | None, *, status: str = "failed") -> bool:
        if not schedules.finish(self.state, int(fire["id"]), status=status, exit_code=code, output=reason,
                                notice=failure_notice(fire, reason, status), backoff=self.backoff):
            return False
        self.event("schedule_failed", fire["schedule"] or "-", f"fire {fire['n']}: {reason}"[:300],
                   {"fire": fire["id"], "status": status})
        return True

    def event(self, kind: str, schedule: str, summary: str, data: dict[str, t.Any] | None = None) -> None:
        record_event(self.project, kind, schedule, summary, data, self)


def record_event(project: ProjectPaths, kind: str, schedule: str, summary: str, data: dict[str, t.Any] | None,
                 holder: Scheduler | None = None) -> None:
    """A schedule's event (``agent`` is null; ``data.schedule`` names it). Losing it loses nothing else."""
    from overstory.store import events as event_store
    from overstory.store.db import open_events

    try:
        conn = holder._events if holder is not None else None
        if conn is None:
            conn = open_events(project.events_db)
            if holder is not None:
                holder._events = conn
        event_store.record(conn, kind, summary=summary[:300], data={"schedule": schedule, **(data or {})})
        if holder is None:
            conn.close()
    except Exception:  # noqa: BLE001 - the fire's row is what matters; an event is a courtesy
        pass


# ---- webhook triggers (`ov serve`'s POST /hooks/NAME) -----------------------------------------

DELIVERY_HEADERS = ("x-delivery-id", "x-github-delivery")  # the first one present names the delivery
MAX_DELIVERY_ID = 200


def new_secret() -> tuple[str, str]:
    """A webhook trigger's secret and its hash (only the hash is stored; the secret is shown once)."""
    import secrets

    secret = secrets.token_urlsafe(32)
    return secret, secret_hash(secret)


def secret_hash(secret: str) -> str:
    """SHA-256, hex: the secret is 256 random bits, so a slow password hash would add nothing."""
    import hashlib

    return hashlib.sha256(secret.encode("utf-8", "replace")).hexdigest()


def receive_webhook(project: ProjectPaths, conn: sqlite3.Connection, name: str, secret: str | None,
                    delivery: str | None, *, launch: Launch = launch_runner) -> dict[str, t.Any]:
    """A POST to schedule ``name``'s webhook: fire it once for this delivery, by the watchdog's own path.

    The secret is checked against the stored hash (a wrong secret and an unknown name get the same
    401, and nothing is recorded). The fire is claimed like a cron or mail fire (``schedules.claim``:
    its back-off and overlap policy asked in the same transaction), with the occasion
    ``hook:<delivery id>``: a delivery that was fired before is not fired again, whoever redelivers
    it. Without a delivery id header every POST is a new delivery. Then a detached runner runs it.

    If `ov serve` dies before the claim commits, nothing is recorded and the sender got no answer:
    it fires when the sender delivers again. If it dies after the commit, before the runner starts,
    the claim is the watchdog's to take over (its claimer is dead), as for a watchdog that dies
    there; if it dies after, the fire runs and a redelivery is answered as a duplicate.
    """
    import hmac
    import secrets

    from overstory.errors import UsageError, WebhookRefused

    found = schedules.get(conn, name)
    if (found is None or found.kind != schedules.WEBHOOK or not found.secret_hash
            or not hmac.compare_digest(secret_hash(secret or ""), found.secret_hash)):
        raise WebhookRefused("missing or wrong webhook secret (or no webhook trigger by that name)")
    if delivery is not None and (not delivery or len(delivery) > MAX_DELIVERY_ID or not delivery.isprintable()):
        raise UsageError(f"the delivery id must be 1 to {MAX_DELIVERY_ID} printable characters")
    if found.paused:
        raise ScheduleError(f"schedule {name} is paused: this delivery is not fired (deliver it again after "
                            f"`ov schedule resume {name}`)")
    delivery = delivery if delivery is not None else "anonymous-" + secrets.token_hex(8)
    now = now_ms()
    scheduler = Scheduler(project, conn, launch=launch)
    try:
        fire = schedules.claim(conn, found, f"hook:{delivery}", cursor=found.cursor, claimer_pid=scheduler.me[0],
                               claimer_ticks=scheduler.me[1], due_at=now, hold_at=now, ordered=False,
                               render=lambda n: render(found.argv, at_ms=now, n=n, delivery=delivery),
                               agent=lambda n: agent_name(found, at_ms=now, n=n, delivery=delivery))
        if fire is None:
            return {"schedule": name, "delivery": delivery, "fired": False, "duplicate": True}
        if isinstance(fire, schedules.Skip):
            scheduler._skipped(found, f"the fire for delivery {delivery}", fire.reason, delivery=delivery)
            return {"schedule": name, "delivery": delivery, "fired": False, "skipped": fire.reason}
        procs.kill_point("webhook_claimed")
        _, kind, detail = scheduler._start(fire, f"webhook delivery {delivery}")
        return {"schedule": name, "delivery": delivery, "fired": kind == "fired", "n": fire["n"],
                "fire": fire["id"], "detail": detail}
    finally:
        scheduler.close()
