"""One time convention everywhere: integer milliseconds since the epoch, UTC."""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def iso(ms: int | None) -> str | None:
    """Render stored milliseconds as ISO-8601 with an explicit Z."""
    if ms is None:
        return None
    moment = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, None: 1}


def parse_duration(text: str) -> float:
    """'90' -> 90.0 s, '10m' -> 600.0, '2h', '7d'. Raises ValueError on anything else."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30s, 10m, 2h, 7d)")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def parse_since(text: str, *, now: int | None = None) -> int:
    """A relative duration ('10m') or an ISO-8601 time, as epoch milliseconds."""
    try:
        return (now if now is not None else now_ms()) - int(parse_duration(text) * 1000)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"not a duration or ISO time: {text!r} (use e.g. 10m, 2h or 2026-01-31T12:00:00Z)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp() * 1000)
