"""ov's one time format: ``clock.iso`` and its inverse, written without datetime for the hot commands."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overstory.clock import iso, ms_from_iso

MAX_MS = 253402300799999  # 9999-12-31T23:59:59.999Z


@settings(max_examples=2000, deadline=None)
@given(st.integers(min_value=0, max_value=MAX_MS))
def test_iso_is_the_utc_time_datetime_gives_and_reads_back_exactly(ms: int) -> None:
    seconds, millis = divmod(ms, 1000)
    moment = datetime.fromtimestamp(seconds, tz=UTC)
    assert iso(ms) == moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{millis:03d}Z"
    assert ms_from_iso(iso(ms)) == ms


@pytest.mark.parametrize("text", ["", "2026-01-31T12:00:00Z", "2026-01-31 12:00:00.000Z", "2026-13-01T00:00:00.000Z",
                                  "2026-01-31T24:00:00.000Z", "2026-01-31T12:00:00.000+00:00", "x" * 24])
def test_other_shapes_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        ms_from_iso(text)
