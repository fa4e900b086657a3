"""Where the shipped role definitions and templates are.

In a built wheel they are package data under ``overstory/_data``; in a source
checkout (editable install, tests) they are the repository's top-level folders.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def _find(name: str) -> Path:
    packaged = _PACKAGE_DIR / "_data" / name
    if packaged.is_dir():
        return packaged
    source = _PACKAGE_DIR.parent.parent / name
    if source.is_dir():
        return source
    raise FileNotFoundError(f"ov installation is missing its {name}/ folder (looked in {packaged} and {source})")


def shipped_agents_dir() -> Path:
    return _find("agents")


def shipped_templates_dir() -> Path:
    return _find("templates")
