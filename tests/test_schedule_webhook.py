"""`ov schedule add NAME --on-webhook`: a POST to `ov serve`'s /hooks/NAME fires the schedule once per delivery.

A real `ov serve` process, real runner processes that run the real `ov sling` (scripted
agents), a real watchdog tick for the kill test.
"""

from __future__ import annotations

import json

import httpx
import pytest

from conftest import run_ov
from serve_helpers import start_server
from test_schedules import SLING, fires, settled_fires
from test_watchdog import make_watchdog


def add_webhook(project, name: str = "ci") -> str:
    added = run_ov("schedule", "add", name, "--on-webhook", "--overlap", "allow", "--json", "--", *SLING,
                   cwd=project.root)
    assert added.returncode == 0, added.stderr
    document = json.loads(added.stdout)
    assert document["trigger"] == f"webhook POST /hooks/{name}" and "secret_hash" not in document
    return str(document["secret"])


def hook(base: str, name: str, secret: str | None, delivery: str | None = None, *, header: str = "X-Delivery-Id",
         query: bool = False) -> httpx.Response:
    headers = {"Content-Type": "application/json", "Origin": "https://github.com"}  # another service's POST
    if delivery is not None:
        headers[header] = delivery
    params = {}
    if secret is not None and query:
        params["secret"] = secret
    elif secret is not None:
        headers["Authorization"] = f"Bearer {secret}"
    return httpx.post(f"{base}/hooks/{name}", headers=headers, params=params, content=b'{"action": "completed"}',
                      timeout=30)


def test_a_delivery_fires_once_and_a_wrong_secret_fires_nothing(project):
    secret = add_webhook(project)
    wal = project.state_db.with_name(project.state_db.name + "-wal")
    stored = project.state_db.read_bytes() + (wal.read_bytes() if wal.exists() else b"")
    assert secret.encode() not in stored, "only the secret's hash is stored"
    served = start_server(project)
    try:
        for wrong in (None, "not-the-secret", served.token):  # the operator's token is not the trigger's secret
            refused = hook(served.base, "ci", wrong, "d-0")
            assert refused.status_code == 401, refused.text
        assert hook(served.base, "nothing-here", secret, "d-0").status_code == 401, "an unknown name looks the same"
        assert fires(project) == [], "a refused POST fires nothing"

        first = hook(served.base, "ci", secret, "d-1")
        assert first.status_code == 202, first.text
        assert first.json()["fired"] is True and first.json()["n"] == 1
        again = hook(served.base, "ci", secret, "d-1")
        github = hook(served.base, "ci", secret, "d-1", header="X-GitHub-Delivery", query=True)
        assert again.status_code == github.status_code == 200 and again.json()["duplicate"] is True
        second = hook(served.base, "ci", secret, "d-2", header="X-GitHub-Delivery", query=True)
        assert second.status_code == 202 and second.json()["n"] == 2, second.text
        assert hook(served.base, "ci", secret, "x" * 201).status_code == 400
    finally:
        served.stop()
    done = settled_fires(project, 2)
    assert [(f["occasion"], f["status"]) for f in done] == [("hook:d-1", "ok"), ("hook:d-2", "ok")]
    listed = run_ov("schedule", "list", cwd=project.root)
    assert "webhook POST /hooks/ci" in listed.stdout and "fires: 2" in listed.stdout


def test_serve_killed_after_the_claim_leaves_the_fire_to_the_watchdog(project, monkeypatch):
    secret = add_webhook(project)
    monkeypatch.setenv("OV_TEST_KILL_AT", "webhook_claimed")
    served = start_server(project)
    try:
        with pytest.raises(httpx.HTTPError):
            hook(served.base, "ci", secret, "d-1")  # killed between the claim and the runner: no answer
        served.proc.wait(timeout=30)
    finally:
        served.stop()
    assert [(f["occasion"], f["status"]) for f in fires(project)] == [("hook:d-1", "claimed")]
    monkeypatch.delenv("OV_TEST_KILL_AT")
    dog = make_watchdog(project)
    try:
        actions = dog.tick()
    finally:
        dog.close()
    assert ("ci", "fired") in [(a.agent, a.kind) for a in actions], "the watchdog takes the dead claim over"
    assert settled_fires(project, 1)[0]["status"] == "ok"
    served = start_server(project)
    try:
        redelivered = hook(served.base, "ci", secret, "d-1")  # the sender got no answer, so it sends again
        assert redelivered.status_code == 200 and redelivered.json()["duplicate"] is True
    finally:
        served.stop()
    assert len(fires(project)) == 1
