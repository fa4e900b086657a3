# A frozen copy of patch_paths from src/overstory/guards/runtimes.py at commit 511c463, before issue 34 compiled
# its patterns only for commands that start like apply_patch: the oracle tests/test_guard_lexer_oracle.py compares
# runtimes.patch_paths with. Do not edit it to follow the guard.
# ruff: noqa
from __future__ import annotations

import re

_PATCH_PROGRAMS = ("apply_patch", "applypatch")
_HEREDOC = re.compile(r"^\s*(?:apply_patch|applypatch)\s+<<-?\s*(['\"]?)([A-Za-z_]\w*)\1[ \t]*\n(.*)\n[ \t]*\2\s*$",
                      re.DOTALL)
_FILE_LINE = re.compile(r"^\*\*\* (?:Add File|Update File|Delete File|Move to): (.+?)\s*$", re.MULTILINE)


def patch_paths(command: str) -> list[str] | None:
    """The files an ``apply_patch`` command (codex's editing tool, run as a shell command) writes; None
    when ``command`` is not one. Handles the two forms codex models use: a heredoc and one argument."""
    match = _HEREDOC.match(command)
    if match:
        body = match.group(3)
    else:
        stripped = command.lstrip()
        if not stripped.startswith(_PATCH_PROGRAMS):
            return None
        import shlex  # only for a command that starts like apply_patch: shlex compiles a pattern when imported

        try:
            words = shlex.split(stripped)
        except ValueError:
            return None
        if len(words) != 2 or words[0] not in _PATCH_PROGRAMS:
            return None
        body = words[1]
    if "*** Begin Patch" not in body:
        return None
    return _FILE_LINE.findall(body)
