"""How deep a mail payload may nest. Standard library only (``ov mail send`` imports it).

Checked without recursion, so a 60 000-deep document is refused here instead of crashing
whatever reads it back later (``json.loads``, pydantic, a prompt renderer).
"""

from __future__ import annotations

import typing as t

from overstory.errors import PayloadError


def check_shape(payload: t.Any, max_depth: int) -> None:
    stack: list[tuple[t.Any, int]] = [(payload, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: t.Iterable[t.Any] = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > max_depth:
            raise PayloadError(f"the payload is nested too deeply (at most {max_depth} levels of lists/objects)")
        stack.extend((child, depth + 1) for child in children)
