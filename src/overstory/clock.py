"""One time convention everywhere: integer milliseconds since the epoch, UTC."""

from __future__ import annotations

import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    import re


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def iso(ms: int | None) -> str | None:
    """Render stored milliseconds as ISO-8601 with an explicit Z."""
    if ms is None:
        return None
    seconds, millis = divmod(int(ms), 1000)  # datetime and its import are not needed (hot commands print these)
    return time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(seconds)) + f"{millis:03d}Z"


def ms_from_iso(text: str) -> int:
    """The inverse of ``iso`` ("2026-01-31T12:00:00.250Z" -> ms), exactly, without datetime: `ov mail check`
    reads these back from the agent's endpoint. ValueError for any other shape."""
    if len(text) < 24 or text[-1] != "Z" or text[-5] != "." or text[-14] != "T":
        raise ValueError(f"not a time as ov writes them: {text!r}")
    date, clock_time = text[:-14], text[-13:-5]
    year, month, day = (int(part) for part in date.rsplit("-", 2))
    hour, minute, second = (int(part) for part in clock_time.split(":"))
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60 and second < 60):
        raise ValueError(f"not a time as ov writes them: {text!r}")
    # days since 1970-01-01 in the proleptic Gregorian calendar (the "days from civil" algorithm)
    shifted = year - (month <= 2)
    era = shifted // 400
    year_of_era = shifted - era * 400
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    days = era * 146097 + year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year - 719468
    return ((days * 24 + hour) * 60 + minute) * 60_000 + second * 1000 + int(text[-4:-1])


_DURATION: re.Pattern[str] | None = None  # compiled on first use: `re` is not imported by the hot commands
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, None: 1}


def parse_duration(text: str) -> float:
    """'90' -> 90.0 s, '10m' -> 600.0, '2h', '7d'. Raises ValueError on anything else."""
    global _DURATION
    if _DURATION is None:
        import re

        _DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
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
    from datetime import UTC, datetime

    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"not a duration or ISO time: {text!r} (use e.g. 10m, 2h or 2026-01-31T12:00:00Z)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)
