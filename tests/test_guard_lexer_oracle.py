"""The guard without regular expressions answers as the guard with them did (issue 34): differential tests.

`ov guard` decides what an agent may run, so the hand-written scanning that replaced its patterns
(``guards.chars``) is held to the code it replaced, on generated shell text (quotes, escapes, heredocs,
``$(...)``, backticks, ``${...}``, arithmetic, operators, redirections, Unicode spaces, digits and letters):

- the lexer (``shell.parse``, ``words.lex_words``) against a frozen copy of the regex-based lexer
  (``tests/guard_oracle``): the same commands, words, redirections, operators and noted forms, or the same error;
- ``runtimes.patch_paths`` against its frozen regex-first version;
- the whole guard (``check_shell`` for a writer and a read-only agent, the ledger's class, the pattern subjects)
  with ``guards.chars`` as it is, and with every ``chars`` function swapped for the regular expression it stands
  for (``ORACLE``): the same verdicts and reasons.
"""

from __future__ import annotations

import re
import sys
import typing as t
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guard_oracle import patch as old_patch
from guard_oracle import shell as old_shell
from guard_oracle import words as old_words
from overstory import guards
from overstory.guards import chars, classify, patterns, programs, runtimes, shell, words
from overstory.guards.walk import check_shell

TOKENS = [
    "ls", "cat", "echo", "x", "y", "-la", "/tmp/f", "f.txt", "~/f", "~root/f", "~+", "~1", "$HOME", "${HOME}",
    "${x:-d}", "${x:=/etc}", "${x:+y}", "${x:1}", "${x:a}", "${a[i]}", "${a[1]}", "${!x}", "${x@P}", "${x@Q}",
    "${IFS}", "${IFSX}", "$IFS", "$((1+x))", "$((2))", "$[1+2]", "$(ls)", "$(cd /; ls)", "`ls`", "`echo \\`x\\``",
    "<(ls)", ">(cat)", "'q q'", "'", '"', '"d $x $(id) `id` \\" \\$"', "$'\\x41\\101\\u00e9\\cA\\'\\q'", '$"t"',
    "\\", "\\\n", " ", "  ", "\t", "\n", ";", ";;", "&&", "||", "|", "&", "(", ")", "{", "}", "{a,b}", "{1..3}",
    "{a..c..2}", "{,x}", ">", ">>", ">|", "&>", "2>&1", ">&2", ">/dev/null", "2>err", "<in", "<>rw", "<<<w",
    "<<EOF\nbody $(id) `id`\nEOF\n", "<<'E'\nx $(id)\nE\n", "<<-T\n\tt\n\tT\n", "<<", "#c", "# c\n", "=", "x=1",
    "a[1]=2", "x+=3", "PATH=/x", "GIT_DIR=.", "OVERSTORY_AGENT_NAME=x", "CDPATH=/", "IFS=", "LANG=C",
    "cd", "cd ..", "cd /tmp", "pushd", "pushd -1", "popd", "for i in a b; do", "done", "while true; do", "until",
    "select", "function f", "f()", "case x in a|b) ls;; *) ;; esac", "if", "then", "fi", "!", "[[", "]]",
    "python3", "python3.11", "python3\u0663", "pypy3", "pip", "pip3 install x", "py -c 1", "git push", "git status",
    "git -C . log", "rm -rf", "cp a b", "cp a host:p", "scp u@h:p .", "mv x y", "nice -5", "nice -n 3", "env -i",
    "env A=1", "bash -c 'ls; cd x'", "sh -c", "eval 'cd x'", "source f", "sed -i s/a/b/", "awk '{print > \"f\"}'",
    "[[ $x -eq 1 ]]", "[[ 1 -lt -2 ]]", "chmod +x f", "chmod 755 f", "chmod -x f", "touch", "tee f", "mkdir -p d",
    "find . -exec rm {} +", "xargs rm", "ov mail send --to x", "curl -X POST u", "gh api -f x", "declare -n r",
    "export A=1", "read -r v", "printf -v v x", "let x=1", "unset OVERSTORY_X", "apply_patch", "\u00e9", "\u00a0",
    "\u2003", "\r", "\x0b", "\x0c", "\u0663", "\x85", "\x1c", "\u2028",
    # a final newline: a pattern's `$` matched before it
    "${HOME\n}", "${x\n:-d}", "$'python3\\n' -c 1", '"pip3\n" list', "nice $'-5\\n' rm x", "pushd $'+1\\n'",
]
SHELL_TEXT = st.one_of(
    st.lists(st.sampled_from(TOKENS), max_size=14).map("".join),
    st.lists(st.sampled_from(TOKENS), max_size=14).map(" ".join),
    st.text(alphabet=st.sampled_from(list("ab $()`'\"\\;&|<>\n#{}[]=-~/.*,:@!?+0123456789\r\t\xa0\u0663é")),
            max_size=40),
)
EXAMPLES = settings(max_examples=500, deadline=None)


# ---- the lexer against its frozen regex-based copy


def _word(word: t.Any) -> t.Any:
    return word if isinstance(word, str) else ("Word", word.parts)


def _outcome(call: t.Callable[[], t.Any], render: t.Callable[[t.Any], t.Any]) -> t.Any:
    try:
        return "ok", render(call())
    except Exception as exc:  # noqa: BLE001 - an error is an answer too: the same one, with the same message
        return "error", type(exc).__name__.replace("_Unparseable", "Unparseable"), str(exc)


def _scan(scan: t.Any) -> t.Any:
    return ([([_word(w) for w in c.words], [(op, _word(target)) for op, target in c.redirects], c.sep)
             for c in scan.commands], sorted(scan.forms))


@EXAMPLES
@given(SHELL_TEXT)
def test_the_lexer_splits_as_the_regex_lexer_did(script: str) -> None:
    assert _outcome(lambda: shell.parse(script), _scan) == _outcome(lambda: old_shell.parse(script), _scan)
    split = _outcome(lambda: shell.split_shell(script), lambda cs: [(c.argv, c.redirects, c.sep) for c in cs])
    assert split == _outcome(lambda: old_shell.split_shell(script), lambda cs: [(c.argv, c.redirects, c.sep)
                                                                                 for c in cs])


@EXAMPLES
@given(SHELL_TEXT)
def test_words_are_lexed_as_the_regex_lexer_did(segment: str) -> None:
    new_forms: set[str] = set()
    old_forms: set[str] = set()
    new = _outcome(lambda: words.lex_words(segment, new_forms), lambda ws: [_word(w) for w in ws])
    old = _outcome(lambda: old_words.lex_words(segment, old_forms), lambda ws: [_word(w) for w in ws])
    assert (new, sorted(new_forms)) == (old, sorted(old_forms))


PATCH = "*** Begin Patch\n*** Add File: a.py\n+x\n*** Update File: b/c.py \n*** End Patch"


@EXAMPLES
@given(st.sampled_from(["", " ", "\t\n", "\xa0", "\u2003 ", "x "]), st.sampled_from(["apply_patch", "applypatch",
                                                                                     "apply_patchx", "ls"]),
       st.sampled_from([" <<'EOF'\n", " <<EOF\n", " <<-\"P\"\n", " '", " ", "<<EOF\n"]),
       st.sampled_from([PATCH, "no patch", PATCH.replace("\n", "\r\n")]),
       st.sampled_from(["\nEOF\n", "\nEOF", "\nP", "'", "\n EOF \n", ""]))
def test_patch_paths_answers_as_its_regex_first_version(space: str, program: str, opening: str, body: str,
                                                       closing: str) -> None:
    command = space + program + opening + body + closing
    assert runtimes.patch_paths(command) == old_patch.patch_paths(command)


@pytest.mark.parametrize("script", [
    "ls x; cd /tmp && touch y", "for d in a b; do cd $d; done", "x=1 y[2]+=3 env", 'echo "$(ls "a b")" `id`',
    "cat <<EOF\n$(rm -rf /)\nEOF\n", "echo $((x+1)) ${x:-$(id)} ${a[$i]} ${x:1:2} $'\\x41' ~root",
    "case $x in a|b) ls;; esac", "nice -5 rm x", "python3.11 -c 1 | pip3 list", "\r\n\xa0 ls \u2003",
])
def test_examples_the_lexers_agree_on(script: str) -> None:
    assert _outcome(lambda: shell.parse(script), _scan) == _outcome(lambda: old_shell.parse(script), _scan)


# ---- the whole guard, with each chars function swapped for its regular expression


def _end(match: re.Match[str] | None, i: int) -> int:
    return match.end() if match else i


def _run_end(text: str, i: int, stops: frozenset[str] | str) -> int:
    found = re.compile("[" + "".join(re.escape(c) for c in sorted(stops)) + "]").search(text, i)
    return found.start() if found else len(text)


def _shell_word(text: str, found: tuple[str, ...]) -> bool:
    return bool(re.search(r"(?<![\w./-])(" + "|".join(found) + r")(?![\w.-])", text))


def _groups(match: re.Match[str] | None) -> tuple[t.Any, ...] | None:
    return match.groups() if match else None


def _decimal(text: str, signs: str) -> bool:
    return bool(re.fullmatch(r"-?\d+" if signs == "-" else r"[+-]\d+", text))


def _subscript(body: str) -> str | None:
    match = re.match(r"^[A-Za-z_][A-Za-z0-9_]*\[([^\]]*)\]", body)
    return match.group(1) if match else None


def _length(match: re.Match[str] | None) -> int:
    return len(match.group()) if match else 0


ORACLE: dict[str, t.Callable[..., t.Any]] = {
    "run_end": _run_end,
    "raw_run_end": lambda text, i: _end(re.compile(r"[^\s'\"\\$]+").match(text, i), i),
    "name_end": lambda text, i: _end(re.compile(r"[A-Za-z_][A-Za-z0-9_]*").match(text, i), i),
    "is_name": lambda text: bool(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", text)),
    "is_lowercase_name": lambda text: bool(re.fullmatch(r"[a-z_][a-z0-9_]*", text)),
    "is_assignment": lambda text: bool(re.match(r"^[A-Za-z_][A-Za-z0-9_]*(\[[^\]]*\])?\+?=", text)),
    "has_shell_word": _shell_word,
    "is_decimal_number": _decimal,
    "is_python_program": lambda name: bool(re.match(r"^(python(\d+(\.\d+)?)?|py|pypy3?|ipython3?)$", name)),
    "is_pip_program": lambda name: bool(re.match(r"^pip(\d+(\.\d+)?)?$", name)),
    "is_negative_number_option": lambda text: bool(re.match(r"^-\d+$", text)),
    "is_user_name": lambda text: bool(re.fullmatch(r"[A-Za-z0-9._-]+", text)),
    "octal_digits": lambda text, i: _length(re.match(r"[0-7]{1,2}", text[i:i + 2])),
    "hex_digits": lambda text, i, width: _length(re.match(f"[0-9A-Fa-f]{{1,{width}}}", text[i:i + width])),
    "has_parameter_operator": lambda body: bool(re.search(r"@[A-Za-z]", body)),
    "array_subscript": _subscript,
    "is_plain_subscript": lambda text: bool(re.fullmatch(r"[0-9@*]*", text)),
    "is_substring_expansion": lambda body: bool(re.match(r"^[A-Za-z_][A-Za-z0-9_]*:[^-+=?]", body)),
    "has_name_char": lambda text: bool(re.search(r"[A-Za-z_]", text)),
    "simple_parameter": lambda body: _groups(
        re.match(r"^([A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-])(?:(:?[-+=?])(.*))?$", body, re.DOTALL)),
    "brace_sequence": lambda text: _groups(re.fullmatch(r"(-?\d+|[A-Za-z])\.\.(-?\d+|[A-Za-z])(?:\.\.(-?\d+))?",
                                                        text)),
    "is_remote_path": lambda text: bool(re.match(r"^([\w.-]+@)?[\w.-]+:", text)),
}


def test_the_oracle_covers_every_chars_function() -> None:
    functions = {name for name, value in vars(chars).items() if callable(value) and not name.startswith("_")
                 and getattr(value, "__module__", "") == chars.__name__}
    assert functions - {"leading"} == set(ORACLE)  # leading: only through octal_digits and hex_digits


def _load_every_guard_module() -> None:
    import overstory.guards.expand  # noqa: F401 - loaded on a word that needs it
    import overstory.guards.ov  # noqa: F401

    for module in programs._FAMILIES:
        __import__(f"overstory.guards.{module}")


@contextmanager
def _regular_expressions() -> t.Iterator[None]:
    """Every ``chars`` function, wherever a guard module imported it, replaced by its regular expression."""
    _load_every_guard_module()
    originals = {attribute: getattr(chars, attribute) for attribute in ORACLE}
    swapped: list[tuple[t.Any, str, t.Any]] = []
    for name, module in list(sys.modules.items()):
        if not name.startswith("overstory.guards"):
            continue
        for attribute, oracle in ORACLE.items():
            if getattr(module, attribute, None) is originals[attribute]:
                swapped.append((module, attribute, getattr(module, attribute)))
                setattr(module, attribute, oracle)
    try:
        yield
    finally:
        for module, attribute, original in swapped:
            setattr(module, attribute, original)


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> dict[str, t.Any]:
    root = tmp_path_factory.mktemp("oracle") / "proj"
    worktree = root / ".overstory" / "worktrees" / "b"
    (worktree / "d").mkdir(parents=True)
    (worktree / "f.txt").write_text("x")
    env = {"OVERSTORY_PROJECT_ROOT": str(root), "OVERSTORY_WORKTREE": str(worktree), "HOME": "/root"}
    return {"cwd": str(worktree), **{
        capability: guards._Agent.from_env(f"{capability}-1", {**env, "OVERSTORY_AGENT_NAME": f"{capability}-1",
                                                                "OVERSTORY_CAPABILITY": capability})
        for capability in ("builder", "reviewer")}}


def _verdicts(script: str, agents: dict[str, t.Any]) -> t.Any:
    return (
        _outcome(lambda: check_shell(script, agents["builder"], agents["cwd"]), repr),
        _outcome(lambda: check_shell(script, agents["reviewer"], agents["cwd"]), repr),
        _outcome(lambda: check_shell(script, agents["builder"], None), repr),
        _outcome(lambda: classify.classify("Bash", {"command": script}), repr),
        _outcome(lambda: patterns.shell_subjects(script), repr),
    )


@EXAMPLES
@given(SHELL_TEXT)
def test_the_guard_decides_as_with_regular_expressions(agents: dict[str, t.Any], script: str) -> None:
    without = _verdicts(script, agents)
    with _regular_expressions():
        assert _verdicts(script, agents) == without


def test_the_swap_reaches_the_guard(agents: dict[str, t.Any]) -> None:
    """Control: inside ``_regular_expressions`` the guard really calls the patterns."""
    calls: list[str] = []
    with _regular_expressions():
        original = shell.run_end
        shell.run_end = lambda *args: calls.append("run_end") or original(*args)  # type: ignore[attr-defined]
        try:
            check_shell("ls x", agents["builder"], agents["cwd"])
        finally:
            shell.run_end = original  # type: ignore[attr-defined]
        assert original is ORACLE["run_end"]
    assert calls and shell.run_end is chars.run_end  # type: ignore[attr-defined]


def test_the_oracle_copies_are_the_ones_the_guard_replaced() -> None:
    """The frozen copies still hold the patterns (a copy edited to follow the guard would prove nothing)."""
    here = Path(old_shell.__file__).parent
    assert "_PLAIN_RUN = re.compile(" in (here / "shell.py").read_text()
    assert "_RAW_RUN = re.compile(" in (here / "words.py").read_text()
    assert "_HEREDOC = re.compile(" in (here / "patch.py").read_text()
