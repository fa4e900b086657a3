# A frozen copy of src/overstory/guards/shell.py at commit 511c463, before issue 34 took regular expressions out of
# the guard: the oracle tests/test_guard_lexer_oracle.py compares the lexer with. Unchanged but for this note and
# the import of words.py. Do not edit it to follow the lexer: a change of behaviour made on purpose is made here
# too, in the same commit, the same way.
# ruff: noqa
"""The quote-aware shell scanner: a command line in, simple commands out.

It knows shell syntax only (quotes, operators, redirections, heredocs, ``$(...)``,
backticks, ``<(...)``, ``${...}``, ``$((...))``), nothing about programs or who may run
them. Commands found inside substitutions come out as commands of their own, ahead of
the one that holds them. Each command also carries the operator that ended it (``&&``,
``;``, ``|`` …), which the policy needs to know where a ``cd`` is still in effect.

Everything here is linear in the length of the command: plain runs of characters are
taken with one regular expression, and nothing rescans what it has already read.
"""

from __future__ import annotations

import re

from guard_oracle.words import Word, lex_words, word_text

_SUBST = "__ov_cmdsub__"  # stands in for the output of $(...), `...`, <(...), unknown values
_OP = "\x00"  # prefix of a redirection operator word; quoting can never produce it
_REDIRECT_OPERATORS = ("&>>", "&>", ">>", ">|", ">&", "<<<", "<<-", "<<", "<>", "<&", ">", "<")
_WRITE_REDIRECTS = frozenset({">", ">>", ">|", "&>", "&>>", "<>"})
_WORD_BREAK = " \t\n;&|<>()"
_PLAIN_RUN = re.compile(r"[^\\'\"$`<>&|;()#\n]+")
_MAX_NESTING = 40  # $( inside $( inside ...: deeper than any real command

#: The operator after a command when it ends a list: what ran before may have failed.
LIST_ENDS = frozenset({"", ";", "\n", "&", ";;", ";&", ";;&"})


class _Unparseable(Exception):
    """Internal: the command line is not something we can split safely."""


class ShellCommand:
    """One simple command: its words, its redirections ``(operator, target)``, and the
    operator that ended it (``&&``, ``||``, ``|``, ``;``, newline, ``(``, ``)``, ``sub``
    for a command inside a substitution, or empty at the end)."""

    __slots__ = ("argv", "redirects", "sep")

    def __init__(self, argv: list[str], redirects: list[tuple[str, str]] | None = None,
                 sep: str = "") -> None:
        self.argv = argv
        self.redirects = redirects if redirects is not None else []
        self.sep = sep

    def __repr__(self) -> str:
        return f"ShellCommand({self.argv!r}, {self.redirects!r}, {self.sep!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ShellCommand) and (self.argv, self.redirects, self.sep) == (
            other.argv, other.redirects, other.sep)


class _Command:
    """What the policy walks: words still to be expanded (``Word``) or plain strings."""

    __slots__ = ("redirects", "sep", "words")

    def __init__(self, words: list[str | Word], redirects: list[tuple[str, str | Word]],
                 sep: str) -> None:
        self.words = words
        self.redirects = redirects
        self.sep = sep

    def __repr__(self) -> str:
        return f"_Command({self.words!r}, {self.redirects!r}, {self.sep!r})"


class Scan:
    """A parsed command line: its simple commands and the constructs the policy needs to see."""

    __slots__ = ("commands", "forms")

    def __init__(self, commands: list[_Command], forms: set[str]) -> None:
        self.commands = commands
        self.forms = forms


def split_shell(script: str) -> list[ShellCommand]:
    """Every simple command in ``script``, including those inside substitutions.

    Raises ValueError when the script cannot be split (unclosed quote, ``$(`` …).
    """
    try:
        scan = parse(script)
    except _Unparseable as exc:
        raise ValueError(str(exc)) from None
    return [
        ShellCommand([word_text(w) for w in c.words],
                     [(op, word_text(t)) for op, t in c.redirects], c.sep)
        for c in scan.commands
    ]


def parse(script: str) -> Scan:
    forms: set[str] = set()
    segments, _ = _scan(script, 0, inside=False, depth=0, forms=forms)
    return Scan([_command(text, sep, forms) for text, sep in segments], forms)


def _scan(
    text: str, i: int, *, inside: bool, depth: int, forms: set[str]
) -> tuple[list[tuple[str, str]], int]:
    """Split ``text`` from ``i`` into ``(segment, operator after it)`` pairs.

    With ``inside`` we are in ``$(``/``<(``: stop after the matching ``)``. Commands found
    in substitutions are appended before the command that contains them.
    """
    if depth > _MAX_NESTING:
        raise _Unparseable(f"substitutions nest more than {_MAX_NESTING} deep")
    segments: list[tuple[str, str]] = []
    buf: list[str] = []
    heredocs: list[tuple[str, bool, bool]] = []
    parens = 0
    n = len(text)
    in_case_pattern = False  # after `case … in` or `;;`: `|` joins patterns, `)` ends them
    buf_is_case = False

    def flush(sep: str) -> None:
        nonlocal in_case_pattern, buf_is_case
        segment = "".join(buf).strip()
        if segment:
            segments.append((segment, sep))
            in_case_pattern = segment.split(None, 1)[0] == "case"
        buf.clear()
        buf_is_case = False

    def inner(found: list[tuple[str, str]]) -> None:
        segments.extend(found)

    while i < n:
        run = _PLAIN_RUN.match(text, i)
        if run:
            buf.append(run.group())
            i = run.end()
            continue
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
            i, word = _double_quoted(text, i + 1, depth, forms, inner)
            buf.append(f'"{word}"')
        elif c == "$" and nxt == "'":  # ANSI-C quoting: the lexer decodes it, we skip it whole
            end = _ansi_c_end(text, i + 2)
            buf.append(text[i:end])
            i = end
        elif c == "$" and nxt == "(":
            if text.startswith("$((", i):
                i = _arithmetic(text, i + 3, depth, forms, inner)
                buf.append("0")
            else:
                found, i = _scan(text, i + 2, inside=True, depth=depth + 1, forms=forms)
                inner(_mark_inner(found))
                buf.append(_SUBST)
        elif c == "$" and nxt == "{":
            i, body = _parameter(text, i + 2, depth, forms, inner)
            buf.append("${" + body + "}")
        elif c == "$":
            buf.append(c)
            i += 1
        elif c in "<>" and nxt == "(":
            found, i = _scan(text, i + 2, inside=True, depth=depth + 1, forms=forms)
            inner(_mark_inner(found))
            buf.append(_SUBST)
        elif c == "`":
            i, found = _backticks(text, i + 1, depth, forms)
            inner(_mark_inner(found))
            buf.append(_SUBST)
        elif c == "#" and (not buf or buf[-1][-1:] in (" ", "\t")):
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif c == "\n":
            flush("\n")
            i = _heredoc_bodies(text, i + 1, heredocs, depth, forms, inner)
            heredocs.clear()
        elif c in "<>" or (c == "&" and nxt == ">"):
            i = _redirection(text, i, buf, heredocs)
        elif c == "|" and nxt != "|" and (in_case_pattern or buf_is_case or _starts_case(buf)):
            buf_is_case = True
            buf.append(" ")  # `a|b)` inside a case: one pattern, not a pipe
            i += 1
        elif c in ";&|":
            start = i
            while i < n and text[i] in ";&|":
                i += 1
            op = text[start:i]
            flush(op)
            if op in (";;", ";&", ";;&"):
                in_case_pattern = True
        elif c == "(":
            if buf and "".join(buf).strip():
                forms.add("function")  # `name()`: a function definition (or an array)
            flush("(")
            parens += 1
            i += 1
        else:  # c == ")"
            i += 1
            if inside and parens == 0:
                flush(")")
                return segments, i
            if parens == 0:
                buf.clear()  # an unbalanced `)` ends a `case` pattern: the words are not a command
                in_case_pattern = False
            else:
                flush(")")
                parens -= 1
    if inside:
        raise _Unparseable("a `$(` or `<(` is never closed")
    if parens:
        raise _Unparseable("a `(` is never closed")
    flush("")
    return segments, i


def _mark_inner(found: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Commands of a substitution run in a subshell: the last one ends with ``sub``."""
    if found:
        found[-1] = (found[-1][0], "sub")
    return found


def _starts_case(buf: list[str]) -> bool:
    """Does the buffered segment start with the word ``case``? Reads only its first words."""
    head = ""
    for piece in buf:
        head += piece
        stripped = head.lstrip()
        if len(stripped) >= 5 or (stripped and len(head) > 64 and not stripped):
            break
    return head.lstrip().startswith("case ")


def _redirection(text: str, i: int, buf: list[str], heredocs: list[tuple[str, bool, bool]]) -> int:
    """Turn the redirection at ``i`` into its own marked word; return the next index."""
    op = next(o for o in _REDIRECT_OPERATORS if text.startswith(o, i))
    # A file-descriptor number written right before the operator (``2>``) belongs to it.
    if buf:
        last = buf[-1]
        stripped = last.rstrip("0123456789")
        if stripped != last:
            before = stripped[-1:] if stripped else (buf[-2][-1:] if len(buf) > 1 else "")
            if before in ("", " ", "\t"):
                buf[-1] = stripped
    i += len(op)
    if op in ("<<", "<<-"):
        i, delimiter, expand = _heredoc_word(text, i)
        heredocs.append((delimiter, op == "<<-", expand))
        quoted = "'" + delimiter.replace("'", "'\"'\"'") + "'"
        buf.append(f" {_OP}{op} {quoted} ")
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


def _heredoc_bodies(text, i, heredocs, depth, forms, inner) -> int:  # type: ignore[no-untyped-def]
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
            _expanding_text(text[start:body_end], 0, None, depth, forms, inner)
    return i


def _double_quoted(text, i, depth, forms, inner) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    """From just after a ``"`` to just after its closing quote; substitutions replaced."""
    return _expanding_text(text, i, '"', depth, forms, inner)


def _expanding_text(text, i, closing, depth, forms, inner) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    """Text where ``$(...)``, backticks, ``${...}`` and ``$((...))`` expand but nothing
    else is special (inside double quotes, or an unquoted heredoc body)."""
    out: list[str] = []
    n = len(text)
    stop = re.compile(r'[\\$`"]' if closing else r"[\\$`]")
    while i < n:
        found = stop.search(text, i)
        if found is None:
            out.append(text[i:])
            i = n
            break
        j = found.start()
        out.append(text[i:j])
        i = j
        c = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        if c == "\\":
            out.append(text[i : i + 2])
            i += 2
        elif c == '"':
            return i + 1, "".join(out)
        elif c == "$" and nxt == "(":
            if text.startswith("$((", i):
                i = _arithmetic(text, i + 3, depth, forms, inner)
                out.append("0")
            else:
                found_cmds, i = _scan(text, i + 2, inside=True, depth=depth + 1, forms=forms)
                inner(_mark_inner(found_cmds))
                out.append(_SUBST)
        elif c == "$" and nxt == "{":
            i, body = _parameter(text, i + 2, depth, forms, inner, quoted=True)
            out.append("${" + body + "}")
        elif c == "`":
            i, found_cmds = _backticks(text, i + 1, depth, forms)
            inner(_mark_inner(found_cmds))
            out.append(_SUBST)
        else:
            out.append(c)
            i += 1
    if closing:
        raise _Unparseable("a double quote is never closed")
    return i, "".join(out)


def _parameter(text, i, depth, forms, inner, *, quoted=False) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    """``${...}`` from just after ``${``: its body with substitutions replaced, and the
    index after the closing brace. Substitutions inside (``${x:-$(cmd)}``) are commands."""
    if depth > _MAX_NESTING:
        raise _Unparseable(f"substitutions nest more than {_MAX_NESTING} deep")
    out: list[str] = []
    n = len(text)
    braces = 1
    while i < n:
        c = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        if c == "\\":
            out.append(text[i : i + 2])
            i += 2
        elif c == "}":
            braces -= 1
            if braces == 0:
                return i + 1, "".join(out)
            out.append(c)
            i += 1
        elif c == "{":
            braces += 1
            out.append(c)
            i += 1
        elif c == "'" and not quoted:
            end = text.find("'", i + 1)
            if end < 0:
                raise _Unparseable("a single quote is never closed")
            out.append(text[i : end + 1])
            i = end + 1
        elif c == '"':
            i, body = _double_quoted(text, i + 1, depth + 1, forms, inner)
            out.append(f'"{body}"')
        elif c == "$" and nxt == "(":
            if text.startswith("$((", i):
                i = _arithmetic(text, i + 3, depth + 1, forms, inner)
                out.append("0")
            else:
                found, i = _scan(text, i + 2, inside=True, depth=depth + 1, forms=forms)
                inner(_mark_inner(found))
                out.append(_SUBST)
        elif c == "$" and nxt == "{":
            i, body = _parameter(text, i + 2, depth + 1, forms, inner, quoted=quoted)
            out.append("${" + body + "}")
        elif c == "`":
            i, found = _backticks(text, i + 1, depth, forms)
            inner(_mark_inner(found))
            out.append(_SUBST)
        else:
            out.append(c)
            i += 1
    raise _Unparseable("a `${` is never closed")


_ARITH_STOP = re.compile(r"[()$`]")


def _arithmetic(text, i, depth, forms, inner) -> int:  # type: ignore[no-untyped-def]
    """Skip ``$((...))`` from just after ``$((``; its substitutions are still commands.

    Arithmetic that names variables is noted: bash evaluates a variable's value as an
    expression, and ``a[$(cmd)]`` in that value runs ``cmd``.
    """
    parens = 2
    n = len(text)
    start = i
    while i < n:
        found = _ARITH_STOP.search(text, i)
        if found is None:
            break
        i = found.start()
        c = text[i]
        if c == "(":
            parens += 1
            i += 1
        elif c == ")":
            parens -= 1
            i += 1
            if parens == 0:
                if re.search(r"[A-Za-z_]", text[start:i]):
                    forms.add("arith-var")
                return i
        elif c == "$" and text.startswith("$(", i) and not text.startswith("$((", i):
            found_cmds, i = _scan(text, i + 2, inside=True, depth=depth + 1, forms=forms)
            inner(_mark_inner(found_cmds))
        elif c == "`":
            i, found_cmds = _backticks(text, i + 1, depth, forms)
            inner(_mark_inner(found_cmds))
        else:
            i += 1
    raise _Unparseable("a `$((` is never closed")


def _backticks(text: str, i: int, depth: int, forms: set[str]) -> tuple[int, list[tuple[str, str]]]:
    inner: list[str] = []
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n and text[i + 1] in "`$\\":
            inner.append(text[i + 1])
            i += 2
        elif c == "`":
            segments, _ = _scan("".join(inner), 0, inside=False, depth=depth + 1, forms=forms)
            return i + 1, segments
        else:
            inner.append(c)
            i += 1
    raise _Unparseable("a backtick is never closed")


def _ansi_c_end(text: str, i: int) -> int:
    """Index after the closing quote of ``$'...'`` (``i`` is just after the opening one)."""
    n = len(text)
    while i < n:
        if text[i] == "\\":
            i += 2
        elif text[i] == "'":
            return i + 1
        else:
            i += 1
    raise _Unparseable("a `$'` quote is never closed")


def _command(segment: str, sep: str, forms: set[str]) -> _Command:
    try:
        words = lex_words(segment, forms)
    except ValueError as exc:
        raise _Unparseable(str(exc)) from None
    command = _Command([], [], sep)
    k = 0
    while k < len(words):
        word = words[k]
        if isinstance(word, str) and word.startswith(_OP):
            op = word[1:]
            if command.words[:1] == ["[["]:  # `[[ a > b ]]` compares, it does not redirect
                command.words.append(op)
                k += 1
                continue
            target = words[k + 1] if k + 1 < len(words) else None
            if target is None or (isinstance(target, str) and target.startswith(_OP)):
                raise _Unparseable(f"the redirection `{op}` has no target")
            command.redirects.append((op, target))
            k += 2
            continue
        command.words.append(word)
        k += 1
    return command


# Shell grammar the policy reads past before it reaches the program name.

_KEYWORDS = frozenset(
    {"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "!", "{", "}", "esac"}
)
_HEADERS = frozenset({"for", "select", "case", "function"})
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\[[^\]]*\])?\+?=")
