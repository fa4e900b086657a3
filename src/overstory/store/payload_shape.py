"""How deep and how big a mail payload may be. Standard library only (``ov mail send`` imports it).

The depth is checked without recursion, so a 60 000-deep document is refused here instead
of crashing whatever reads it back later (``json.loads``, pydantic, a prompt renderer).
"""

from __future__ import annotations

from overstory import jsontext as json
from overstory.errors import PayloadError

TYPE_CHECKING = False  # typing costs milliseconds: `ov mail send` imports this module
if TYPE_CHECKING:
    import typing as t

MAX_DEPTH = 64


def encode(payload: t.Any, max_chars: int) -> str:
    """The payload as stored (JSON), or PayloadError when it is too deep or too big."""
    check_shape(payload, MAX_DEPTH)
    encoded = json.dumps(payload, ensure_ascii=False, sort_keys=True)
    if len(encoded) > max_chars:
        raise PayloadError(f"the payload is over {max_chars} characters (1 MiB): send a file path instead")
    return encoded


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
