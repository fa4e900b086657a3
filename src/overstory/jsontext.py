"""JSON for the hot commands, without importing the ``json`` package. HOT: standard library only.

``import json`` imports ``re`` (and ``re`` imports ``enum`` and ``functools``): 5-8 ms of a
hot command whose target is twice an empty interpreter's start, about 11 ms here. The
work itself is done by ``_json``, the C accelerator the ``json`` package uses too, so
values come out exactly as ``json.loads``/``json.dumps`` make them
(``tests/test_jsontext.py`` compares the two on generated documents).

Anything unusual is handed to the ``json`` package, so errors read exactly as its own:
text that does not parse, and options this module does not take.
"""

from __future__ import annotations

import _json

TYPE_CHECKING = False
if TYPE_CHECKING:
    import typing as t

_WHITESPACE = " \t\n\r"
_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}


class _Options:
    """What ``_json.make_scanner`` reads from a decoder: the defaults of ``json.loads``."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__


_scan = _json.make_scanner(_Options())


def loads(text: str | bytes) -> t.Any:
    """``json.loads(text)``; malformed text raises ``json.JSONDecodeError`` (a ValueError) as it would.

    Any failure of the scanner is handed to the json package with the text as given: ``_json``
    raises its ``JSONDecodeError`` only when ``json.decoder`` is already imported (in a hot
    command it is not, and the scanner then fails with a bare ``SystemError``), and bytes are
    decoded there as json.loads decodes them (a BOM, UTF-16/32, encoded surrogates).
    """
    given = text
    if type(text) is not str:
        if not isinstance(text, (bytes, bytearray)):
            return _package_loads(given)  # the json package's own TypeError
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:  # UTF-16 or -32, which json.loads also detects
            return _package_loads(given)
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        value, end = _scan(text, start)
    except Exception:  # noqa: BLE001 - StopIteration (nothing there), a decode error, SystemError, RecursionError
        return _package_loads(given)
    if text[end:].strip(_WHITESPACE):
        return _package_loads(given)
    return value


def _package_loads(text: t.Any) -> t.Any:
    """The rare bad input: the json package says what is wrong, in its own words (and its own exception)."""
    import json

    return json.loads(text)


def dumps(value: t.Any, *, ensure_ascii: bool = True, sort_keys: bool = False,
          separators: tuple[str, str] | None = None, default: t.Callable[[t.Any], t.Any] | None = None,
          indent: int | None = None) -> str:
    """``json.dumps`` with these options (and its defaults for every other one)."""
    item_separator, key_separator = separators if separators is not None else (
        (",", ": ") if indent is not None else (", ", ": "))
    string = _json.encode_basestring_ascii if ensure_ascii else _json.encode_basestring
    if indent is not None:
        return _Pretty(string, indent, item_separator, key_separator, sort_keys, default).text(value)
    encode = _json.make_encoder({}, default or _refuse, string, None, key_separator, item_separator, sort_keys,
                                False, True)
    return "".join(encode(value, 0))


def _refuse(value: t.Any) -> t.Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _float(value: float) -> str:
    if value != value:  # noqa: PLR0124 - NaN
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    return float.__repr__(value)


class _Pretty:
    """``json.dumps(indent=N)``: the C encoder has no indentation, and the package's own is in ``json.encoder``.
    Appends to one list (nested generators cost twice as much on `ov status --json`'s 50 agents)."""

    def __init__(self, string: t.Callable[[str], str], indent: int, item_separator: str, key_separator: str,
                 sort_keys: bool, default: t.Callable[[t.Any], t.Any] | None) -> None:
        self.string, self.indent, self.sort_keys = string, " " * indent, sort_keys
        self.item_separator, self.key_separator = item_separator, key_separator
        self.default = default or _refuse
        self.seen: set[int] = set()
        self.out: list[str] = []

    def text(self, value: t.Any) -> str:
        self.write(value, 0)
        return "".join(self.out)

    def write(self, value: t.Any, level: int) -> None:
        out = self.out
        kind = type(value)
        if kind is str:
            out.append(self.string(value))
        elif value is None:
            out.append("null")
        elif value is True:
            out.append("true")
        elif value is False:
            out.append("false")
        elif kind is int:
            out.append(int.__repr__(value))
        elif kind is dict or kind is list:
            self._container(value, level)
        elif isinstance(value, str):
            out.append(self.string(value))
        elif isinstance(value, int):
            out.append(int.__repr__(value))
        elif isinstance(value, float):
            out.append(_float(value))
        elif isinstance(value, (list, tuple, dict)):
            self._container(value, level)
        else:
            marker = id(value)
            if marker in self.seen:
                raise ValueError("Circular reference detected")
            self.seen.add(marker)
            self.write(self.default(value), level)
            self.seen.discard(marker)

    def _container(self, value: t.Any, level: int) -> None:
        out = self.out
        is_dict = isinstance(value, dict)
        if not value:
            out.append("{}" if is_dict else "[]")
            return
        marker = id(value)
        if marker in self.seen:
            raise ValueError("Circular reference detected")
        self.seen.add(marker)
        inner = "\n" + self.indent * (level + 1)
        between = self.item_separator + inner
        out.append(("{" if is_dict else "[") + inner)
        first = True
        if is_dict:
            for key, item in (sorted(value.items()) if self.sort_keys else value.items()):
                if not first:
                    out.append(between)
                first = False
                out.append(self.string(key if type(key) is str else self._key(key)) + self.key_separator)
                self.write(item, level + 1)
        else:
            for item in value:
                if not first:
                    out.append(between)
                first = False
                self.write(item, level + 1)
        out.append("\n" + self.indent * level + ("}" if is_dict else "]"))
        self.seen.discard(marker)

    @staticmethod
    def _key(key: t.Any) -> str:
        if isinstance(key, str):
            return key
        if key is True:
            return "true"
        if key is False:
            return "false"
        if key is None:
            return "null"
        if isinstance(key, float):
            return _float(key)
        if isinstance(key, int):
            return int.__repr__(key)
        raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")
