"""Names: validation of names that become branch names, paths and tmux session names; the closest to a mistyped one."""

from __future__ import annotations

import re

from overstory.errors import InvalidName, either  # either: how a message lists names (errors' own too)

TYPE_CHECKING = False
if TYPE_CHECKING:
    import typing as t

NAME_RULE = "lower-case letters, digits, '-', '_' and '.', not starting with '-' or '.', at most 64 characters"
# \A…\Z, not ^…$: "$" also matches before a final newline, so "x\n" would pass.
_NAME = re.compile(r"\A[a-z0-9_][a-z0-9._-]{0,63}\Z")


def validate_name(value: str, what: str = "name") -> str:
    if not _NAME.match(value or "") or ".." in value or value.endswith((".lock", ".")):
        raise InvalidName(f"invalid {what} {value!r}: use {NAME_RULE}")
    return value


def closest(word: str, names: t.Iterable[str], limit: int = 3) -> list[str]:
    """The names a mistyped ``word`` most likely meant, best first (at most ``limit``; [] when none is close).

    The first of these rules that finds any: the same name in another case; names that start with
    ``word``, or have a part (after '-', '_' or '.') that does (`greet` -> `builder-greet`); names
    that contain it (3 characters or more); what ``difflib`` finds close to the whole name (`stauts`
    -> `status`), then to a part of it (`gret` -> `builder-greet`). Only called on an error path.
    """
    import difflib

    lower = word.lower()
    unique = sorted({name for name in names if name and name != word}, key=lambda name: (len(name), name))

    def parts(name: str) -> list[str]:
        return re.split(r"[-_.]", name.lower())

    def part_close(name: str) -> bool:
        return any(difflib.SequenceMatcher(None, lower, part).ratio() >= 0.75 for part in parts(name))

    def similar() -> list[str]:
        """Close to the whole name (difflib's 0.6), and not much less than the closest (a shared `builder-`
        makes every builder look 0.6 alike)."""
        scored = sorted(((difflib.SequenceMatcher(None, word, name).ratio(), name) for name in unique),
                        key=lambda pair: -pair[0])
        best = scored[0][0] if scored else 0.0
        return [name for score, name in scored if score >= max(0.6, best - 0.1)]

    rules: list[t.Callable[[], list[str]]] = [
        lambda: [name for name in unique if name.lower() == lower],
        lambda: [name for name in unique if name.lower().startswith(lower) or any(p.startswith(lower)
                                                                                  for p in parts(name))],
        lambda: [name for name in unique if len(lower) >= 3 and lower in name.lower()],
        similar,
        lambda: [name for name in unique if part_close(name)],
    ]
    if not lower:
        return []
    return next((found[:limit] for rule in rules if (found := rule())), [])


def did_you_mean(word: str, names: t.Iterable[str]) -> str:
    """`` (did you mean 'a'?)``, `` (did you mean 'a' or 'b'?)``, or "" when nothing is close to ``word``."""
    found = closest(word, names)
    return f" (did you mean {either(found)}?)" if found else ""
