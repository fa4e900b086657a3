"""Shell words: split one simple command into words, and expand them the way bash does.

The scanner (``shell``) hands over one simple command's text, substitutions already
replaced by a marker. ``lex_words`` splits it into words. A word whose value is plain
text once its quotes are removed comes back as a ``str``; a word whose value depends on
expansion (``$VAR``, ``${...}``, brace expansion ``{a,b}``, ``~user``) comes back as a
``Word`` of parts, and the policy expands it (``expand_word``) with the variables it
knows at that point of the command line. ANSI-C strings (``$'\\x41'``) are decoded here.

Notable constructs are added to the caller's ``forms`` set (``ansi-c``, ``ifs``,
``tilde-user`` …): read-only agents are refused anything the parser does not model, and
some of these are refused for everyone.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

LIT, RAW, VAR = 0, 1, 2  # quoted text / unquoted text (braces, tilde apply) / an expansion
_UNKNOWN = "__ov_cmdsub__"  # the value of anything that cannot be known before it runs
_MAX_WORDS = 512  # brace expansion beyond this many words is refused, not enumerated

_RAW_RUN = re.compile(r"[^\s'\"\\$]+")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SIMPLE_PARAM = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-])(?:(:?[-+=?])(.*))?$", re.S)


class TooManyWords(ValueError):
    """Brace expansion would produce more words than the guard will check."""


@dataclass(frozen=True, slots=True)
class Word:
    """A word still to be expanded: parts of ``(kind, text, quoted)``."""

    parts: tuple[tuple[int, str, bool], ...]


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
            digits = re.match(r"[0-9A-Fa-f]{1,%d}" % width, segment[i:i + width])
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


# --------------------------------------------------------------------------- expansion

Lookup = Callable[[str], "str | None"]


def expand_word(word: str | Word, lookup: Lookup, forms: set[str], *,
                assignment: bool = False) -> list[str]:
    """The words bash would pass for ``word``: braces, tilde, parameters, splitting.

    A value that cannot be known becomes ``_UNKNOWN``. ``lookup(name)`` gives a
    variable's value or None when it is not known. Assignments get no brace expansion
    and no word splitting, and expand ``~`` after ``=``.
    """
    if isinstance(word, str):
        return [word]
    variants = [list(word.parts)] if assignment else _braces(list(word.parts), forms)
    out: list[str] = []
    for parts in variants:
        out.extend(_expand_parts(parts, lookup, forms, assignment=assignment))
    return out


def _expand_parts(parts: list[tuple[int, str, bool]], lookup: Lookup, forms: set[str], *,
                  assignment: bool) -> list[str]:
    words: list[str] = []
    current: list[str] = []
    started = False
    for index, (kind, text, quoted) in enumerate(parts):
        if kind == RAW:
            if index == 0 and text.startswith("~"):
                text = _tilde(text, lookup, forms, next_quoted=len(parts) > 1 and "/" not in text)
            elif assignment and "=~" in text:
                head, _, rest = text.partition("=")
                text = head + "=" + _tilde(rest, lookup, forms, next_quoted=False)
            current.append(text)
            started = True
        elif kind == LIT:
            current.append(text)
            started = True
        else:
            value = _parameter_value(text, lookup)
            if value is None:
                current.append(_UNKNOWN)
                started = True
            elif quoted or assignment:
                current.append(value)
                started = True
            else:  # unquoted: split on whitespace (IFS is refused when changed)
                pieces = value.split()
                if not pieces:
                    continue
                if value[:1].isspace() and started:
                    words.append("".join(current))
                    current = []
                current.append(pieces[0])
                for piece in pieces[1:]:
                    words.append("".join(current))
                    current = [piece]
                started = True
                if value[-1:].isspace():
                    words.append("".join(current))
                    current = []
                    started = False
    if started or current:
        words.append("".join(current))
    return words


def _tilde(text: str, lookup: Lookup, forms: set[str], *, next_quoted: bool) -> str:
    """Expand a leading ``~``, ``~/``, ``~user``; ``~+``/``~-``/``~N`` become unknown."""
    prefix, slash, rest = text[1:].partition("/")
    if next_quoted and not slash:
        return text  # `~"root"`: a quoted character in the prefix turns expansion off
    if not prefix:
        home = lookup("HOME")
        return (home if home is not None else _UNKNOWN) + slash + rest
    if prefix[0] in "+-" or prefix.isdigit():
        forms.add("tilde-dir")
        return _UNKNOWN + slash + rest
    forms.add("tilde-user")
    if not re.fullmatch(r"[A-Za-z0-9._-]+", prefix):
        return text
    import pwd  # only when a ~user appears

    try:
        return pwd.getpwnam(prefix).pw_dir + slash + rest
    except KeyError:
        return text  # bash leaves an unknown user's ~name as it is


def _parameter_value(text: str, lookup: Lookup) -> str | None:
    """The value of ``$name`` / ``${name}`` / ``${name:-word}`` …, or None if unknown."""
    if text.startswith("${"):
        match = _SIMPLE_PARAM.match(text[2:-1])
        if not match:
            return None
        name, op, default = match.groups()
    else:
        name, op, default = text[1:], None, None
    value = lookup(name) if (name[0].isalpha() or name[0] == "_") else _UNKNOWN
    if op is None or value == _UNKNOWN:
        return None if value is None or _UNKNOWN in value else value
    if "$" in default or "`" in default or _UNKNOWN in default or "\\" in default or any(
            q in default for q in "'\""):
        return None
    if value is None:  # not set as far as ov can see: check the word written out
        return default
    empty = value == "" and op.startswith(":")
    if op.endswith(("-", "=")):
        return default if empty else value
    if op.endswith("+"):
        return "" if empty else default
    return value


# ---- brace expansion

_BUDGET = 200_000  # tokens walked while expanding one word: bounds the work, not just the output


def _braces(parts: list[tuple[int, str, bool]], forms: set[str]) -> list[list[tuple[int, str, bool]]]:
    """Brace-expand a word: unquoted ``{a,b}`` and ``{1..3}`` (quoted braces are text)."""
    tokens: list[tuple[int, str, bool] | str] = []
    for part in parts:
        if part[0] == RAW and any(ch in part[1] for ch in "{},"):
            tokens.extend(part[1])  # single characters: the brace syntax is made of them
        else:
            tokens.append(part)
    results: list[list[tuple[int, str, bool] | str]] = []
    _expand_tokens(tokens, results, forms, [0])
    return [_join_tokens(r) for r in results]


def _expand_tokens(tokens: list[tuple[int, str, bool] | str], results: list[list[tuple[int, str, bool] | str]],
                   forms: set[str], spent: list[int]) -> None:
    spent[0] += len(tokens)
    if spent[0] > _BUDGET or len(results) >= _MAX_WORDS:
        raise TooManyWords(f"brace expansion makes more than {_MAX_WORDS} words (or too long ones)")
    group = _first_group(tokens)
    if group is None:
        results.append(tokens)
        return
    forms.add("brace")
    start, end, alternatives = group
    for alternative in alternatives:
        _expand_tokens(tokens[:start] + alternative + tokens[end + 1:], results, forms, spent)


def _first_group(tokens: list[tuple[int, str, bool] | str]
                 ) -> tuple[int, int, list[list[tuple[int, str, bool] | str]]] | None:
    """The leftmost ``{...}`` that expands: (open index, close index, alternatives).

    One pass with a stack of open braces, so a word full of unmatched braces stays linear.
    """
    stack: list[tuple[int, list[int]]] = []
    best: tuple[int, int, list[int]] | None = None
    for j, t in enumerate(tokens):
        if t == "{":
            stack.append((j, []))
        elif t == "," and stack:
            stack[-1][1].append(j)
        elif t == "}" and stack:
            start, commas = stack.pop()
            if (commas or _sequence(tokens[start + 1 : j]) is not None) and (best is None or start < best[0]):
                best = (start, j, commas)
            if not stack and best is not None:
                break  # nothing to the right can start further left
    if best is None:
        return None
    start, end, commas = best
    if commas:
        bounds = [start] + commas + [end]
        return start, end, [tokens[a + 1 : b] for a, b in zip(bounds, bounds[1:])]
    return start, end, [[item] for item in _sequence(tokens[start + 1 : end]) or []]


def _sequence(inside: list[tuple[int, str, bool] | str]) -> list[str] | None:
    if len(inside) > 64 or not all(isinstance(t, str) for t in inside):
        return None
    text = "".join(t for t in inside if isinstance(t, str))
    match = re.fullmatch(r"(-?\d+|[A-Za-z])\.\.(-?\d+|[A-Za-z])(?:\.\.(-?\d+))?", text)
    if not match:
        return None
    first, last, step_text = match.groups()
    step = abs(int(step_text)) if step_text and int(step_text) else 1
    numeric = first.lstrip("-").isdigit()
    if numeric != last.lstrip("-").isdigit():
        return None
    a, b = (int(first), int(last)) if numeric else (ord(first), ord(last))
    if abs(b - a) // step + 1 > _MAX_WORDS:
        raise TooManyWords(f"brace expansion makes more than {_MAX_WORDS} words")
    values = range(a, b + (1 if b >= a else -1), step if b >= a else -step)
    if not numeric:
        return [chr(v) for v in values]
    padded = first.lstrip("-").startswith("0") or last.lstrip("-").startswith("0")
    width = max(len(first), len(last)) if padded else 0
    return [str(v).zfill(width) for v in values]


def _join_tokens(tokens: list[tuple[int, str, bool] | str]) -> list[tuple[int, str, bool]]:
    parts: list[tuple[int, str, bool]] = []
    raw: list[str] = []
    for token in tokens:
        if isinstance(token, str):
            raw.append(token)
            continue
        if raw:
            parts.append((RAW, "".join(raw), False))
            raw = []
        parts.append(token)
    if raw:
        parts.append((RAW, "".join(raw), False))
    return parts
