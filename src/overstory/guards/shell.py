"""The quote-aware shell scanner: a command line in, simple commands out.

It knows shell syntax only (quotes, operators, redirections, heredocs, ``$(...)``,
backticks, ``<(...)``), nothing about programs or who may run them. Commands found
inside substitutions come out as commands of their own, ahead of the one that holds them.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

_SUBST = "__ov_cmdsub__"  # stands in for the output of $(...), `...`, <(...)
_OP = "\x00"  # prefix of a redirection operator word; quoting can never produce it
_REDIRECT_OPERATORS = ("&>>", "&>", ">>", ">|", ">&", "<<<", "<<-", "<<", "<>", "<&", ">", "<")
_WRITE_REDIRECTS = frozenset({">", ">>", ">|", "&>", "&>>", "<>"})
_WORD_BREAK = " \t\n;&|<>()"


class _Unparseable(Exception):
    """Internal: the command line is not something we can split safely."""


@dataclass
class ShellCommand:
    """One simple command: its words and its redirections ``(operator, target)``."""

    argv: list[str]
    redirects: list[tuple[str, str]] = field(default_factory=list)


def split_shell(script: str) -> list[ShellCommand]:
    """Every simple command in ``script``, including those inside substitutions.

    Raises ValueError when the script cannot be split (unclosed quote, ``$(`` …).
    """
    try:
        segments, _ = _scan(script, 0, inside=False)
        return [_words(segment) for segment in segments]
    except _Unparseable as exc:
        raise ValueError(str(exc)) from None


def _scan(text: str, i: int, *, inside: bool) -> tuple[list[str], int]:
    """Split ``text`` from ``i`` into simple-command segments.

    With ``inside`` we are in ``$(``/``<(``: stop after the matching ``)``. Commands found
    in substitutions are appended before the command that contains them.
    """
    segments: list[str] = []
    buf: list[str] = []
    heredocs: list[tuple[str, bool, bool]] = []
    depth = 0
    n = len(text)
    in_case_pattern = False  # after `case … in` or `;;`: `|` joins patterns, `)` ends them

    def flush() -> None:
        nonlocal in_case_pattern
        segment = "".join(buf).strip()
        if segment:
            segments.append(segment)
            in_case_pattern = segment.split(None, 1)[0] == "case"
        buf.clear()

    while i < n:
        c = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        if c == "\\":
            if nxt == "\n":
                i += 2
                continue
            buf.append(text[i : i + 2])
            i += 2
        elif c == "'":
            end = text.find("'", i + 1)
            if end < 0:
                raise _Unparseable("a single quote is never closed")
            buf.append(text[i : end + 1])
            i = end + 1
        elif c == '"':
            i, word, inner = _substitutions(text, i + 1, closing_quote=True)
            segments.extend(inner)
            buf.append(f'"{word}"')
        elif c == "$" and nxt == "(":
            if text.startswith("$((", i):
                i = _skip_arithmetic(text, i + 1)
                buf.append("0")
            else:
                inner, i = _scan(text, i + 2, inside=True)
                segments.extend(inner)
                buf.append(_SUBST)
        elif c == "$" and nxt == "{":
            end = _closing_brace(text, i + 1)
            buf.append(text[i:end])
            i = end
        elif c in "<>" and nxt == "(":
            inner, i = _scan(text, i + 2, inside=True)
            segments.extend(inner)
            buf.append(_SUBST)
        elif c == "`":
            i, inner = _backticks(text, i + 1)
            segments.extend(inner)
            buf.append(_SUBST)
        elif c == "#" and (not buf or buf[-1][-1:] in (" ", "\t")):
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif c == "\n":
            flush()
            i = _heredoc_bodies(text, i + 1, heredocs, segments)
            heredocs.clear()
        elif c in "<>" or (c == "&" and nxt == ">"):
            i = _redirection(text, i, buf, heredocs)
        elif c == "|" and nxt != "|" and (
            in_case_pattern or "".join(buf).lstrip().startswith("case ")
        ):
            buf.append(" ")  # `a|b)` inside a case: one pattern, not a pipe
            i += 1
        elif c in ";&|":
            flush()
            start = i
            while i < n and text[i] in ";&|":
                i += 1
            if text[start:i] in (";;", ";&", ";;&"):
                in_case_pattern = True
        elif c == "(":
            flush()
            depth += 1
            i += 1
        elif c == ")":
            i += 1
            if inside and depth == 0:
                flush()
                return segments, i
            if depth == 0:
                buf.clear()  # an unbalanced `)` ends a `case` pattern: the words are not a command
                in_case_pattern = False
            else:
                flush()
                depth -= 1
        else:
            buf.append(c)
            i += 1
    if inside:
        raise _Unparseable("a `$(` or `<(` is never closed")
    if depth:
        raise _Unparseable("a `(` is never closed")
    flush()
    return segments, i


def _redirection(text: str, i: int, buf: list[str], heredocs: list[tuple[str, bool, bool]]) -> int:
    """Turn the redirection at ``i`` into its own marked word; return the next index."""
    op = next(o for o in _REDIRECT_OPERATORS if text.startswith(o, i))
    # A file-descriptor number written right before the operator (``2>``) belongs to it.
    current = "".join(buf)
    stripped = current.rstrip("0123456789")
    if stripped != current and (not stripped or stripped[-1] in " \t"):
        buf.clear()
        buf.append(stripped)
    i += len(op)
    if op in ("<<", "<<-"):
        i, delimiter, expand = _heredoc_word(text, i)
        heredocs.append((delimiter, op == "<<-", expand))
        buf.append(f" {_OP}{op} {shlex.quote(delimiter)} ")
        return i
    buf.append(f" {_OP}{op} ")
    return i


def _heredoc_word(text: str, i: int) -> tuple[int, str, bool]:
    n = len(text)
    while i < n and text[i] in " \t":
        i += 1
    word: list[str] = []
    quoted = False
    while i < n and text[i] not in _WORD_BREAK:
        c = text[i]
        if c in "'\"":
            end = text.find(c, i + 1)
            if end < 0:
                raise _Unparseable("a heredoc delimiter's quote is never closed")
            word.append(text[i + 1 : end])
            quoted = True
            i = end + 1
        elif c == "\\" and i + 1 < n:
            word.append(text[i + 1])
            quoted = True
            i += 2
        else:
            word.append(c)
            i += 1
    if not word:
        raise _Unparseable("a heredoc `<<` has no delimiter word")
    return i, "".join(word), not quoted


def _heredoc_bodies(
    text: str, i: int, heredocs: list[tuple[str, bool, bool]], segments: list[str]
) -> int:
    """Skip the bodies of pending heredocs; an unquoted body still runs its ``$(...)``."""
    n = len(text)
    for delimiter, strip_tabs, expand in heredocs:
        start = i
        body_end = n
        while i < n:
            newline = text.find("\n", i)
            line_end = n if newline < 0 else newline
            line = text[i:line_end]
            if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                body_end = i
                i = line_end + 1 if newline >= 0 else n
                break
            i = line_end + 1 if newline >= 0 else n
        if expand:
            body = text[start:body_end]
            _, _, inner = _substitutions(body, 0, closing_quote=False)
            segments.extend(inner)
    return i


def _substitutions(text: str, i: int, *, closing_quote: bool) -> tuple[int, str, list[str]]:
    """Scan double-quoted text (or a heredoc body) for ``$(...)`` and backticks.

    Returns (index after the closing quote, the text with substitutions replaced,
    the commands found inside them).
    """
    out: list[str] = []
    found: list[str] = []
    n = len(text)
    while i < n:
        c = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        if c == "\\":
            out.append(text[i : i + 2])
            i += 2
        elif c == '"' and closing_quote:
            return i + 1, "".join(out), found
        elif c == "$" and nxt == "(":
            if text.startswith("$((", i):
                i = _skip_arithmetic(text, i + 1)
                out.append("0")
            else:
                inner, i = _scan(text, i + 2, inside=True)
                found.extend(inner)
                out.append(_SUBST)
        elif c == "`":
            i, inner = _backticks(text, i + 1)
            found.extend(inner)
            out.append(_SUBST)
        else:
            out.append(c)
            i += 1
    if closing_quote:
        raise _Unparseable("a double quote is never closed")
    return i, "".join(out), found


def _backticks(text: str, i: int) -> tuple[int, list[str]]:
    inner: list[str] = []
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n and text[i + 1] in "`$\\":
            inner.append(text[i + 1])
            i += 2
        elif c == "`":
            segments, _ = _scan("".join(inner), 0, inside=False)
            return i + 1, segments
        else:
            inner.append(c)
            i += 1
    raise _Unparseable("a backtick is never closed")


def _past_matching(text: str, i: int, opening: str, closing: str, what: str) -> int:
    """Index just past the ``closing`` that balances the ``opening`` at or after ``i``."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == opening:
            depth += 1
        elif text[j] == closing:
            depth -= 1
            if depth == 0:
                return j + 1
    raise _Unparseable(f"a `{what}` is never closed")


def _skip_arithmetic(text: str, i: int) -> int:
    return _past_matching(text, i, "(", ")", "$((")


def _closing_brace(text: str, i: int) -> int:
    return _past_matching(text, i, "{", "}", "${")


def _words(segment: str) -> ShellCommand:
    lexer = shlex.shlex(segment, posix=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        words = list(lexer)
    except ValueError as exc:
        raise _Unparseable(str(exc)) from None
    command = ShellCommand(argv=[])
    k = 0
    while k < len(words):
        word = words[k]
        if word.startswith(_OP):
            op = word[1:]
            if command.argv[:1] == ["[["]:  # `[[ a > b ]]` compares, it does not redirect
                command.argv.append(op)
                k += 1
                continue
            if k + 1 >= len(words) or words[k + 1].startswith(_OP):
                raise _Unparseable(f"the redirection `{op}` has no target")
            command.redirects.append((op, words[k + 1]))
            k += 2
            continue
        command.argv.append(word)
        k += 1
    return command


# Shell grammar the policy reads past before it reaches the program name.

_KEYWORDS = frozenset(
    {"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "!", "{", "}", "esac"}
)
_HEADERS = frozenset({"for", "select", "case", "function"})
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\[[^\]]*\])?\+?=")
