"""Loops that cannot even start: telling a start-up crash from a kill, and when to stop trying.

The watchdog restarts an agent's loop whenever it is gone. A loop that crashes on start-up
(an unusable database, a broken installation) would be restarted forever and its agent would
stay ``booting``. This keeps count, per agent generation, of the loops the watchdog started
that died leaving a Python traceback in ``loop.log`` before the agent finished a turn; a
loop that was killed leaves none and does not count.
"""

from __future__ import annotations

from pathlib import Path

ATTEMPTS = 2


class StartupCrashes:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._records: dict[str, tuple[int, int, int]] = {}  # name -> (generation, crashes, log offset)

    def _log(self, name: str) -> Path:
        return self.run_dir / name / "loop.log"

    def starting(self, name: str, generation: int) -> None:
        """Call just before starting a loop: what it writes from here on is its own."""
        try:
            offset = self._log(name).stat().st_size
        except OSError:
            offset = 0
        previous = self._records.get(name)
        crashes = previous[1] if previous and previous[0] == generation else 0
        self._records[name] = (generation, crashes, offset)

    def gave_up(self, name: str, generation: int, *, booting: bool, turns: int) -> str | None:
        """For an agent whose loop is gone: the crash message once it crashed ATTEMPTS times, else None."""
        record = self._records.get(name)
        if not booting or turns or record is None or record[0] != generation:
            return None
        try:
            with open(self._log(name), "rb") as log:
                log.seek(record[2])
                new = log.read(64 * 1024).decode("utf-8", "replace")
        except OSError:
            return None
        if "Traceback" not in new:
            return None
        self._records[name] = (generation, record[1] + 1, record[2])
        if record[1] + 1 < ATTEMPTS:
            return None
        lines = [line.strip() for line in new.splitlines() if line.strip()]
        return (lines[-1] if lines else f"see {self._log(name)}")[:240]
