"""`ov schedule`: cron schedules and mail triggers fired exactly once per occasion.

Real SQLite, real runner processes that run the real `ov sling` (scripted agents, so no
model is involved), real watchdog processes. Time is injected where minutes must pass
(``Scheduler(clock=...)``: a fake clock moved one minute per real second), except in
one real-time test that sees two real fires of a seconds-field schedule.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import typing as t
from pathlib import Path

import pytest

from agent_helpers import mail_rows, wait_for
from conftest import ov_command, run_ov
from overstory.paths import ProjectPaths
from overstory.store import mail, schedules
from overstory.store.db import open_events, open_state

T0 = 1_800_000_030_000  # a fake "now": 30 s past a minute (UTC)
MINUTE = 60_000
SLING = ["sling", "builder", "t-{n}", "--runtime", "scripted", "--prompt", "scheduled work"]


def add_cron(project: ProjectPaths, name: str, cron: str, argv: list[str], cursor: int, *,
             overlap: str = "skip", agent: str | None = None) -> schedules.Schedule:
    conn = open_state(project.state_db)
    try:
        return schedules.add(conn, name, kind=schedules.CRON, argv=argv, cron=cron, cursor=cursor, overlap=overlap,
                             agent=agent)
    finally:
        conn.close()


def fires(project: ProjectPaths, name: str | None = None) -> list[dict[str, t.Any]]:
    conn = open_state(project.state_db)
    try:
        rows = conn.execute("SELECT f.*, s.name AS schedule FROM schedule_fires f JOIN schedules s ON s.id = "
                            "f.schedule_id ORDER BY f.id").fetchall()
        return [dict(r) for r in rows if name is None or r["schedule"] == name]
    finally:
        conn.close()


def agents(project: ProjectPaths, prefix: str) -> list[str]:
    conn = open_state(project.state_db)
    try:
        return [r[0] for r in conn.execute("SELECT name FROM sessions WHERE name LIKE ? ORDER BY name", (prefix + "%",))]
    finally:
        conn.close()


def schedule_events(project: ProjectPaths, kind: str) -> list[dict[str, t.Any]]:
    conn = open_events(project.events_db)
    try:
        return [{"summary": r[0], **json.loads(r[1])} for r in conn.execute(
            "SELECT summary, data FROM events WHERE kind = ? ORDER BY id", (kind,))]
    finally:
        conn.close()


def settled_fires(project: ProjectPaths, count: int, timeout: float = 60) -> list[dict[str, t.Any]]:
    return wait_for(lambda: (found := fires(project)) and len(found) >= count
                    and all(f["status"] not in schedules.OPEN_FIRE_STATUSES for f in found) and found,
                    timeout, interval=0.2, message=f"{count} settled fires")


DRIVER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from overstory.paths import ProjectPaths
    from overstory.scheduling.scheduler import Scheduler
    from overstory.store.db import open_state

    root, clock, stop = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    project = ProjectPaths(Path(root))
    scheduler = Scheduler(project, open_state(project.state_db), interval=0.05, clock=lambda: int(clock.read_text()))
    print("ready", flush=True)
    while not stop.exists():
        scheduler.tick()
        time.sleep(0.01)
""")


def set_clock(clock: Path, ms: int) -> None:
    """Move the fake clock in one step (the drivers read it all the time)."""
    scratch = clock.with_suffix(".new")
    scratch.write_text(str(ms))
    os.replace(scratch, clock)


def start_driver(project: ProjectPaths, clock: Path, stop: Path, **env: str) -> subprocess.Popen[str]:
    """A process running the watchdog's schedule step (``Scheduler.tick``) in a tight loop, on the fake clock."""
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(project.root), str(clock), str(stop)],
                            env={**os.environ, **env}, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_two_racing_schedulers_one_killed_mid_fire_fire_once_per_minute(project, tmp_path):
    add_cron(project, "every-minute", "* * * * *", SLING, cursor=T0, overlap="allow")  # a fire each minute
    clock, stop = tmp_path / "clock", tmp_path / "stop"
    set_clock(clock, T0)
    dying = start_driver(project, clock, stop, OV_TEST_KILL_AT="schedule_claimed")
    drivers: list[subprocess.Popen[str]] = []
    try:
        set_clock(clock, T0 + 40_000)  # 12:01:10: the first due time has passed
        assert dying.wait(timeout=30) == -signal.SIGKILL, "it died right after claiming the fire"
        orphan = fires(project)
        assert len(orphan) == 1 and orphan[0]["status"] == "claimed" and orphan[0]["claimer_pid"] == dying.pid
        drivers = [start_driver(project, clock, stop), start_driver(project, clock, stop)]  # B, and A restarted
        for step in range(1, 13):  # three more fake minutes, 15 s at a time
            time.sleep(0.25)
            set_clock(clock, T0 + 40_000 + step * 15_000)
        done = settled_fires(project, 4)
    finally:
        stop.touch()
        for proc in [dying, *drivers]:
            if proc.poll() is None:
                proc.wait(timeout=30)
    minute_one = T0 + 30_000
    assert [f["due_at"] for f in done] == [minute_one + i * MINUTE for i in range(4)], "one fire per minute"
    assert [f["n"] for f in done] == [1, 2, 3, 4] and all(f["status"] == "ok" for f in done), done
    assert done[0]["claimer_pid"] != dying.pid, "the orphaned claim was taken over"
    assert agents(project, "builder-t-") == ["builder-t-1", "builder-t-2", "builder-t-3", "builder-t-4"]
    assert len(schedule_events(project, "schedule_fired")) == 4


def test_a_real_watchdog_fires_twice_in_real_time_and_a_restart_does_not_refire(project):
    """Real time, real `ov watchdog` processes (killed with SIGKILL and restarted between the fires)."""
    added = run_ov("schedule", "add", "rt", "--every", "15s", "--overlap", "allow", "--",
                   "sling", "builder", "rt-{n}", "--runtime", "scripted", "--prompt", "go", cwd=project.root)
    assert added.returncode == 0, added.stderr

    def watchdog() -> subprocess.Popen[bytes]:
        return subprocess.Popen([*ov_command(), "watchdog", "--interval", "0.5"], cwd=project.root,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    first = watchdog()
    second = None
    try:
        wait_for(lambda: fires(project), 40, interval=0.2, message="the first fire")
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        second = watchdog()
        found = wait_for(lambda: len(f := fires(project)) >= 2 and f, 40, interval=0.2, message="a second fire")
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
    done = settled_fires(project, 2)
    assert [f["n"] for f in done[:2]] == [1, 2] and done[1]["due_at"] - done[0]["due_at"] == 15_000
    assert len({f["due_at"] for f in found}) == len(found), "no due time fired twice"
    assert all(f["status"] == "ok" for f in done), done


def test_a_mail_trigger_fires_once_per_matching_mail(project, monkeypatch):
    from overstory.scheduling.scheduler import Scheduler

    conn = open_state(project.state_db)
    mail.insert_message(conn, sender="builder-a", recipient="operator", type="merge_ready", subject="before")
    schedules.add(conn, "review", kind=schedules.MAIL, mail_type="merge_ready", mail_from=None, overlap="allow",
                  argv=["sling", "scout", "rev-{from}-{n}", "--runtime", "scripted", "--prompt", "review {from}"],
                  cursor=schedules.max_mail_id(conn))
    schedules.add(conn, "only-b", kind=schedules.MAIL, mail_type="merge_ready", mail_from="builder-b",
                  overlap="allow", argv=["sling", "scout", "b-{mail_id}", "--runtime", "scripted"],
                  cursor=schedules.max_mail_id(conn))
    ids = [mail.insert_message(conn, sender=s, recipient=r, type=k, subject="x") for s, r, k in [
        ("builder-a", "operator", "merge_ready"), ("builder-b", "operator", "merge_ready"),
        ("builder-a", "operator", "status"), ("builder-b", "lead-1", "merge_ready")]]
    scheduler = Scheduler(project, conn)
    try:
        fired = scheduler.tick()
        assert sorted(kind for _, kind, _ in fired) == ["fired", "fired", "fired"]
        assert scheduler.tick() == []
        settled_fires(project, 3)
    finally:
        scheduler.close()
    assert Scheduler(project, conn).tick() == [], "a new scheduler (a restarted watchdog) does not fire them again"
    conn.close()
    by_schedule = {(f["schedule"], f["mail_id"]) for f in fires(project)}
    assert by_schedule == {("review", ids[0]), ("review", ids[1]), ("only-b", ids[1])}
    assert all(f["status"] == "ok" for f in fires(project))
    assert agents(project, "scout-rev-") == ["scout-rev-builder-a-1", "scout-rev-builder-b-2"]
    assert agents(project, "scout-b-") == [f"scout-b-{ids[1]}"]


@pytest.mark.parametrize("catch_up, expected", [("latest", 1), ("none", 0)])
def test_missed_fires_catch_up_once_or_not_at_all(project, catch_up, expected):
    from overstory.scheduling.scheduler import Scheduler

    add_cron(project, "hourly", "0 * * * *", ["sling", "builder", "h-{n}", "--runtime", "scripted"], cursor=T0,
             overlap="allow")  # its fires are never run here: they stay open
    conn = open_state(project.state_db)
    now = {"ms": T0 + 5 * 3600_000}  # five hours later: five missed
    scheduler = Scheduler(project, conn, clock=lambda: now["ms"], catch_up=catch_up, launch=lambda p, i: None)
    actions = scheduler.tick()
    assert len([a for a in actions if a[1] == "fired"]) == expected
    assert scheduler.tick() == []
    now["ms"] += 3600_000  # the next hour is on time: it fires either way
    assert [a[1] for a in scheduler.tick()] == ["fired"]
    conn.close()
    assert len(fires(project)) == expected + 1


def test_a_failed_fire_is_an_event_and_a_notification_never_a_crash(project):
    from overstory.scheduling import scheduler as scheduler_module
    from overstory.scheduling.runner import run_fire

    add_cron(project, "fixed", "* * * * *", ["sling", "builder", "same", "--runtime", "scripted"], cursor=T0,
             overlap="allow")
    conn = open_state(project.state_db)
    now = {"ms": T0 + 40_000}
    scheduler = scheduler_module.Scheduler(project, conn, clock=lambda: now["ms"], launch=lambda p, i: None)
    scheduler.tick()
    now["ms"] += MINUTE
    scheduler.tick()
    first, second = (run_fire(project, f["id"]) for f in fires(project))
    assert first["status"] == "ok" and second["status"] == "failed" and second["exit_code"] == 1
    # Refused either way: still active, or (the scripted builder already finished) its branch is left.
    refusal = second["output"].strip().splitlines()[-1]
    assert "builder-same is already active" in refusal or "branch ov/builder-same already exists" in refusal
    told = mail_rows(project, type="escalation")
    assert len(told) == 1 and told[0]["recipient"] == "operator" and told[0]["sender"] == "ov", told
    assert told[0]["subject"] == f"schedule fixed: fire {second['n']} failed"
    assert refusal in told[0]["body"]
    assert json.loads(told[0]["payload"])["details"]["fire"] == second["id"]
    assert run_fire(project, second["id"]) is None and len(mail_rows(project, type="escalation")) == 1, \
        "a settled fire is not run or told again"
    failed = schedule_events(project, "schedule_failed")
    assert len(failed) == 1 and failed[0]["schedule"] == "fixed" and failed[0]["exit_code"] == 1
    now["ms"] += MINUTE
    assert [a[1] for a in scheduler.tick()] == ["fired"], "the schedule goes on after a failure"
    conn.close()


def test_a_runner_killed_mid_command_is_reported_lost_not_rerun(project, monkeypatch):
    from overstory.scheduling.scheduler import Scheduler

    add_cron(project, "dies", "* * * * *", SLING, cursor=T0)
    monkeypatch.setenv("OV_TEST_KILL_AT", "schedule_running")  # the runner dies with the fire taken
    conn = open_state(project.state_db)
    scheduler = Scheduler(project, conn, clock=lambda: T0 + 40_000)
    try:
        assert [a[1] for a in scheduler.tick()] == ["fired"]
        wait_for(lambda: fires(project)[0]["status"] == "running" and scheduler._runners[1].poll() is not None,
                 30, message="the runner to take the fire and die")
        actions = scheduler.tick()
    finally:
        scheduler.close()
        conn.close()
    assert [a[1] for a in actions] == ["lost"]
    lost = fires(project)
    assert len(lost) == 1 and lost[0]["status"] == "lost" and agents(project, "builder-t-") == []
    assert len(schedule_events(project, "schedule_failed")) == 1
    told = mail_rows(project, type="escalation")
    assert len(told) == 1 and told[0]["subject"] == "schedule dies: fire 1 was lost", told


def test_a_trigger_on_escalations_does_not_fire_on_its_own_failure_notices(project):
    """A mail trigger on `escalation` whose command fails: ov's notice of that failure is mail to the
    operator too, and must not fire the trigger again (a loop that would run every tick)."""
    from overstory.scheduling.scheduler import Scheduler

    conn = open_state(project.state_db)
    schedules.add(conn, "echo", kind=schedules.MAIL, mail_type="escalation", mail_from=None, overlap="allow",
                  argv=["sling", "builder", "taken", "--runtime", "scripted"], cursor=schedules.max_mail_id(conn))
    mail.insert_message(conn, sender="builder-a", recipient="operator", type="escalation", subject="help")
    scheduler = Scheduler(project, conn)
    try:
        assert [a[1] for a in scheduler.tick()] == ["fired"]
        settled_fires(project, 1)
        assert scheduler.tick() == [], "one mail, one fire"
        mail.insert_message(conn, sender="builder-b", recipient="operator", type="escalation", subject="help")
        assert [a[1] for a in scheduler.tick()] == ["fired"]
        done = settled_fires(project, 2)
        assert [f["status"] for f in done] == ["ok", "failed"], "the name is taken the second time"
        assert len(mail_rows(project, type="escalation", sender="ov")) == 1
        for _ in range(3):
            assert scheduler.tick() == [], "ov's notice of the failure fires nothing"
    finally:
        scheduler.close()
        conn.close()
    assert len(fires(project)) == 2


def test_schedule_commands(project):
    env = {"TZ": "Asia/Tokyo"}

    def ov(*args: str) -> subprocess.CompletedProcess[str]:
        return run_ov("schedule", *args, cwd=project.root, env=env)

    bad_cron = ov("add", "x", "--cron", "61 * * * *", "--", "sling", "builder", "x")
    assert bad_cron.returncode == 1 and bad_cron.stderr.startswith("ov: error: not a cron expression")
    not_work = ov("add", "x", "--cron", "0 2 * * *", "--", "mail", "send", "--to", "operator")
    assert not_work.returncode == 1 and "does not start work" in not_work.stderr
    typo = ov("add", "x", "--cron", "0 2 * * *", "--", "sling", "builder", "x", "--promt", "hi")
    assert typo.returncode == 2 and "--promt" in typo.stderr
    both = ov("add", "x", "--cron", "0 2 * * *", "--on-mail", "merge_ready", "--", "sling", "builder", "x")
    assert both.returncode == 2
    added = ov("add", "nightly", "--cron", "0 2 * * *", "--", "ov", "sling", "builder", "deps-{date}",
               "--runtime", "scripted", "--prompt", "update the dependencies")
    assert added.returncode == 0, added.stderr
    assert "next fires (JST (UTC+0900)):" in added.stdout and added.stdout.count("02:00:00") == 3, added.stdout
    assert ov("add", "nightly", "--cron", "0 3 * * *", "--", "sling", "builder", "y").returncode == 1
    listed = ov("list")
    assert "times are local: JST (UTC+0900)" in listed.stdout and "02:00:00" in listed.stdout
    document = json.loads(ov("list", "--json").stdout)
    assert document["time_zone"] == "JST (UTC+0900)"
    assert document["schedules"][0]["command"][:3] == ["ov", "sling", "builder"]
    assert document["schedules"][0]["next_at"].endswith("T17:00:00.000Z")
    assert ov("pause", "nightly").returncode == 0 and "[paused]" in ov("list").stdout
    ran = ov("run-now", "nightly")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "fired nightly #1" in ran.stdout and "[paused]" in ov("list").stdout, "run-now leaves it paused"
    assert agents(project, "builder-deps-") and fires(project)[0]["status"] == "ok"
    assert ov("resume", "nightly").returncode == 0 and "[active]" in ov("list").stdout
    assert ov("remove", "nightly").returncode == 0 and "no schedules" in ov("list").stdout
    assert ov("remove", "nightly").returncode == 1


def test_six_field_cron_is_refused_and_seconds_are_named(project):
    """Quartz and node-cron put seconds first, croniter last: "*/20 * * * * *" would fire every second of
    minutes 0, 20 and 40. It is refused in one line; --seconds or --every say what is meant, and `add` shows
    the next three fires."""
    def ov(*args: str) -> subprocess.CompletedProcess[str]:
        return run_ov("schedule", *args, "--", "coordinator", "send", "anything new?", cwd=project.root,
                      env={"TZ": "UTC"})

    refused = ov("add", "tick", "--cron", "*/20 * * * * *")
    assert refused.returncode == 1 and refused.stdout == "", refused.stdout
    assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert "six-field cron" in refused.stderr and "--every" in refused.stderr and "--seconds" in refused.stderr
    assert ov("add", "tick", "--seconds", "*/20").returncode == 2, "--seconds needs --cron"
    assert ov("add", "tick", "--cron", "* * * * *", "--seconds", "61").returncode == 1
    assert ov("add", "tick", "--every", "7m").returncode == 1, "7 minutes do not divide an hour"
    assert ov("add", "tick", "--every", "20x").returncode == 1

    def seconds_apart(name: str, *options: str) -> list[int]:
        added = ov("add", name, *options, "--json")
        assert added.returncode == 0, added.stderr
        document = json.loads(added.stdout)
        stamps = [int(time.mktime(time.strptime(at[:19], "%Y-%m-%dT%H:%M:%S"))) for at in document["next_fires"]]
        assert len(stamps) == 3 and document["next_at"] == document["next_fires"][0]
        return [b - a for a, b in zip(stamps, stamps[1:])]

    assert seconds_apart("every20", "--every", "20s") == [20, 20]
    assert seconds_apart("cron20", "--cron", "* * * * *", "--seconds", "*/20") == [20, 20]
    assert seconds_apart("five", "--every", "5m") == [300, 300]
    assert seconds_apart("two-hours", "--every", "2h") == [7200, 7200]
    text = ov("add", "plain", "--cron", "0 2 * * *")
    assert text.returncode == 0 and text.stdout.count("02:00:00") == 3, text.stdout
    assert "cron * * * * * seconds */20" in run_ov("schedule", "list", cwd=project.root).stdout


def test_the_claim_is_unique_per_occasion(project):
    conn = open_state(project.state_db)
    found = add_cron(project, "u", "* * * * *", SLING, cursor=T0)
    def render(n: int) -> list[str]:
        return [f"n={n}"]

    one = schedules.claim(conn, found, "cron:1", cursor=1, render=render, claimer_pid=1, claimer_ticks=None)
    two = schedules.claim(conn, found, "cron:1", cursor=1, render=render, claimer_pid=2, claimer_ticks=None)
    assert one is not None and one["argv"] == ["n=1"] and two is None
    assert schedules.start(conn, one["id"], runner_pid=3, runner_ticks=None)
    assert not schedules.start(conn, one["id"], runner_pid=4, runner_ticks=None), "only one runner takes a fire"
    conn.close()


def test_the_watchdog_tick_fires_schedules(project):
    from test_watchdog import make_watchdog

    add_cron(project, "w", "* * * * *", SLING, cursor=1)
    dog = make_watchdog(project)
    try:
        actions = dog.tick()
    finally:
        dog.close()
    assert [(a.agent, a.kind) for a in actions] == [("w", "fired")]
    assert settled_fires(project, 1)[0]["status"] == "ok"
