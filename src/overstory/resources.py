"""Where ov's own files and its command are: shipped role definitions, templates, the `ov` executable.

In a built wheel the roles and templates are package data under ``overstory/_data``;
in a source checkout (editable install, tests) they are the repository's top-level folders.
"""

from __future__ import annotations

import sys
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


def ov_executable() -> tuple[list[str], str | None]:
    """How hooks and agents call ov, and the directory to put on their PATH.

    The installed script next to this Python, else ``ov`` on PATH, else ``python -m overstory``.
    """
    candidate = Path(sys.executable).parent / "ov"
    if candidate.is_file():
        return [str(candidate)], str(candidate.parent)
    import shutil  # only when the script is not beside this Python (shutil brings bz2 and lzma to every sling)

    found = shutil.which("ov")
    if found:
        return [found], str(Path(found).parent)
    return [sys.executable, "-m", "overstory"], None
