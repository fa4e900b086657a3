"""Many OS processes sending and claiming at once: nothing lost, nothing duplicated, no error escapes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import ov_command
from overstory.store import events, mail, sessions

pytestmark = pytest.mark.slow

# Every worker waits for the `go` file so that they really start together.
WAIT_FOR_GO = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    go = Path(sys.argv[2])
    while not go.exists():
        time.sleep(0.005)
""")

SENDER = WAIT_FOR_GO + textwrap.dedent("""
    from overstory.store import mail
    from overstory.store.db import open_state
    root, worker, count, to = Path(sys.argv[1]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
    conn = open_state(root / ".overstory" / "state.db")
    for n in range(count):
        mail.send(conn, sender=worker, to=to, subject=f"{worker}/{n}", body=f"body {worker} {n}\\n|'\\"", env={})
    print("done", worker)
""")

CLAIMER = WAIT_FOR_GO + textwrap.dedent("""
    import json
    from overstory.store import mail
    from overstory.store.db import open_state
    root, worker, agent, release_every = Path(sys.argv[1]), sys.argv[3], sys.argv[4], int(sys.argv[5])
    senders_done = Path(sys.argv[6])
    conn = open_state(root / ".overstory" / "state.db")
    turn = nonempty = 0
    while True:
        finished = senders_done.exists()  # read before claiming: nothing can arrive after an empty final claim
        turn += 1
        turn_id = f"{worker}-t{turn}"
        claimed = mail.claim(conn, agent, turn_id)
        if claimed:
            nonempty += 1
            # A claimer's first turn with mail fails, then every release_every-th.
            failed = bool(release_every) and nonempty % release_every == 1
            if failed:
                mail.release(conn, turn_id)
            else:
                mail.mark_read(conn, turn_id)
            print(json.dumps({"turn": turn_id, "ids": [m.id for m in claimed], "ok": not failed}), flush=True)
        elif finished:
            break
        else:
            time.sleep(0.002)
""")


def start(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finish(procs: list[subprocess.Popen[str]], timeout: float = 120) -> list[str]:
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, err
        assert err == "", err
        outputs.append(out)
    return outputs


def test_16_processes_send_100_each_through_the_api(project, state_db, events_db, tmp_path):
    go = tmp_path / "go"
    procs = [start(SENDER, str(project.root), str(go), f"w{i:02d}", "100", "operator") for i in range(16)]
    go.touch()
    outputs = finish(procs)
    assert sorted(o.strip() for o in outputs) == [f"done w{i:02d}" for i in range(16)]

    rows = state_db.execute("SELECT id, sender, subject, body FROM mail").fetchall()
    assert len(rows) == 1600
    subjects = [r["subject"] for r in rows]
    assert len(set(subjects)) == 1600
    assert set(subjects) == {f"w{i:02d}/{n}" for i in range(16) for n in range(100)}
    assert all(r["body"] == f"body {r['sender']} {r['subject'].split('/')[1]}\n|'\"" for r in rows)
    # Each worker's own messages are in the order it sent them.
    for i in range(16):
        own = [int(r["subject"].split("/")[1]) for r in sorted(rows, key=lambda r: r["id"]) if r["sender"] == f"w{i:02d}"]
        assert own == list(range(100))
    sent_events = events.query(events_db, kinds=["mail_sent"], limit=5000)
    assert sorted(e.data["id"] for e in sent_events) == sorted(r["id"] for r in rows)


def test_concurrent_real_ov_mail_send(project, state_db):
    """16 at a time through the real command line, 32 in all."""
    def send(n: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*ov_command(), "mail", "send", "--to", "operator", "--subject", f"cli-{n}",
                               "--body", f"n={n}", "--from", f"p{n % 16}"], cwd=project.root, capture_output=True,
                              text=True, timeout=120)

    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(send, range(32)))
    for result in results:
        assert result.returncode == 0 and result.stderr == "", result.stderr
    ids = [int(r.stdout.split("#")[1].split()[0]) for r in results]
    assert all(r.stdout == f"sent #{i} to operator\n" for r, i in zip(results, ids))
    assert len(set(ids)) == 32
    messages = mail.list_messages(state_db, limit=None)
    assert sorted(m.subject for m in messages) == sorted(f"cli-{n}" for n in range(32))
    assert {m.id for m in messages} == set(ids)


@pytest.mark.parametrize("release_every", [0, 3], ids=["all-turns-succeed", "every-third-turn-fails"])
def test_concurrent_claimers_never_share_a_message(project, state_db, tmp_path, release_every):
    sessions.create_session(state_db, name="target", capability="builder", task_id="t", runtime="scripted",
                            actor="test")
    go, senders_done = tmp_path / "go", tmp_path / "senders-done"
    claimers = [start(CLAIMER, str(project.root), str(go), f"c{i}", "target", str(release_every), str(senders_done))
                for i in range(8)]
    senders = [start(SENDER, str(project.root), str(go), f"s{i}", "100", "target") for i in range(4)]
    go.touch()
    finish(senders)
    senders_done.touch()
    outputs = finish(claimers)

    sent = {r["id"] for r in state_db.execute("SELECT id FROM mail WHERE recipient = 'target'")}
    assert len(sent) == 400
    claims = [json.loads(line) for out in outputs for line in out.splitlines()]
    delivered = [i for c in claims if c["ok"] for i in c["ids"]]
    # Every message reached exactly one successful turn, and the store agrees on which.
    assert sorted(delivered) == sorted(sent)
    delivered_by = {i: c["turn"] for c in claims if c["ok"] for i in c["ids"]}
    for row in state_db.execute("SELECT id, claimed_by, read_at FROM mail WHERE recipient = 'target'"):
        assert row["read_at"] is not None and row["claimed_by"] == delivered_by[row["id"]]
    failed = [i for c in claims if not c["ok"] for i in c["ids"]]
    if release_every == 0:
        assert failed == []
        # Claimed exactly once in all: no claim anywhere returned a message twice.
        assert len([i for c in claims for i in c["ids"]]) == 400
    else:
        # Failed turns did happen, and their mail was delivered by a later turn all the same.
        assert failed and set(failed) <= set(delivered)
    assert mail.pending_count(state_db, "target") == 0

