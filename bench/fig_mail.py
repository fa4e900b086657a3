"""Figures 2 and 3: the mail store in-process, and 16 processes sending at once.

Figure 2 works on one state.db holding 100,000 messages (spread over 200 agents,
1 % unread), through ``overstory.store.mail``'s public functions:
- sends per second (``mail.send`` with its ``mail_sent`` event, one connection);
- ``mail.check`` latency for one agent, with one new message each time and with none;
- claims per second (``mail.claim`` of one new message; and claim + ``mark_read``);
- two queries that scan the mail table and run once per turn or per status call,
  measured at the same size because they grow with it.

Figure 3 starts 16 OS processes that send at the same moment (a shared start time,
after every process has imported and opened its connections), then checks in the
database that every message arrived exactly once.
"""

from __future__ import annotations

import json
import subprocess
import time
import typing as t
from pathlib import Path

from context import Context
from harness import Stats, add_note, init_project, make_repo, row, time_calls

CHECK_TARGET_MS = 5.0
RECIPIENTS = 200
SENDERS = 16


def _store_project(ctx: Context, name: str) -> tuple[t.Any, list[str]]:
    from synthetic import add_agents, add_mail

    from overstory.paths import ProjectPaths
    from overstory.store.db import open_state

    root = make_repo(ctx.scratch / name)
    init_project(root)
    project = ProjectPaths(root)
    state = open_state(project.state_db)
    try:
        names = add_agents(state, RECIPIENTS, prefix="agent-", loop=None)
        add_mail(state, ctx.p("fig2_messages"), names)
    finally:
        state.close()
    return project, names


def run_store(ctx: Context) -> tuple[list[dict[str, t.Any]], dict[str, t.Any]]:
    from overstory.store import lifecycle, mail, sessions
    from overstory.store.db import open_events, open_state
    from overstory.views import status as status_core

    setup_started = time.monotonic()
    project, names = _store_project(ctx, "fig2-project")
    setup_seconds = time.monotonic() - setup_started
    state = open_state(project.state_db)
    events = open_events(project.events_db)
    rows: list[dict[str, t.Any]] = []
    total = state.execute("SELECT count(*) FROM mail").fetchone()[0]
    try:
        # -- sends per second through the API
        batch, batches = ctx.p("fig2_send_batch"), ctx.p("fig2_batches")
        send_latency: list[float] = []
        rates: list[float] = []
        for index in range(batches + 1):  # the first batch is the warm-up
            started = time.perf_counter()
            for number in range(batch):
                one = time.perf_counter()
                mail.send(state, sender="operator", to=names[1], subject=f"note {index}.{number}",
                          body="Parser done; running the test suite next.", env={}, events=events)
                if index:
                    send_latency.append((time.perf_counter() - one) * 1000)
            if index:
                rates.append(batch / (time.perf_counter() - started))
        rows.append(row(2, f"mail.send throughput ({batch} per batch)", "msg/s", Stats(rates), digits=0,
                        note="one connection, each send its own transaction plus its mail_sent event"))
        rows.append(row(2, "mail.send latency", "ms", Stats(send_latency), digits=3,
                        p99=round(Stats(send_latency).percentile(99), 3)))

        # -- mail check for one agent, with 100,000 messages in the database
        reader = names[0]
        backlog = mail.unread(state, reader)  # start from an empty inbox

        def one_new() -> None:
            mail.insert_message(state, sender="operator", recipient=reader, subject="keep going",
                                body="One more test, please.")

        got: list[int] = []
        with_one = time_calls(lambda: got.append(len(mail.unread(state, reader))), repeat=ctx.p("fig2_checks"),
                              warmup=10, before=one_new)
        empty = time_calls(lambda: mail.unread(state, reader), repeat=ctx.p("fig2_checks"), warmup=10)
        wrong = [n for n in got if n != 1]
        size_note = f"{total:,} messages in state.db; the inbox had {len(backlog)} unread at the start"
        rows.append(row(2, "mail.check, 1 new message (100k db)", "ms", with_one, digits=3,
                        target=f"< {CHECK_TARGET_MS:g} ms in-process", met=with_one.median < CHECK_TARGET_MS and not wrong,
                        p99=round(with_one.percentile(99), 3), note=size_note + (
                            f"; {len(wrong)} checks did not return exactly one message" if wrong else "")))
        rows.append(row(2, "mail.check, nothing new (100k db)", "ms", empty, digits=3,
                        target=f"< {CHECK_TARGET_MS:g} ms in-process", met=empty.median < CHECK_TARGET_MS,
                        p99=round(empty.percentile(99), 3)))

        # -- claims per second (the agent loop's start of a turn)
        claimer = names[2]
        mail.unread(state, claimer)
        count = ctx.p("fig2_claims")
        claim_ms: list[float] = []
        cycle_ms: list[float] = []
        claimed_total = 0
        for number in range(count + 20):
            mail.insert_message(state, sender="operator", recipient=claimer, subject=f"task part {number}",
                                body="Do the next part.")
            turn = f"bench-turn-{number}"
            started = time.perf_counter()
            claimed = mail.claim(state, claimer, turn)
            middle = time.perf_counter()
            mail.mark_read(state, turn)
            ended = time.perf_counter()
            if number >= 20:
                claimed_total += len(claimed)
                claim_ms.append((middle - started) * 1000)
                cycle_ms.append((ended - started) * 1000)
        claims = Stats(claim_ms)
        rows.append(row(2, "mail.claim throughput", "claims/s", value=1000 * len(claim_ms) / sum(claim_ms), digits=0,
                        note=f"{claimed_total} messages claimed in {len(claim_ms)} claims"))
        rows.append(row(2, "mail.claim latency", "ms", claims, digits=3, p99=round(claims.percentile(99), 3)))
        rows.append(row(2, "claim + mark_read cycles", "cycles/s", value=1000 * len(cycle_ms) / sum(cycle_ms), digits=0))

        # -- queries that grow with the mail table
        agent = sessions.get(state, claimer)
        assert agent is not None
        since = agent.created_at
        settle = time_calls(lambda: lifecycle.terminal_mail_sent(state, agent, since), repeat=50, warmup=3)
        rows.append(row(2, "turn settle check (terminal_mail_sent, 100k db)", "ms", settle, digits=3,
                        note="runs after every turn; scans mail by sender"))
        status_doc = time_calls(lambda: status_core.collect(state), repeat=30, warmup=3)
        rows.append(row(2, "status.collect (200 agents, 100k db)", "ms", status_doc, digits=3,
                        note="the query behind `ov status --json`"))
        plan = [r[3] for r in state.execute(
            "EXPLAIN QUERY PLAN SELECT 1 FROM mail WHERE sender = ? AND type IN ('worker_done') AND created_at >= ? "
            "LIMIT 1", (claimer, since)).fetchall()]
    finally:
        state.close()
        events.close()
    return rows, {"setup_seconds": round(setup_seconds, 1), "messages": total, "settle_query_plan": plan}


# ---- figure 3 ------------------------------------------------------------------------------


def _concurrent_run(ctx: Context, project: t.Any, senders: list[str], recipient: str, *, mode: str,
                    per_worker: int) -> dict[str, t.Any]:
    from overstory.store.db import open_state

    worker = Path(__file__).resolve().parent / "mail_worker.py"
    start_at = time.time() + (1.5 if mode == "api" else 1.0)
    processes = [
        subprocess.Popen([ctx.python, str(worker), "--project", str(project.root), "--sender", sender, "--to",
                          recipient, "--count", str(per_worker), "--start-at", str(start_at), "--mode", mode,
                          "--ov", ctx.ov], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ctx.env(),
                         start_new_session=True)
        for sender in senders
    ]
    reports = []
    problems = []
    for process in processes:
        out, err = process.communicate(timeout=300)
        try:
            reports.append(json.loads(out))
        except ValueError:
            problems.append(f"worker exit {process.returncode}: {err.decode(errors='replace')[-300:]}")
    if start_at > min((r["first"] for r in reports), default=start_at) + 0.05:
        problems.append("a worker started before the shared start time")
    late = [r["sender"] for r in reports if r["first"] > start_at + 0.5]
    if late:
        problems.append(f"{len(late)} worker(s) were not ready at the start time (still importing)")
    latencies = [value for r in reports for value in r["latencies_ms"]]
    errors = [e for r in reports for e in r["errors"]]
    wall = max(r["last"] for r in reports) - start_at if reports else float("nan")
    state = open_state(project.state_db)
    try:
        found = state.execute("SELECT sender, count(*), count(DISTINCT subject) FROM mail WHERE recipient = ? "
                              "GROUP BY sender", (recipient,)).fetchall()
    finally:
        state.close()
    by_sender = {r[0]: (r[1], r[2]) for r in found}
    expected = per_worker * len(senders)
    delivered = sum(count for count, _ in by_sender.values())
    duplicates = sum(count - distinct for count, distinct in by_sender.values())
    reported_ok = len(latencies)
    return {
        "mode": mode, "workers": len(senders), "per_worker": per_worker, "expected": expected,
        "sent_ok": reported_ok, "delivered": delivered, "lost": reported_ok - (delivered - duplicates),
        "duplicates": duplicates, "errors": len(errors), "error_samples": errors[:5], "problems": problems,
        "wall_seconds": round(wall, 3), "rate": delivered / wall if wall > 0 else 0.0,
        "p50_ms": Stats(latencies).median if latencies else None,
        "p99_ms": Stats(latencies).percentile(99) if latencies else None,
        "max_ms": max(latencies) if latencies else None,
    }


def run_concurrency(ctx: Context) -> tuple[list[dict[str, t.Any]], dict[str, t.Any]]:
    from synthetic import add_agents

    from overstory.paths import ProjectPaths
    from overstory.store.db import open_state

    root = make_repo(ctx.scratch / "fig3-project")
    init_project(root)
    project = ProjectPaths(root)
    state = open_state(project.state_db)
    try:
        senders = add_agents(state, SENDERS, prefix="sender-", loop=None)
        sinks = add_agents(state, ctx.p("fig3_api_runs") + ctx.p("fig3_cli_runs") + 1, prefix="sink-", loop=None)
    finally:
        state.close()
    rows: list[dict[str, t.Any]] = []
    runs: list[dict[str, t.Any]] = []
    sink = iter(sinks)
    # A small warm-up run: page cache, .pyc files, WAL file created.
    _concurrent_run(ctx, project, senders, next(sink), mode="api", per_worker=10)
    for mode, count, per_worker in (("api", ctx.p("fig3_api_runs"), ctx.p("fig3_api_per_worker")),
                                    ("cli", ctx.p("fig3_cli_runs"), ctx.p("fig3_cli_per_worker"))):
        results = [_concurrent_run(ctx, project, senders, next(sink), mode=mode, per_worker=per_worker)
                   for _ in range(count)]
        runs.extend(results)
        label = "mail.send API" if mode == "api" else "`ov mail send` processes"
        errors = sum(r["errors"] for r in results)
        lost = sum(r["lost"] + (r["expected"] - r["sent_ok"] - r["errors"]) for r in results)
        duplicates = sum(r["duplicates"] for r in results)
        rows.append(row(3, f"16 senders, {label}: throughput", "msg/s", Stats([r["rate"] for r in results]),
                        digits=0, note=f"{len(results)} run(s) x {SENDERS} x {per_worker} messages"))
        rows.append(row(3, f"16 senders, {label}: p99 latency", "ms", Stats([r["p99_ms"] for r in results]),
                        digits=1, p50_ms=round(Stats([r["p50_ms"] for r in results]).median, 1)))
        rows.append(row(3, f"16 senders, {label}: errors / lost / duplicated", "count", value=errors + lost + duplicates,
                        digits=0, target="0 errors, 0 lost", met=errors == 0 and lost == 0 and duplicates == 0,
                        note=f"errors {errors}, lost {lost}, duplicated {duplicates}"))
        for problem in {p for r in results for p in r["problems"]}:
            add_note(rows, f"{label}: {problem}", 3)
    return rows, {"runs": runs}
