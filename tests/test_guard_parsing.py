"""The guard's shell model: word expansion, sed scripts, the working directory against real
bash, and parsing time that grows linearly with the command (issue 12 §4)."""

from __future__ import annotations

import random
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from overstory import guards
from overstory.guards.expand import expand_word
from overstory.guards.shell import parse
from overstory.guards.textproc import _awk_writes, sed_script
from overstory.guards.walk import MAX_COMMAND_BYTES, _Walk, check_shell
from overstory.guards.words import TooManyWords, lex_words

UNKNOWN = "__ov_cmdsub__"


def _builder(tmp_path: Path) -> guards._Agent:
    root = tmp_path / "proj"
    worktree = root / ".overstory" / "worktrees" / "b"
    worktree.mkdir(parents=True)
    return guards._Agent.from_env("b", {"OVERSTORY_AGENT_NAME": "b", "OVERSTORY_CAPABILITY": "builder",
                                        "OVERSTORY_WORKTREE": str(worktree),
                                        "OVERSTORY_PROJECT_ROOT": str(root), "HOME": "/root"})


# --------------------------------------------------------------------------- words


def _expand(text: str, variables: dict[str, str] | None = None) -> list[list[str]]:
    forms: set[str] = set()
    values = variables or {}
    return [expand_word(w, values.get, forms) for w in lex_words(text, forms)]


@pytest.mark.parametrize(("text", "expected"), [
    ("touch {/main/x,y}", [["touch"], ["/main/x", "y"]]),
    ("src/{a,b/{c,d}}", [["src/a", "src/b/c", "src/b/d"]]),
    ("x{1..3} {a..c} {03..1..2}", [["x1", "x2", "x3"], ["a", "b", "c"], ["03", "01"]]),
    ("'{a,b}' \"{a,b}\" \\{a,b} {} {a} a{,b}", [["{a,b}"], ["{a,b}"], ["{a,b}"], ["{}"], ["{a}"],
                                                ["a", "ab"]]),
    ("x' '{a,b}", [["x a", "x b"]]),
    ("{a{b,c}d}", [["{abd}", "{acd}"]]),
    ("$'\\x2fetc' $'a\\tb\\101\\u00e9' $\"q\"", [["/etc"], ["a\tbA\u00e9"], ["q"]]),
    ("'$HOME' \"$HOME\" $HOME/x ~/y ~root/z \"~\"w", [["$HOME"], ["/h"], ["/h/x"], ["/h/y"],
                                                      ["/root/z"], ["~w"]]),
    ("$SPLIT \"$SPLIT\" a$SPLIT", [["one", "two"], ["one two"], ["aone", "two"]]),
    ("${NOPE:-/d} ${HOME:-/d} ${NOPE:+x} ${HOME:+x} $NOPE ${#HOME}",
     [["/d"], ["/h"], ["x"], ["x"], [UNKNOWN], [UNKNOWN]]),
])
def test_words_expand_as_bash_does(text: str, expected: list[list[str]]) -> None:
    assert _expand(text, {"HOME": "/h", "SPLIT": "one two"}) == expected


def test_brace_expansion_has_a_ceiling() -> None:
    forms: set[str] = set()
    [word] = lex_words("{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}", forms)
    with pytest.raises(TooManyWords):
        expand_word(word, {}.get, forms)


def test_forms_the_policy_refuses_are_noted() -> None:
    forms: set[str] = set()
    lex_words("a $'b' ${IFS} ${!x} ${x@P} \"$IFS\"", forms)
    assert {"ansi-c", "ifs-unquoted", "ifs", "indirect", "prompt"} <= forms


def test_commands_carry_the_operator_that_ends_them() -> None:
    seps = [(c.argv[0], c.sep) for c in guards.split_shell("a && b || c; d | e & f\ng; (h) $(i)")]
    assert seps == [("a", "&&"), ("b", "||"), ("c", ";"), ("d", "|"), ("e", "&"), ("f", "\n"),
                    ("g", ";"), ("h", ")"), ("i", "sub"), (UNKNOWN, "")]


# --------------------------------------------------------------------------- sed and awk


@pytest.mark.parametrize(("script", "known", "writes"), [
    ("s/a/b/g;/^#/d;$p", True, []),
    ("1w/tmp/x", True, ["/tmp/x"]),
    ("/x/I w out", True, ["out"]),
    ("0~3 W out2", True, ["out2"]),
    ("s|a|b|w file", True, ["file"]),
    ("\\%x%,+3{p;w f\n}", True, ["f"]),
    ("y/abc/xyz/;a text;i\\\nmore", True, []),
    ("1e touch x", False, []),
    ("s/a/b/e", False, []),
    ("s/a/b", False, []),
    ("1Z", False, []),
])
def test_sed_scripts_are_parsed_command_by_command(script: str, known: bool, writes: list[str]) -> None:
    assert sed_script(script) == (known, writes)


@pytest.mark.parametrize(("program", "writes"), [
    ("{print $1}", False),
    ("/a|b/ {print \"x|y\"}", False),
    ("$3 > 100 {print $1}", False),
    ("{print > \"out\"}", True),
    ("{print $1 | \"sh\"}", True),
    ("BEGIN{system(\"id\")}", True),
    ("BEGIN{f=\"system\"; @f(\"id\")}", True),
])
def test_awk_programs_that_write_or_run_are_seen(program: str, writes: bool) -> None:
    assert _awk_writes(program) is writes


# --------------------------------------------------------------------------- cd against bash

_STEPS = ["cd b", "cd ..", "cd /nonexistent-ov-dir", "(cd b)", "false && cd b", "true || cd b",
          "cd b || true", "cd b && cd c", "! cd b", "cd b | true", "{ cd b; }", "cd b/c/..",
          "echo $(cd b) >/dev/null", "if cd b; then true; fi", "pushd b >/dev/null",
          "cd link", "cd link/..", "cd -", "true"]
_JOINS = ["; ", " && ", " || ", "\n"]


def test_the_working_directory_model_contains_what_bash_does(tmp_path: Path) -> None:
    """Random cd sequences run by real bash: the directory bash ends in is always one of the
    guard's candidates (or the guard says it does not know)."""
    base = (tmp_path / "base").resolve()
    (base / "a" / "b" / "c").mkdir(parents=True)
    (base / "a" / "b" / "b" / "c").mkdir(parents=True)
    (base / "elsewhere" / "deep").mkdir(parents=True)
    (base / "a" / "link").symlink_to(base / "elsewhere" / "deep")
    (base / "a" / "b" / "link").symlink_to(base / "elsewhere" / "deep")
    start = base / "a"
    agent = _builder(tmp_path)
    rng = random.Random(12)
    out = tmp_path / "pwd.txt"
    for _ in range(250):
        steps = [rng.choice(_STEPS) for _ in range(rng.randint(1, 5))]
        script = "".join(step + rng.choice(_JOINS) for step in steps)
        script = script.rstrip("&| \n;") + f"; pwd -P > {out}"
        out.write_text("")
        subprocess.run(["bash", "-c", script], cwd=start, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
                       env={"PATH": "/usr/bin:/bin", "HOME": str(base)}, timeout=30)
        real = out.read_text().strip()
        if not real:
            continue  # an `||`/`&&` at the end skipped the pwd
        walk = _Walk(agent, str(start), 0, parse(script), script)
        walk.run()
        assert real in walk.current or None in walk.current, (script, real, walk.current)


# --------------------------------------------------------------------------- size and time


def _cpu_seconds(check: Callable[[], object], repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        check()
        best = min(best, time.process_time() - started)
    return best


_ADVERSARIAL: dict[str, Callable[[int], str]] = {
    "many commands": lambda n: "ls x; " * (n // 6),
    "pipes in a case": lambda n: "case x in " + "a|" * (n // 2) + "b) ls;; esac",
    "many redirections": lambda n: "echo " + "2>/dev/null " * (n // 12),
    "many heredocs": lambda n: "cat " + "<<E " * (n // 4) + "\n" + "E\n" * (n // 4),
    "find roots and -exec": lambda n: "find " + "a " * (n // 4) + "-exec ls {} \\; " * (n // 32),
    "many targets": lambda n: "touch " + "ab " * (n // 3),
    "cd chain": lambda n: "cd a && " * (n // 8) + "touch x",
    "cd sequence": lambda n: "cd a; " * (n // 6) + "touch x",
    "substitutions": lambda n: "echo " + "$(ls) " * (n // 6),
    "parameters": lambda n: "echo " + "${HOME:-x} " * (n // 11),
    "unmatched braces": lambda n: "echo " + "{" * (n // 2) + "a,b",
    "chmod modes": lambda n: "chmod " + "u+" * (n // 2) + "! x",
    "awk prints": lambda n: "awk '" + "print " * (n // 6) + "'",
    "sed commands": lambda n: "sed -n '" + "p;" * (n // 2) + "' f",
    "globs": lambda n: "rm -f " + "b*/../x " * (n // 8),
    "and-or lists": lambda n: "true && false || " * (n // 17) + "ls",
}


@pytest.mark.parametrize("form", sorted(_ADVERSARIAL))
def test_checking_time_grows_linearly(form: str, tmp_path: Path) -> None:
    """4x the text must cost about 4x the time, not 16x (a quadratic part). CPU time of this
    process, best of three, with a 5 ms floor so tiny timings do not make noisy ratios."""
    agent = _builder(tmp_path)
    cwd = agent.worktree
    make = _ADVERSARIAL[form]
    small = _cpu_seconds(lambda: check_shell(make(10_000), agent, cwd))
    large = _cpu_seconds(lambda: check_shell(make(40_000), agent, cwd))
    # linear is 4x and quadratic 16x; 12 leaves room for a collection pause (11x seen once on a loaded CI run)
    assert (large + 0.005) / (small + 0.005) < 12, f"{form}: {small:.4f}s -> {large:.4f}s"


def test_a_60_kb_command_is_checked_well_under_a_second(tmp_path: Path) -> None:
    agent = _builder(tmp_path)
    mixed = "".join(make(4_000) + "\n" for make in _ADVERSARIAL.values())[: 60 * 1024]
    assert _cpu_seconds(lambda: check_shell(mixed, agent, agent.worktree), repeat=1) < 2


def test_commands_over_64_kb_are_refused_before_parsing(tmp_path: Path) -> None:
    agent = _builder(tmp_path)
    huge = "echo '" + "é" * (MAX_COMMAND_BYTES // 2) + "'"  # under 64 K characters, over 64 KB
    reason = check_shell(huge, agent, agent.worktree)
    assert reason is not None and "64 KB" in reason
    assert check_shell("echo '" + "x" * 60_000 + "'", agent, agent.worktree) is None


# --------------------------------------------------------------------------- the hot path


def test_the_lazy_handler_table_matches_the_modules() -> None:
    import importlib

    from overstory.guards import programs

    for module, names in programs._FAMILIES.items():
        table = importlib.import_module(f"overstory.guards.{module}").HANDLERS
        assert sorted(names.split()) == sorted(table), module


def test_an_ordinary_call_loads_only_the_guard_modules_it_needs(tmp_path: Path) -> None:
    """`ov guard` runs once per tool call: a builder's `python -m pytest … && git status`
    must not compile the option tables, the expansion code or unrelated handlers."""
    import json
    import os
    import sys

    root = tmp_path / "proj"
    worktree = root / ".overstory" / "worktrees" / "b"
    worktree.mkdir(parents=True)
    code = f"""
import json, sys
from overstory import guards
payload = {{"hook_event_name": "PreToolUse", "tool_name": "Bash", "cwd": {str(worktree)!r},
           "tool_input": {{"command": "python -m pytest -q tests/test_parser.py && git status --short"}}}}
env = {{"OVERSTORY_AGENT_NAME": "b", "OVERSTORY_CAPABILITY": "builder",
       "OVERSTORY_WORKTREE": {str(worktree)!r}, "OVERSTORY_PROJECT_ROOT": {str(root)!r}}}
assert guards.decide(payload, env).allow
print(json.dumps(sorted(m for m in sys.modules if m.startswith("overstory.guards."))))
"""
    env = dict(os.environ)
    src = str(Path(guards.__file__).resolve().parent.parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=60, check=True)
    loaded = {m.rsplit(".", 1)[1] for m in json.loads(done.stdout)}
    assert loaded.isdisjoint({"testopts", "expand", "toolchains", "filetools", "textproc",
                              "wrappers", "builtins", "ov"}), loaded
    assert {"walk", "shell", "words", "python", "git"} <= loaded
