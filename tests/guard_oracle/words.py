# A frozen copy of src/overstory/guards/words.py at commit 511c463, before issue 34 took regular expressions out of
# the guard: the oracle tests/test_guard_lexer_oracle.py compares the lexer with. Unchanged but for this note and
# the import of words.py. Do not edit it to follow the lexer: a change of behaviour made on purpose is made here
# too, in the same commit, the same way.
# ruff: noqa
"""Shell words: split one simple command into words, keeping what expansion needs.

The scanner (``shell``) hands over one simple command's text, substitutions already
replaced by a marker. ``lex_words`` splits it into words. A word whose value is plain
text once its quotes are removed comes back as a ``str``; a word whose value depends on
expansion (``$VAR``, ``${...}``, brace expansion ``{a,b}``, ``~user``) comes back as a
``Word`` of parts, and the walker expands it (``expand.expand_word``) with the variables
it knows at that point of the command line. ANSI-C strings (``$'\\x41'``) are decoded here.

Notable constructs are added to the caller's ``forms`` set (``ansi-c``, ``ifs``,
``tilde-user`` …): read-only agents are refused anything the parser does not model, and
some of these are refused for everyone.
"""

from __future__ import annotations

import re

LIT, RAW, VAR = 0, 1, 2  # quoted text / unquoted text (braces, tilde apply) / an expansion
_UNKNOWN = "__ov_cmdsub__"  # the value of anything that cannot be known before it runs

_RAW_RUN = re.compile(r"[^\s'\"\\$]+")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class TooManyWords(ValueError):
    """Brace expansion would produce more words than the guard will check."""


class Word:
    """A word still to be expanded: parts of ``(kind, text, quoted)``."""

    __slots__ = ("parts",)

    def __init__(self, parts: tuple[tuple[int, str, bool], ...]) -> None:
        self.parts = parts

    def __repr__(self) -> str:
        return f"Word({self.parts!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Word) and self.parts == other.parts

    def __hash__(self) -> int:
        return hash(self.parts)


def word_text(word: str | Word) -> str:
    """The word as written, minus quotes (for display and the public ``split_shell``)."""
    if isinstance(word, str):
        return word
    return "".join(text for _, text, _ in word.parts)


def lex_words(segment: str, forms: set[str]) -> list[str | Word]:
    """Split one simple command's text into words (redirection markers stay words)."""
    words: list[str | Word] = []
    n = len(segment)
    i = 0
    while i < n:
        while i < n and segment[i] in " \t\n":
            i += 1
        if i >= n:
            break
        parts: list[tuple[int, str, bool]] = []
        while i < n and segment[i] not in " \t\n":
            c = segment[i]
            run = _RAW_RUN.match(segment, i)
            if run:
                parts.append((RAW, run.group(), False))
                i = run.end()
            elif c == "'":
                end = segment.find("'", i + 1)
                if end < 0:
                    raise ValueError("No closing quotation")
                parts.append((LIT, segment[i + 1 : end], True))
                i = end + 1
            elif c == '"':
                i = _double_quoted(segment, i + 1, parts, forms)
            elif c == "\\":
                if i + 1 >= n:
                    raise ValueError("No escaped character")
                parts.append((LIT, segment[i + 1], True))
                i += 2
            else:  # "$"
                i = _dollar(segment, i, parts, forms, quoted=False)
        words.append(_finish(parts))
    return words


def _finish(parts: list[tuple[int, str, bool]]) -> str | Word:
    """A plain ``str`` when no expansion can change the word, else a ``Word``."""
    raw = "".join(text for kind, text, _ in parts if kind == RAW)
    if any(kind == VAR for kind, _, _ in parts) or "~" in raw or (
            "{" in raw and "}" in raw and ("," in raw or ".." in raw)):
        return Word(tuple(parts))
    return "".join(text for _, text, _ in parts)


def _double_quoted(segment: str, i: int, parts: list[tuple[int, str, bool]], forms: set[str]) -> int:
    n = len(segment)
    literal: list[str] = []
    while i < n:
        c = segment[i]
        if c == '"':
            if literal:
                parts.append((LIT, "".join(literal), True))
            return i + 1
        if c == "\\" and i + 1 < n:
            nxt = segment[i + 1]
            literal.append(nxt if nxt in '$`"\\\n' else c + nxt)
            i += 2
        elif c == "$":
            if literal:
                parts.append((LIT, "".join(literal), True))
                literal = []
            i = _dollar(segment, i, parts, forms, quoted=True)
        else:
            literal.append(c)
            i += 1
    raise ValueError("No closing quotation")


def _dollar(segment: str, i: int, parts: list[tuple[int, str, bool]], forms: set[str],
            *, quoted: bool) -> int:
    """An expansion starting at the ``$`` at ``i``; returns the index after it."""
    n = len(segment)
    nxt = segment[i + 1] if i + 1 < n else ""
    if nxt == "'" and not quoted:
        forms.add("ansi-c")
        value, i = _ansi_c(segment, i + 2)
        parts.append((LIT, value, True))
        return i
    if nxt == '"' and not quoted:
        forms.add("ansi-c")  # $"..." (locale translation): treated as "..."
        return _double_quoted(segment, i + 2, parts, forms)
    if nxt == "{":
        end = _brace_end(segment, i + 2)
        body = segment[i + 2 : end - 1]
        _note_parameter(body, forms, quoted=quoted)
        parts.append((VAR, segment[i:end], quoted))
        return end
    if nxt == "[":
        forms.add("arith-var")
        end = segment.find("]", i)
        end = n if end < 0 else end + 1
        parts.append((VAR, segment[i:end], quoted))
        return end
    name = _NAME.match(segment, i + 1)
    if name:
        if name.group() == "IFS":
            forms.add("ifs" if quoted else "ifs-unquoted")
        parts.append((VAR, "$" + name.group(), quoted))
        return name.end()
    if nxt and nxt in "0123456789@*#?$!-":
        parts.append((VAR, "$" + nxt, quoted))
        return i + 2
    parts.append((LIT, "$", True))  # a `$` before anything else is itself
    return i + 1


def _brace_end(segment: str, i: int) -> int:
    """Index after the ``}`` closing a ``${`` whose body starts at ``i``."""
    n = len(segment)
    depth = 1
    while i < n:
        c = segment[i]
        if c == "\\":
            i += 2
            continue
        if c in "'\"":
            end = segment.find(c, i + 1)
            i = n if end < 0 else end + 1
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError("a `${` is never closed")


def _note_parameter(body: str, forms: set[str], *, quoted: bool) -> None:
    """Record the ``${...}`` forms the policy treats specially."""
    if body.startswith("!"):
        forms.add("indirect")
    if re.search(r"@[A-Za-z]", body):
        forms.add("prompt" if "@P" in body else "param-op")
    if body.startswith("IFS") and not re.match(r"[A-Za-z0-9_]", body[3:4]):
        forms.add("ifs" if quoted else "ifs-unquoted")
    subscript = re.match(r"^[A-Za-z_][A-Za-z0-9_]*\[([^\]]*)\]", body)
    if subscript and not re.fullmatch(r"[0-9@*]*", subscript.group(1)):
        forms.add("arith-var")
    if re.match(r"^[A-Za-z_][A-Za-z0-9_]*:[^-+=?]", body) and re.search(r"[A-Za-z_]", body.split(":", 1)[1]):
        forms.add("arith-var")


_ANSI_SIMPLE = {"a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "n": "\n", "r": "\r",
                "t": "\t", "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?"}


def _ansi_c(segment: str, i: int) -> tuple[str, int]:
    """Decode ``$'...'`` from just after its opening quote."""
    out: list[str] = []
    n = len(segment)
    while i < n:
        c = segment[i]
        if c == "'":
            return "".join(out), i + 1
        if c != "\\" or i + 1 >= n:
            out.append(c)
            i += 1
            continue
        e = segment[i + 1]
        i += 2
        if e in _ANSI_SIMPLE:
            out.append(_ANSI_SIMPLE[e])
        elif e in "01234567":
            digits = re.match(r"[0-7]{1,2}", segment[i:i + 2])
            code = e + (digits.group() if digits else "")
            i += len(code) - 1
            out.append(chr(int(code, 8) & 0xFF))
        elif e in "xuU":
            width = {"x": 2, "u": 4, "U": 8}[e]
            digits = re.match(f"[0-9A-Fa-f]{{1,{width}}}", segment[i:i + width])
            if digits:
                i += len(digits.group())
                out.append(chr(min(int(digits.group(), 16), 0x10FFFF)))
            else:
                out.append("\\" + e)
        elif e == "c" and i < n:
            out.append(chr(ord(segment[i]) & 0x1F))
            i += 1
        else:
            out.append("\\" + e)
    raise ValueError("No closing quotation")
