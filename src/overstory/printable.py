"""Text an agent may have written, made safe to print on the operator's terminal.

Agents write commands, mail subjects and bodies, file names, tool output, summaries and
reasons. Printed raw, their control characters drive the terminal: ``\\x1b[2K\\r\\x1b[1A``
erases the line it is on and draws a fake line above the real one. Every place that
prints such text passes it through one of these (standard library only, no imports, so
the hot commands can use them):

- ``line(text)``: a field shown on one line. Every control character is escaped,
  newlines and tabs included, so the field stays on its one line;
- ``block(text)``: text shown as several lines (a mail body, a diff). Newlines and
  tabs stay; every other control character is escaped (a carriage return too);
  ``colored_block`` also keeps color sequences, for git's colored diff;
- ``json_text(dumped)``: JSON written with ``ensure_ascii=False`` escapes C0 controls
  already; this also escapes what it leaves raw (C1 controls, bidirectional overrides,
  line and paragraph separators), as ``\\u`` escapes that decode to the same strings.

Escaped means written the way Python writes it: ``\\x1b``, ``\\r``, ``\\n``, ``\\t``,
``\\x07``, ``\\x9b``, ``\\u202e``. Backslashes themselves are left alone (commands are
full of them), so a literal ``\\n`` typed by an agent looks like an escaped newline.

What counts as a control character: C0 (U+0000-U+001F), DEL, C1 (U+0080-U+009F), the
line and paragraph separators, and the bidirectional marks and overrides (which can
make a command read differently from what runs).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs milliseconds on a hot path
if TYPE_CHECKING:
    from collections.abc import Iterable

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_BIDI = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
_CONTROLS = (*range(0x20), 0x7F, *range(0x80, 0xA0), 0x2028, 0x2029, *_BIDI)


def _escape(code: int) -> str:
    char = chr(code)
    if char in _NAMED:
        return _NAMED[char]
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


_LINE = {code: _escape(code) for code in _CONTROLS}
_BLOCK = {code: text for code, text in _LINE.items() if code not in (0x0A, 0x09)}
_JSON = {code: f"\\u{code:04x}" for code in _CONTROLS if code >= 0x7F}


def line(text: object) -> str:
    """``text`` on one line, every control character escaped (``None`` is the empty string)."""
    if text is None:
        return ""
    value = text if isinstance(text, str) else str(text)
    return value if value.isprintable() else value.translate(_LINE)


def block(text: object) -> str:
    """``text`` with its newlines and tabs kept and every other control character escaped."""
    if text is None:
        return ""
    value = text if isinstance(text, str) else str(text)
    return value if value.isprintable() else value.translate(_BLOCK)


def json_text(dumped: str) -> str:
    """JSON text (from ``ensure_ascii=False``) with the controls it leaves raw written as ``\\u`` escapes."""
    return dumped if dumped.isascii() and "\x7f" not in dumped else dumped.translate(_JSON)


def colored_block(text: str) -> str:
    """``block``, except that SGR color sequences (``ESC [ digits ; m``, as git's colored diff writes) stay.

    For `ov diff` on a terminal: an agent's file may add colors of its own, nothing more (no
    cursor movement, no erasing), as ``less -R`` allows.
    """
    if text.isprintable():
        return text
    import re

    parts = re.split(r"(\x1b\[[0-9;]*m)", text)
    return "".join(part if index % 2 else block(part) for index, part in enumerate(parts))


def lines(texts: Iterable[object]) -> str:
    """Several one-line texts, each escaped by ``line``, joined with newlines."""
    return "\n".join(line(text) for text in texts)
