"""The guard's character tests, written out instead of regular expressions. HOT: no imports.

`ov guard` runs on every tool call, as a new process. Importing ``re`` (it imports ``enum``,
``functools`` and ``collections``) and compiling the lexer's and walker's patterns was about a
quarter of its CPU time, more than the whole shell check. Each function here does the work of one
pattern, quoted in its docstring, and answers as that pattern does for every string, Unicode
included: ``\\s`` is ``str.isspace``, ``\\d`` is ``str.isdecimal``, ``\\w`` is ``str.isalnum`` or
``_`` (as in ``re`` for ``str`` patterns), and a ``$`` that ends a pattern also matches before a
final newline. tests/test_guard_chars.py checks every function against its pattern on generated
text and the classes on every code point; tests/test_guard_lexer_oracle.py checks the whole lexer
and guard against the regular-expression code they replace.

Patterns that rare calls need stay regular expressions, compiled where they are used (an awk
program, a chmod mode, codex's ``apply_patch``, a write scope's globs).
"""

from __future__ import annotations

NAME_START = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")  # [A-Za-z_]
NAME_CHARS = NAME_START | frozenset("0123456789")  # [A-Za-z0-9_]
ASCII_LETTERS = NAME_START - {"_"}  # [A-Za-z]
_LOWER_START = frozenset("abcdefghijklmnopqrstuvwxyz_")  # [a-z_]
_LOWER_CHARS = _LOWER_START | frozenset("0123456789")  # [a-z0-9_]
_OCTAL = frozenset("01234567")
_HEX = frozenset("0123456789ABCDEFabcdef")
_USER_CHARS = NAME_CHARS | frozenset(".-")  # [A-Za-z0-9._-]
_RAW_STOPS = frozenset("'\"\\$")
_SHELL_WORD_BEFORE = frozenset("./-")  # with \w: what may not come right before a shell word
_SHELL_WORD_AFTER = frozenset(".-")  # with \w: what may not come right after one


def run_end(text: str, i: int, stops: frozenset[str] | str) -> int:
    """The first index from ``i`` whose character is one of ``stops`` (``len(text)`` if none).

    ``[^STOPS]+`` matches at ``i`` when this is past ``i``, and ends here; ``[STOPS]`` searched
    from ``i`` finds this index when it is inside the text.
    """
    n = len(text)
    while i < n and text[i] not in stops:
        i += 1
    return i


def raw_run_end(text: str, i: int) -> int:
    """Where ``[^\\s'"\\\\$]+`` matched at ``i`` ends (``i``: no match): an unquoted run of a shell word."""
    n = len(text)
    while i < n:
        c = text[i]
        if c in _RAW_STOPS or c.isspace():
            break
        i += 1
    return i


def name_end(text: str, i: int) -> int:
    """Where ``[A-Za-z_][A-Za-z0-9_]*`` matched at ``i`` ends (``i``: no match)."""
    n = len(text)
    if i >= n or text[i] not in NAME_START:
        return i
    i += 1
    while i < n and text[i] in NAME_CHARS:
        i += 1
    return i


def is_name(text: str) -> bool:
    """``re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", text)``: a shell variable's name."""
    return bool(text) and name_end(text, 0) == len(text)


def is_lowercase_name(text: str) -> bool:
    """``re.fullmatch(r"[a-z_][a-z0-9_]*", text)``."""
    if not text or text[0] not in _LOWER_START:
        return False
    return all(c in _LOWER_CHARS for c in text)


def is_assignment(text: str) -> bool:
    """``re.match(r"^[A-Za-z_][A-Za-z0-9_]*(\\[[^\\]]*\\])?\\+?=", text)``: a word that assigns a variable
    (``x=1``, ``a[i]+=2``)."""
    end = name_end(text, 0)
    if end == 0:
        return False
    if text.startswith("[", end):
        close = text.find("]", end + 1)
        if close >= 0 and (text.startswith("=", close + 1) or text.startswith("+=", close + 1)):
            return True
    return text.startswith("=", end) or text.startswith("+=", end)


def has_shell_word(text: str, words: tuple[str, ...]) -> bool:
    """``re.search(r"(?<![\\w./-])(WORD|...)(?![\\w.-])", text)``: is one of ``words`` in ``text`` as a word of
    its own (``cd`` in ``x; cd y``, not in ``abcd`` or ``cd.sh``)?"""
    for word in words:
        start = text.find(word)
        while start >= 0:
            end = start + len(word)
            before = text[start - 1] if start else ""
            after = text[end] if end < len(text) else ""
            if not (before and (before in _SHELL_WORD_BEFORE or before.isalnum() or before == "_")) and not (
                    after and (after in _SHELL_WORD_AFTER or after.isalnum() or after == "_")):
                return True
            start = text.find(word, start + 1)
    return False


def is_decimal_number(text: str, signs: str) -> bool:
    """``re.fullmatch(r"[SIGNS]?\\d+", text)`` when ``signs`` is ``-`` (``-?\\d+``), and
    ``re.fullmatch(r"[+-]\\d+", text)`` when it is ``+-`` (a sign required)."""
    if signs == "-":
        return (text[1:] if text.startswith("-") else text).isdecimal()
    return text[:1] in ("+", "-") and text[1:].isdecimal()


def _before_final_newline(text: str) -> tuple[str, ...]:
    """What a pattern ending in ``$`` (no MULTILINE) may have matched up to: the whole text, or all but
    its one final newline."""
    return (text, text[:-1]) if text.endswith("\n") else (text,)


def _python_version(rest: str) -> bool:
    """``(\\d+(\\.\\d+)?)?`` matching all of ``rest``."""
    if not rest:
        return True
    major, dot, minor = rest.partition(".")
    return major.isdecimal() and (not dot or minor.isdecimal())


def is_python_program(name: str) -> bool:
    """``re.match(r"^(python(\\d+(\\.\\d+)?)?|py|pypy3?|ipython3?)$", name)``: any python (python3.11, pypy3,
    ipython)."""
    for text in _before_final_newline(name):
        if text in ("py", "pypy", "pypy3", "ipython", "ipython3"):
            return True
        if text.startswith("python") and _python_version(text[len("python"):]):
            return True
    return False


def is_pip_program(name: str) -> bool:
    """``re.match(r"^pip(\\d+(\\.\\d+)?)?$", name)``: pip, pip3, pip3.11."""
    return any(text.startswith("pip") and _python_version(text[3:]) for text in _before_final_newline(name))


def is_negative_number_option(text: str) -> bool:
    """``re.match(r"^-\\d+$", text)`` (``nice -5``)."""
    return any(t.startswith("-") and t[1:].isdecimal() for t in _before_final_newline(text))


def is_user_name(text: str) -> bool:
    """``re.fullmatch(r"[A-Za-z0-9._-]+", text)``: a ``~user`` name bash would look up."""
    return bool(text) and all(c in _USER_CHARS for c in text)


def leading(text: str, i: int, chars: frozenset[str], most: int) -> int:
    """How many of ``text[i:i + most]`` are ``chars`` from its start: ``re.match("[CHARS]{1,MOST}", ...)``'s length
    (0: no match)."""
    count = 0
    while count < most and i + count < len(text) and text[i + count] in chars:
        count += 1
    return count


def octal_digits(text: str, i: int) -> int:
    """``re.match(r"[0-7]{1,2}", text[i:i + 2])``'s length (0: no match)."""
    return leading(text, i, _OCTAL, 2)


def hex_digits(text: str, i: int, width: int) -> int:
    """``re.match(f"[0-9A-Fa-f]{{1,{width}}}", text[i:i + width])``'s length (0: no match)."""
    return leading(text, i, _HEX, width)


# ---- ${...}: what words.py notes about a parameter expansion's body


def has_parameter_operator(body: str) -> bool:
    """``re.search(r"@[A-Za-z]", body)``: ``${x@P}``, ``${x@Q}`` ..."""
    at = body.find("@")
    while at >= 0:
        if body[at + 1:at + 2] in ASCII_LETTERS:
            return True
        at = body.find("@", at + 1)
    return False


def array_subscript(body: str) -> str | None:
    """``re.match(r"^[A-Za-z_][A-Za-z0-9_]*\\[([^\\]]*)\\]", body)``'s group: the subscript of ``${a[i]}``."""
    end = name_end(body, 0)
    if end == 0 or not body.startswith("[", end):
        return None
    close = body.find("]", end + 1)
    return None if close < 0 else body[end + 1:close]


def is_plain_subscript(text: str) -> bool:
    """``re.fullmatch(r"[0-9@*]*", text)``: a subscript that is no arithmetic."""
    return all(c in "0123456789@*" for c in text)


def is_substring_expansion(body: str) -> bool:
    """``re.match(r"^[A-Za-z_][A-Za-z0-9_]*:[^-+=?]", body)``: ``${x:offset...}`` (not ``${x:-word}`` ...)."""
    end = name_end(body, 0)
    return end > 0 and body.startswith(":", end) and end + 1 < len(body) and body[end + 1] not in "-+=?"


def has_name_char(text: str) -> bool:
    """``re.search(r"[A-Za-z_]", text)``: does arithmetic (or an offset) name a variable?"""
    return any(c in NAME_START for c in text)


# ---- expand.py


_SPECIAL_PARAMETERS = frozenset("0123456789@*#?$!-")
_OPERATORS = frozenset("-+=?")


def simple_parameter(body: str) -> tuple[str, str | None, str | None] | None:
    """The groups of ``re.match(r"^([A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-])(?:(:?[-+=?])(.*))?$", body, re.DOTALL)``:
    (name, operator, word) of ``${name}``, ``${name:-word}`` ...; None when the body is anything else."""
    end = name_end(body, 0)
    if end == 0:
        if not body or body[0] not in _SPECIAL_PARAMETERS:
            return None
        end = 1
    name = body[:end]
    if body.startswith(":", end) and body[end + 1:end + 2] in _OPERATORS and end + 1 < len(body):
        return name, body[end:end + 2], body[end + 2:]
    if end < len(body) and body[end] in _OPERATORS:
        return name, body[end], body[end + 1:]
    if end == len(body) or body[end:] == "\n":
        return name, None, None
    return None


def _range_end(text: str) -> bool:
    """``-?\\d+|[A-Za-z]`` matching all of ``text``."""
    return (len(text) == 1 and text in ASCII_LETTERS) or is_decimal_number(text, "-")


def brace_sequence(text: str) -> tuple[str, str, str | None] | None:
    """The groups of ``re.fullmatch(r"(-?\\d+|[A-Za-z])\\.\\.(-?\\d+|[A-Za-z])(?:\\.\\.(-?\\d+))?", text)``: the
    first, last and step of ``{1..9..2}``; None for anything else."""
    pieces = text.split("..")
    if len(pieces) not in (2, 3) or not _range_end(pieces[0]) or not _range_end(pieces[1]):
        return None
    if len(pieces) == 3:
        return (pieces[0], pieces[1], pieces[2]) if is_decimal_number(pieces[2], "-") else None
    return pieces[0], pieces[1], None


# ---- handlers


def _word_run_end(text: str, i: int) -> int:
    """Where ``[\\w.-]+`` matched at ``i`` ends (``i``: no match)."""
    n = len(text)
    while i < n:
        c = text[i]
        if not (c.isalnum() or c in "_.-"):
            break
        i += 1
    return i


def is_remote_path(text: str) -> bool:
    """``re.match(r"^([\\w.-]+@)?[\\w.-]+:", text)``: ``host:path`` or ``user@host:path`` (scp, rsync)."""
    end = _word_run_end(text, 0)
    if end == 0:
        return False
    if text.startswith(":", end):
        return True
    if not text.startswith("@", end):
        return False
    host_end = _word_run_end(text, end + 1)
    return host_end > end + 1 and text.startswith(":", host_end)
