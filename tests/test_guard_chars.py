"""``guards.chars`` against the regular expressions it replaces (issue 34: `ov guard` without ``re``).

Each function is compared with the pattern it stands for, as the guard used it before, on generated text that
mixes what the patterns care about (quotes, ``$``, brackets, digits, letters, operators) with Unicode whitespace,
digits and letters, newlines and carriage returns. The character classes themselves are checked on every code
point: ``\\s`` is ``str.isspace``, ``\\d`` is ``str.isdecimal`` and ``\\w`` is ``str.isalnum`` or ``_``.
``tests/test_guard_lexer_oracle.py`` checks the lexer and the whole guard the same way.
"""

from __future__ import annotations

import re
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overstory.agents.ledger import _exit_code
from overstory.guards import chars

# What the patterns look at, and what could fool a hand-written test: Unicode spaces (\xa0, \u2003, \x1c, \x85),
# digits (Arabic-Indic, full-width, superscript: a digit but not a decimal), letters (é, ß, Greek), \r, \v, \n.
SPECIAL = list("'\"\\$`<>&|;()#\n\r\t\x0b\x0c {}[]@*?!=+-:._/,0123456789aAzZ_xP")
UNICODE = ["\xa0", "\u2003", "\x1c", "\x85", "\u3000", "\u0663", "\uff15", "\u00b2", "\u00e9", "\u00df", "\u03a9",
           "\u0130", "\u212a", "\U0001d7d8", "\u2028", "\x00"]
WORDS = ["cd", "pushd", "popd", "for", "while", "until", "select", "do", "function", "python", "python3", "py",
         "pypy", "pypy3", "ipython", "ipython3", "pip", "pip3", "3.11", ".", "..", "IFS", "Exit code ", "a[1]",
         "x=", "+=", "${", "$((", "@P", ":-", "host:", "user@", "\\\n"]
TEXT = st.lists(st.one_of(st.sampled_from(SPECIAL), st.sampled_from(UNICODE), st.sampled_from(WORDS),
                          st.characters()), max_size=24).map("".join)
EXAMPLES = settings(max_examples=600, deadline=None)


def _end(match: re.Match[str] | None, i: int) -> int:
    return match.end() if match else i


# ---- the classes, on every code point


def test_the_unicode_classes_are_the_str_methods() -> None:
    everything = "".join(map(chr, range(sys.maxunicode + 1)))
    assert set(re.findall(r"\s", everything)) == {c for c in everything if c.isspace()}
    assert set(re.findall(r"\d", everything)) == {c for c in everything if c.isdecimal()}
    assert set(re.findall(r"\w", everything)) == {c for c in everything if c.isalnum() or c == "_"}
    # str.lstrip() takes what \s* takes (runtimes.patch_paths relies on it)
    assert {c for c in everything if not (c + "x").lstrip().startswith(c)} == set(re.findall(r"\s", everything))


# ---- runs and names (shell.py, words.py)


@EXAMPLES
@given(TEXT, st.integers(0, 30))
def test_runs_end_where_the_patterns_do(text: str, i: int) -> None:
    i = min(i, len(text))
    assert chars.run_end(text, i, frozenset("\\'\"$`<>&|;()#\n")) == _end(
        re.compile(r"[^\\'\"$`<>&|;()#\n]+").match(text, i), i)
    for stops, pattern in (('\\$`"', r'[\\$`"]'), ("\\$`", r"[\\$`]"), ("()$`", r"[()$`]")):
        found = re.compile(pattern).search(text, i)
        assert chars.run_end(text, i, frozenset(stops)) == (found.start() if found else len(text))
    assert chars.raw_run_end(text, i) == _end(re.compile(r"[^\s'\"\\$]+").match(text, i), i)
    assert chars.name_end(text, i) == _end(re.compile(r"[A-Za-z_][A-Za-z0-9_]*").match(text, i), i)


@EXAMPLES
@given(TEXT)
def test_names_and_words_answer_as_the_patterns(text: str) -> None:
    assert chars.is_name(text) == bool(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", text))
    assert chars.is_lowercase_name(text) == bool(re.fullmatch(r"[a-z_][a-z0-9_]*", text))
    assert chars.is_assignment(text) == bool(re.match(r"^[A-Za-z_][A-Za-z0-9_]*(\[[^\]]*\])?\+?=", text))
    assert chars.has_shell_word(text, ("for", "while", "until", "select", "do", "function")) == bool(
        re.search(r"(?<![\w./-])(for|while|until|select|do|function)(?![\w.-])", text))
    assert chars.has_shell_word(text, ("cd", "pushd", "popd")) == bool(
        re.search(r"(?<![\w./-])(cd|pushd|popd)(?![\w.-])", text))
    assert chars.has_name_char(text) == bool(re.search(r"[A-Za-z_]", text))
    assert chars.is_user_name(text) == bool(re.fullmatch(r"[A-Za-z0-9._-]+", text))
    assert chars.is_remote_path(text) == bool(re.match(r"^([\w.-]+@)?[\w.-]+:", text))


@EXAMPLES
@given(TEXT)
def test_numbers_and_program_names_answer_as_the_patterns(text: str) -> None:
    assert chars.is_decimal_number(text, "-") == bool(re.fullmatch(r"-?\d+", text))
    assert chars.is_decimal_number(text, "+-") == bool(re.fullmatch(r"[+-]\d+", text))
    assert chars.is_negative_number_option(text) == bool(re.match(r"^-\d+$", text))
    assert chars.is_python_program(text) == bool(re.match(r"^(python(\d+(\.\d+)?)?|py|pypy3?|ipython3?)$", text))
    assert chars.is_pip_program(text) == bool(re.match(r"^pip(\d+(\.\d+)?)?$", text))
    match = re.match(r"^Exit code (-?\d+)", text)
    try:
        expected: int | None | str = int(match.group(1)) if match else None
    except ValueError as exc:  # more digits than int() converts: both raise
        expected = str(exc)
    try:
        got: int | None | str = _exit_code(text)
    except ValueError as exc:
        got = str(exc)
    assert got == expected


@pytest.mark.parametrize("name", ["python", "python3", "python3.11", "python3\n", "py", "pypy3", "ipython", "pip",
                                  "pip3.12", "pip\n", "python\u0663", "pip\uff15.\uff11"])
def test_program_names_the_patterns_take(name: str) -> None:
    assert chars.is_python_program(name) or chars.is_pip_program(name)


@pytest.mark.parametrize("name", ["python3.", "python.3", "python3\n\n", "pythonx", "py3", "pypy2", "pip3.1.1",
                                  "python\u00b2", " python", "pip-3"])
def test_program_names_the_patterns_refuse(name: str) -> None:
    assert not chars.is_python_program(name) and not chars.is_pip_program(name)


# ---- ${...} and $'...' (words.py, expand.py)


@EXAMPLES
@given(TEXT)
def test_parameter_bodies_answer_as_the_patterns(body: str) -> None:
    assert chars.has_parameter_operator(body) == bool(re.search(r"@[A-Za-z]", body))
    subscript = re.match(r"^[A-Za-z_][A-Za-z0-9_]*\[([^\]]*)\]", body)
    assert chars.array_subscript(body) == (subscript.group(1) if subscript else None)
    assert chars.is_plain_subscript(body) == bool(re.fullmatch(r"[0-9@*]*", body))
    assert chars.is_substring_expansion(body) == bool(re.match(r"^[A-Za-z_][A-Za-z0-9_]*:[^-+=?]", body))
    assert (body[3:4] not in chars.NAME_CHARS) == (not re.match(r"[A-Za-z0-9_]", body[3:4]))
    simple = re.match(r"^([A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-])(?:(:?[-+=?])(.*))?$", body, re.DOTALL)
    assert chars.simple_parameter(body) == (simple.groups() if simple else None)
    sequence = re.fullmatch(r"(-?\d+|[A-Za-z])\.\.(-?\d+|[A-Za-z])(?:\.\.(-?\d+))?", body)
    assert chars.brace_sequence(body) == (sequence.groups() if sequence else None)


@EXAMPLES
@given(TEXT, st.integers(0, 30), st.sampled_from([2, 4, 8]))
def test_escape_digits_are_counted_as_the_patterns_count_them(text: str, i: int, width: int) -> None:
    i = min(i, len(text))
    octal = re.match(r"[0-7]{1,2}", text[i:i + 2])
    assert chars.octal_digits(text, i) == (len(octal.group()) if octal else 0)
    hexadecimal = re.match(f"[0-9A-Fa-f]{{1,{width}}}", text[i:i + width])
    assert chars.hex_digits(text, i, width) == (len(hexadecimal.group()) if hexadecimal else 0)


@pytest.mark.parametrize(("body", "expected"), [
    ("HOME", ("HOME", None, None)), ("HOME\n", ("HOME", None, None)), ("x:-a\nb", ("x", ":-", "a\nb")),
    ("?", ("?", None, None)), ("--", ("-", "-", "")), ("1", ("1", None, None)), ("12", None), ("x:y", None),
    ("#x", None), ("x\n\n", None),
])
def test_simple_parameters(body: str, expected: tuple[str, str | None, str | None] | None) -> None:
    assert chars.simple_parameter(body) == expected
