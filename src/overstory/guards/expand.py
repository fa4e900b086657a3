"""Expanding shell words the way bash does: braces, tilde, parameters, word splitting.

``words.lex_words`` returns a ``Word`` for any word whose value depends on expansion;
the walker expands it here with the variables it knows at that point of the command
line. Most commands have no such word, so this module is only imported when one does.
"""

from __future__ import annotations

import itertools

from overstory.guards.chars import brace_sequence, is_user_name, simple_parameter
from overstory.guards.words import _UNKNOWN, LIT, RAW, TooManyWords, Word

TYPE_CHECKING = False  # typing and collections.abc cost `ov guard` milliseconds
if TYPE_CHECKING:
    from collections.abc import Callable

    Lookup = Callable[[str], "str | None"]

_MAX_WORDS = 512  # brace expansion beyond this many words is refused, not enumerated


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
    if not is_user_name(prefix):
        return text
    import pwd  # only when a ~user appears

    try:
        return pwd.getpwnam(prefix).pw_dir + slash + rest
    except KeyError:
        return text  # bash leaves an unknown user's ~name as it is


def _parameter_value(text: str, lookup: Lookup) -> str | None:
    """The value of ``$name`` / ``${name}`` / ``${name:-word}`` …, or None if unknown."""
    if text.startswith("${"):
        match = simple_parameter(text[2:-1])  # ${name}, ${name:-word} ...
        if match is None:
            return None
        name, op, default = match
    else:
        name, op, default = text[1:], None, None
    value = lookup(name) if (name[0].isalpha() or name[0] == "_") else _UNKNOWN
    if op is None or value == _UNKNOWN:
        return None if value is None or _UNKNOWN in value else value
    if default is None:  # the pattern gives an operator only with its word
        return None
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
        return start, end, [tokens[a + 1 : b] for a, b in itertools.pairwise(bounds)]
    return start, end, [[item] for item in _sequence(tokens[start + 1 : end]) or []]


def _sequence(inside: list[tuple[int, str, bool] | str]) -> list[str] | None:
    if len(inside) > 64 or not all(isinstance(t, str) for t in inside):
        return None
    text = "".join(t for t in inside if isinstance(t, str))
    match = brace_sequence(text)  # {1..9}, {a..e}, {0..10..2}
    if match is None:
        return None
    first, last, step_text = match
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
