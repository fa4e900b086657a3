"""The dispatch a turn answers, and the idempotency keys scoped to it (ARCHITECTURE §13).

A headless turn answers the mail it claimed. Every attempt at that turn (a retry after
a crash re-claims the same, still unread mail, plus whatever arrived since) has the
same lowest claimed id, so ``mail:<lowest id>`` names the dispatch across attempts.
The turn runner exports the claimed ids as ``OVERSTORY_DISPATCH``; the tool-call
ledger, ``ov mail send`` and ``ov sling`` scope their idempotency keys to it, so a
retried turn that repeats a send or a sling gets the first one's result back.

An `ov loop` iteration answers no mail of its own: its unit of work is the iteration.
Every attempt at iteration N (a loop process killed mid-turn leaves it to be run again)
exports ``OVERSTORY_SCOPE=loop:<generation>.<N>``, which takes the place of the mail
scope: the re-run gets the dead attempt's results back, and no other iteration (of this
phase or another: the count never restarts) shares its keys.

Stdlib only: ``ov mail send`` and ``ov guard`` use it.
"""

from __future__ import annotations

from overstory import jsontext as json

TYPE_CHECKING = False  # typing costs milliseconds on the hook path (`ov guard`, `ov mail send`)
if TYPE_CHECKING:
    import typing as t

DISPATCH_ENV = "OVERSTORY_DISPATCH"
SCOPE_ENV = "OVERSTORY_SCOPE"


def scope_of(dispatch: t.Sequence[int]) -> str:
    """``mail:<lowest id>`` of the mail a turn claimed; empty when it claimed none."""
    return f"mail:{min(dispatch)}" if dispatch else ""


def loop_scope(generation: int, number: int) -> str:
    """The scope of every attempt at iteration ``number`` of an `ov loop` agent's generation."""
    return f"loop:{generation}.{number}"


def turn_scope(env: t.Mapping[str, str]) -> str:
    """The scope a turn's environment names: its loop iteration's, else its dispatch's; empty outside a turn."""
    return env.get(SCOPE_ENV) or scope_of(dispatch_ids(env))


def dispatch_ids(env: t.Mapping[str, str]) -> tuple[int, ...]:
    return tuple(int(part) for part in env.get(DISPATCH_ENV, "").split(",") if part.strip().isdigit())


def digest(*parts: t.Any) -> str:
    """A stable 32-hex-digit hash of JSON-able parts."""
    try:  # the built-in module: hashlib's OpenSSL start-up costs milliseconds on hot paths
        from _sha256 import sha256 as _sha256  # type: ignore[import-not-found]
    except ImportError:  # pragma: no cover - other Pythons
        from hashlib import sha256 as _sha256
    material = json.dumps(parts, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return _sha256(material.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def agent_key(env: t.Mapping[str, str], kind: str, *parts: t.Any) -> str | None:
    """``agent:<agent>:<kind>:<scope>:<hash of parts>`` inside an agent's turn, else None.

    ``kind`` is ``mail`` (parts: to, type, subject, body, payload, reply_to) or ``sling``
    (the request). None outside a headless turn (no agent or no dispatch): the operator's
    commands are never deduplicated.
    """
    agent = env.get("OVERSTORY_AGENT_NAME")
    scope = turn_scope(env)
    if not agent or not scope:
        return None
    return f"agent:{agent}:{kind}:{scope}:{digest(agent, kind, *parts)}"


def claimed_ids(conn: t.Any, turn_id: str) -> list[int]:
    """The ids of the mail a turn claimed: the dispatch it answers."""
    return [int(r[0]) for r in conn.execute("SELECT id FROM mail WHERE claimed_by = ? ORDER BY id", (turn_id,))]


def sent_before(conn: t.Any, key: str | None) -> list[int]:
    """Ids of the mail already sent under an idempotency key (one per recipient of a broadcast)."""
    if key is None:
        return []
    rows = conn.execute("SELECT id FROM mail WHERE dedup_key = ? OR substr(dedup_key, 1, ?) = ? ORDER BY id",
                        (key, len(key) + 1, key + ":")).fetchall()
    return [int(r[0]) for r in rows]
