"""The agent CLI versions pinned in `.ci/versions` (the one place they are set), for the tests' helpers."""

from __future__ import annotations

from pathlib import Path

VERSIONS_FILE = Path(__file__).resolve().parent.parent / ".ci" / "versions"


def pinned(name: str) -> str:
    """The value of ``NAME=value`` in .ci/versions; KeyError when it is not pinned there."""
    for line in VERSIONS_FILE.read_text(encoding="utf-8").splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key == name and not key.startswith("#"):
            return value.strip()
    raise KeyError(f"{name} is not pinned in {VERSIONS_FILE}")
