"""A builder's write scope (`ov sling --files`): which paths of its worktree it may change.

A scope is a list of patterns relative to the worktree's top, with ``/`` between parts:
``src/calc.py`` is that file; ``*``, ``?`` and ``[...]`` match within one part (never a ``/``);
a part that is exactly ``**`` matches any number of parts, none included (``src/calc/**`` is
the directory ``src/calc`` and everything under it); a pattern ending in ``/`` means the same
as ending in ``/**``. No scope (an empty list) means the whole worktree.

``parse`` refuses what cannot be a scope (absolute paths, ``..``, an unclosed ``[``, ``**``
inside a part, control characters) with a one-line reason. ``matches`` answers for one
relative path, ``outside`` lists the paths of a change that are not in the scope, and
``may_overlap`` says whether two scopes could name one file (conservatively: two patterns
whose parts are both wildcards are taken to meet).

Standard library only: `ov guard` uses it on every file write of a scoped agent.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing and collections.abc cost `ov guard` milliseconds
if TYPE_CHECKING:
    import re
    from collections.abc import Iterable, Sequence

ENV = "OVERSTORY_WRITE_SCOPE"  # the turn's scope, one pattern a line (set by agents.turns)
_WILD = frozenset("*?[")


def parse(values: Iterable[str]) -> list[str]:
    """The patterns of ``--files`` values (each may hold several, separated by commas), checked and
    normalised (``./a`` is ``a``, ``d/`` is ``d/**``). Raises ValueError with a one-line reason."""
    patterns: list[str] = []
    for value in values:
        for raw in value.split(","):
            pattern = raw.strip()
            if not pattern:
                if value.strip():
                    continue  # "a.py," : a trailing comma
                raise ValueError("an empty pattern; give a path relative to the worktree, e.g. src/calc.py")
            checked = _check(pattern)
            if checked not in patterns:
                patterns.append(checked)
    return patterns


def _check(pattern: str) -> str:
    shown = repr(pattern)
    if any(ord(c) < 32 or c == "\x7f" for c in pattern):
        raise ValueError(f"{shown} holds a control character")
    if "\\" in pattern:
        raise ValueError(f"{shown}: use / between parts; a backslash is not allowed in a scope")
    if pattern.startswith("/"):
        raise ValueError(f"{shown} is absolute; a scope is relative to the worktree's top, e.g. src/calc.py")
    if pattern.startswith("~"):
        raise ValueError(f"{shown} starts with ~; a scope is relative to the worktree's top, e.g. src/calc.py")
    if pattern.endswith("/"):
        pattern += "**"
    parts = [p for p in pattern.split("/") if p not in ("", ".")]
    if not parts:
        raise ValueError(f"{shown} names the whole worktree; leave --files out for that")
    for part in parts:
        if part == "..":
            raise ValueError(f"{shown} leaves the worktree (..); a scope is inside it")
        if "**" in part and part != "**":
            raise ValueError(f"{shown}: ** must be a whole part (src/**/x.py), not inside one ({part!r})")
        if part == ".git":
            raise ValueError(f"{shown} names git's metadata, which no agent writes")
        _check_brackets(part, shown)
    return "/".join(parts)


def _check_brackets(part: str, shown: str) -> None:
    i = 0
    while i < len(part):
        if part[i] == "[":
            j = i + 1
            if j < len(part) and part[j] in "!^":
                j += 1
            if j < len(part) and part[j] == "]":
                j += 1
            close = part.find("]", j)
            if close < 0:
                raise ValueError(f"{shown} is not a valid glob: '[' without its ']'")
            i = close + 1
        else:
            i += 1


def _part_regex(part: str) -> str:
    """One part of a pattern as a regular expression (never matching a ``/``)."""
    import re  # only for an agent with a scope: `ov guard` does not import re otherwise

    out, i = [], 0
    while i < len(part):
        c = part[i]
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = i + 1
            negate = j < len(part) and part[j] in "!^"
            if negate:
                j += 1
            close = part.find("]", j + 1 if j < len(part) and part[j] == "]" else j)
            if close < 0:  # a name's `[` (leads_to): a plain character, as fnmatch takes it. (This looped for ever.)
                out.append(re.escape(c))
            else:
                body = "".join(ch if ch == "-" else re.escape(ch) for ch in part[j:close])
                out.append(f"[{'^/' if negate else ''}{body}]")
                i = close
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def _regex(pattern: str) -> re.Pattern[str]:
    import re

    parts = pattern.split("/")
    text, after_double = "", False
    for index, part in enumerate(parts):
        slash = "/" if index > 0 and not after_double else ""
        if part == "**":
            if index == len(parts) - 1:  # "d/**": d itself and everything under it
                text += "(?:/.*)?" if slash else ".*"
            else:
                text += slash + "(?:[^/]+/)*"
            after_double = True
        else:
            text += slash + _part_regex(part)
            after_double = False
    return re.compile(text + r"\Z", re.DOTALL)


_COMPILED: dict[str, re.Pattern[str]] = {}


def matches(patterns: Sequence[str], relative: str) -> bool:
    """Is ``relative`` (a path under the worktree's top, ``/`` between parts) in the scope?"""
    if not patterns:
        return True
    relative = relative.strip("/")
    for pattern in patterns:
        compiled = _COMPILED.get(pattern)
        if compiled is None:
            compiled = _COMPILED[pattern] = _regex(pattern)
        if compiled.match(relative):
            return True
    return False


def leads_to(patterns: Sequence[str], relative: str) -> bool:
    """Is ``relative`` a directory on the way to something in the scope (``src`` for ``src/calc.py``)?
    Making such a directory is allowed; writing a file there is not."""
    relative = relative.strip("/")
    if not relative:
        return True
    mine = relative.split("/")
    for pattern in patterns:
        parts = pattern.split("/")
        for index, name in enumerate(mine):
            if index < len(parts) - 1 and parts[index] == "**":
                return True  # any directory under a ** may hold what the rest names
            if index >= len(parts) - 1 or not _part_meets(parts[index], name):
                break
        else:
            return True
    return False


def outside(patterns: Sequence[str], paths: Iterable[str]) -> list[str]:
    """The paths not in the scope, sorted (none when there is no scope)."""
    if not patterns:
        return []
    return sorted({p for p in paths if not matches(patterns, p)})


def describe(patterns: Sequence[str]) -> str:
    return ", ".join(patterns) if patterns else "the whole worktree"


def to_env(patterns: Sequence[str]) -> str:
    return "\n".join(patterns)


def from_env(text: str | None) -> list[str]:
    return [line for line in (text or "").split("\n") if line]


# ---- overlap


def _part_meets(a: str, b: str) -> bool:
    """Could one name match both parts?"""
    a_wild, b_wild = any(c in _WILD for c in a), any(c in _WILD for c in b)
    if not a_wild and not b_wild:
        return a == b
    import re

    if not a_wild:
        return re.fullmatch(_part_regex(b), a) is not None
    if not b_wild:
        return re.fullmatch(_part_regex(a), b) is not None
    return True  # two wildcards: taken to meet


def _parts_meet(a: Sequence[str], b: Sequence[str]) -> bool:
    seen: dict[tuple[int, int], bool] = {}

    def meet(i: int, j: int) -> bool:
        key = (i, j)
        if key in seen:
            return seen[key]
        if i == len(a) and j == len(b):
            found = True
        elif i < len(a) and a[i] == "**":
            found = meet(i + 1, j) or (j < len(b) and meet(i, j + 1))
        elif j < len(b) and b[j] == "**":
            found = meet(i, j + 1) or (i < len(a) and meet(i + 1, j))
        elif i == len(a) or j == len(b):
            found = False
        else:
            found = _part_meets(a[i], b[j]) and meet(i + 1, j + 1)
        seen[key] = found
        return found

    return meet(0, 0)


def overlap(mine: Sequence[str], theirs: Sequence[str]) -> list[tuple[str, str]]:
    """The pairs of patterns (mine, theirs) that may name one file. An empty scope is the whole worktree."""
    mine_list = list(mine) or ["**"]
    theirs_list = list(theirs) or ["**"]
    return [(a, b) for a in mine_list for b in theirs_list if _parts_meet(a.split("/"), b.split("/"))]


def overlapping_pairs(members: Sequence[tuple[str | None, str, Sequence[str]]]) -> list[dict[str, object]]:
    """Among (run, name, scope) of active scoped writers, each pair of one run whose scopes may meet."""
    found: list[dict[str, object]] = []
    for index, (run, name, mine) in enumerate(members):
        for other_run, other, theirs in members[index + 1:]:
            if other_run != run or not mine or not theirs:
                continue
            pairs = overlap(mine, theirs)
            if pairs:
                found.append({"run": run, "agents": [name, other], "patterns": [list(p) for p in pairs],
                              "message": describe_overlap(name, other, pairs)})
    return found


def describe_overlap(name: str, other: str, pairs: Sequence[tuple[str, str]]) -> str:
    shown = ", ".join(a if a == b else f"{a} ~ {b}" for a, b in pairs)
    return f"the write scopes of {name} and {other} overlap ({shown})"
