"""Walking a shell command line: expansion, the working directory, variables, the checks.

``check_shell`` parses a command line (``shell``), then walks its simple commands in
order. For each it expands the words as bash would (``words``) with the variables known
at that point, refuses assignments and shell forms it does not model, and describes the
program with its handler (``programs``) before judging the effect for this agent.

The working directory is a set of candidates, because a ``cd`` may or may not have
taken effect: ``cd x && y`` runs ``y`` in ``x``, but after ``cd x; …``, ``(cd x)``,
``a || cd x`` or ``false && cd x`` the shell is in ``x`` or where it was before. A write
is judged from every candidate. A ``cd`` ov cannot follow (a computed directory,
``cd -``, ``CDPATH``, a ``cd`` in a loop or function) makes the directory unknown:
relative write targets are then refused for writers, and read-only agents may only run
plain readers. Interpreter code (``python3 -c``, scripts) stays allowed for writers by
design: its writes cannot be seen from here, and the kernel sandbox is what stops them.
"""

from __future__ import annotations

import os

from overstory.guards.agent import _NULL_SINKS, _Agent, _inside
from overstory.guards.chars import has_shell_word, is_assignment, is_decimal_number, is_lowercase_name, is_name
from overstory.guards.effects import _Effect, _names, _parse_options, _ShellState
from overstory.guards.programs import _PLAIN_READERS, _analyze
from overstory.guards.shell import (
    _HEADERS,
    _KEYWORDS,
    _SUBST,
    _WRITE_REDIRECTS,
    LIST_ENDS,
    Scan,
    _Command,
    _Unparseable,
    parse,
)
from overstory.guards.words import TooManyWords, Word, word_text

TYPE_CHECKING = False  # typing and collections.abc cost `ov guard` milliseconds
if TYPE_CHECKING:
    from collections.abc import Mapping

_MAX_DEPTH = 8
MAX_COMMAND_BYTES = 64 * 1024
_MAX_CANDIDATES = 6
# Searched for as words of their own (``chars.has_shell_word``).
_LOOP_WORDS = ("for", "while", "until", "select", "do", "function")
_CD_WORDS = ("cd", "pushd", "popd")

#: Shell forms refused for everyone, and the extra ones refused for read-only agents.
_EVERYONE_FORMS = {
    "prompt": "`${name@P}` (prompt expansion runs command substitutions hidden in a value)",
    "ifs-unquoted": "an unquoted `$IFS` (it splits words in ways ov does not follow)",
    "tilde-dir": "`~+`, `~-` and `~N` directory-stack paths",
}
_READ_ONLY_FORMS = {
    "ansi-c": "ANSI-C quoting (`$'...'`)",
    "brace": "brace expansion (`{a,b}`)",
    "tilde-user": "`~user` paths",
    "ifs": "`$IFS`",
    "indirect": "indirect expansion (`${!name}`)",
    "param-op": "`${name@op}` expansions",
    "arith-var": "arithmetic on variables (bash evaluates a variable's value as code there)",
}

#: Variables read-only agents may set: none of them changes what a program runs or writes.
_SAFE_VARS = frozenset({
    "LANG", "LANGUAGE", "TZ", "TERM", "COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "CLICOLOR",
    "CLICOLOR_FORCE", "COLORTERM", "CI", "PY_COLORS", "PYTHONDONTWRITEBYTECODE",
    "PYTHONUNBUFFERED", "PYTHONHASHSEED", "PYTHONIOENCODING", "PYTHONUTF8", "PYTHONWARNINGS",
    "REPLY", "OPTIND", "OPTARG",
})
#: GIT_* settings with values that cannot make git read, write or run anything else.
_HARMLESS_GIT = {"GIT_PAGER": {"cat", ""}, "GIT_EDITOR": {"true", ":"},
                 "GIT_SEQUENCE_EDITOR": {"true", ":"}, "GIT_MERGE_AUTOEDIT": {"no"},
                 "GIT_TERMINAL_PROMPT": {"0"}, "GIT_OPTIONAL_LOCKS": {"0"}}
_DECLARERS = frozenset({"export", "declare", "typeset", "local", "readonly"})
_CHECKS_COMPUTED_ARGS = frozenset({"ov"})  # handlers that judge computed arguments themselves
_VAR_SETTERS = frozenset({"read", "mapfile", "readarray", "printf", "getopts", "let", "unset",
                          "wait"}) | _DECLARERS


class _Refused(Exception):
    """Internal: a check inside expansion refused the command."""


def check_shell(script: str, agent: _Agent, cwd: str | None, depth: int = 0) -> str | None:
    """Why ``script`` is refused for ``agent``, or None when it may run."""
    if depth > _MAX_DEPTH:
        return "this command nests shells or substitutions too deeply to check; simplify it."
    if depth == 0:
        size = len(script) if len(script) * 4 <= MAX_COMMAND_BYTES else len(script.encode("utf-8", "replace"))
        if size > MAX_COMMAND_BYTES:
            return (f"this command is {size:,} bytes; ov guard checks commands up to "
                    f"{MAX_COMMAND_BYTES // 1024} KB. Write long content to a file with the Write "
                    "tool and run a short command.")
        if "\x00" in script or _SUBST in script:
            return "this command contains text ov guard reserves for itself; call blocked."
    try:
        scan = parse(script)
    except _Unparseable as exc:
        return (
            f"ov guard could not parse this shell command ({exc}), so it cannot check it. "
            "Split it into simpler commands."
        )
    try:
        return _Walk(agent, cwd, depth, scan, script).run()
    except _Refused as exc:
        return str(exc)


class _Walk:
    def __init__(self, agent: _Agent, cwd: str | None, depth: int, scan: Scan, script: str) -> None:
        self.agent = agent
        self.depth = depth
        self.scan = scan
        self.forms = scan.forms
        self.forms_seen = -1
        self.vars: dict[str, str | None] = {}
        self.opaque = False  # after eval/source: no variable value can be trusted
        self.symlinked = False  # a cd went through a symlink: bash's `..` is then lexical
        self.cdpath = "CDPATH" in script or bool(agent.env.get("CDPATH"))
        start = cwd
        if has_shell_word(script, _CD_WORDS) and ("function" in scan.forms or has_shell_word(script, _LOOP_WORDS)):
            start = None  # a cd in a loop or function body can run any number of times
        self.all: set[str | None] = {start}
        self.exact: set[str | None] = {start}
        self.chain_exact = True
        self.current: set[str | None] = self.all
        self.last_effect: _Effect | None = None

    # ---- the walk

    def run(self) -> str | None:
        previous = ""
        for command in self.scan.commands:
            if previous == "&&" and self.chain_exact:
                candidates = self.exact
            else:
                if previous in LIST_ENDS:
                    self.chain_exact = True
                    self.exact = set(self.all)
                elif previous != "&&":
                    self.chain_exact = False
                candidates = self.all
            self.current = candidates
            reason = self._forms_refusal() or self._command(command, candidates)
            if reason:
                return reason
            previous = command.sep
        return self._forms_refusal()

    def _command(self, command: _Command, candidates: set[str | None]) -> str | None:
        words = command.words
        k = 0
        while k < len(words) and isinstance(words[k], str) and words[k] in _KEYWORDS:
            k += 1
        keyworded = k > 0
        redirects: list[tuple[str, list[str]]] = []
        for op, target in command.redirects:
            shown = word_text(target)
            if op in _WRITE_REDIRECTS or (op == ">&" and not (shown.isdigit() or shown == "-")):
                redirects.append((op, self._expand(target)))
        head = words[k] if k < len(words) else None
        if isinstance(head, str) and head in _HEADERS:
            if head in ("for", "select") and k + 1 < len(words):
                reason = self._set_unknown([word_text(words[k + 1])])
                if reason:
                    return reason
            for word in words[k + 2 :]:
                self._expand(word)  # brace expansion in `for x in {a,b}` is still a form
            return self._redirects_everywhere(redirects, candidates)

        assignments: list[tuple[str, str]] = []
        while k < len(words) and is_assignment(word_text(words[k])):
            name = word_text(words[k]).split("=", 1)[0].split("[", 1)[0].rstrip("+")
            value = self._expand(words[k], assignment=True)[0]
            assignments.append((name, value.split("=", 1)[1] if "=" in value else ""))
            k += 1
        argv: list[str] = []
        for word in words[k:]:
            argv.extend(self._expand(word))
        reason = self._forms_refusal()
        if reason:
            return reason
        for name, value in assignments:
            reason = self._assignment_refusal(name, value, prefix=bool(argv))
            if reason:
                return reason
        if not argv:
            for name, value in assignments:
                self._assign(name, value)
            return self._redirects_everywhere(redirects, candidates)

        core = _in_shell_core(argv)
        if core and os.path.basename(core[0]) in ("cd", "pushd", "popd") and _SUBST not in core[0]:
            reason = self._redirects_everywhere(redirects, candidates)
            self._cd(core, candidates, keyworded)
            return reason
        self.last_effect = None
        for cwd in sorted(candidates, key=lambda c: c or ""):
            reason = self._redirects(redirects, cwd) or self._check_argv(argv, cwd, dict(assignments))
            if reason:
                return reason
        effect = self.last_effect
        if effect is not None and effect.opaque:
            # eval/source may set any variable. A cd in eval's text leaves the directory
            # unknown; a sourced file (a venv's activate …) is code the writer could run
            # anyway, so its directory changes are not guessed at (the sandbox bounds it).
            self.opaque = True
            if any(has_shell_word(script, _CD_WORDS) for script in effect.scripts):
                self._move({None}, keyworded=True)
        return None

    # ---- words and variables

    def lookup(self, name: str) -> str | None:
        """A variable's value; ``_SUBST`` when it is set to something ov cannot know, None
        when ov does not know it at all (``${name:-default}`` then takes the default)."""
        if self.opaque:
            return _SUBST
        if name in self.vars:
            value = self.vars[name]
            return _SUBST if value is None else value
        if name == "IFS":
            return " \t\n"
        if name == "PWD":
            return next(iter(self.current)) if len(self.current) == 1 else None
        if name == "OLDPWD":
            return None
        return self.agent.env.get(name)

    def _expand(self, word: str | Word, *, assignment: bool = False) -> list[str]:
        if isinstance(word, str):
            return [word]
        from overstory.guards.expand import expand_word  # only words with $, {, ~ need it

        try:
            return expand_word(word, self.lookup, self.forms, assignment=assignment)
        except TooManyWords as exc:
            raise _Refused(f"ov guard will not check this command: {exc}. Split it up.") from None

    def _forms_refusal(self) -> str | None:
        if len(self.forms) == self.forms_seen:
            return None
        self.forms_seen = len(self.forms)
        for form, text in _EVERYONE_FORMS.items():
            if form in self.forms:
                return (f"ov guard refuses {text} for every agent: it cannot check what such a "
                        "command reads, writes or runs. Write it out plainly.")
        if not self.agent.writable:
            for form, text in _READ_ONLY_FORMS.items():
                if form in self.forms:
                    return self.agent.read_only(
                        f"use {text}: ov only lets read-only agents run what it can check "
                        "positively. Write the command out plainly")
        return None

    def _assignment_refusal(self, name: str, value: str, *, prefix: bool,
                            read_only_rules: bool = True) -> str | None:
        agent = self.agent
        if name.startswith("OVERSTORY_"):
            return (f"`{name}` is one of ov's variables, which say who this agent is and which turn "
                    "this is; no agent may set, change or drop them.")
        if name.startswith("GIT_") and value not in _HARMLESS_GIT.get(name, ()):
            return (f"`{name}=…` changes what git reads, writes or runs and is refused for every "
                    "agent. Run git without it (ov already sets what git needs); for a pager or "
                    "editor use `git --no-pager` or `GIT_EDITOR=true`.")
        if name == "IFS":
            if prefix:
                return None  # `IFS= read -r line`: only that command's splitting changes
            return ("changing IFS changes how the shell splits every later word, which ov guard "
                    "cannot follow; refused for every agent. Use `IFS=… read` for one command.")
        if name == "CDPATH":
            self.cdpath = True
        if name == "PYTHONPATH" and self._all_in_home_area(value):
            return None  # `PYTHONPATH=src pytest`: its own code, which the tests run anyway
        if read_only_rules and not agent.writable and not (name in _SAFE_VARS or name.startswith("LC_")
                                       or is_lowercase_name(name)):
            return agent.read_only(f"set `{name}`, which can change what programs run or where "
                                   "they write")
        return None

    def _all_in_home_area(self, value: str) -> bool:
        """Is every ``:``-separated path in ``value`` inside the agent's own area, from
        every directory the shell may be in?"""
        home = self.agent.home_area
        if not home or not value or _SUBST in value or None in self.current:
            return False
        for entry in value.split(":"):
            for cwd in self.current:
                path = self.agent.expand(entry, cwd)
                if path is None or not _inside(path, home):
                    return False
        return True

    def _assign(self, name: str, value: str) -> None:
        self.vars[name] = None if _SUBST in value else value

    def _set_unknown(self, names: list[str]) -> str | None:
        for name in names:
            if _SUBST in name:
                return _computed_names("this command")
            if not is_name(name):
                continue
            reason = self._assignment_refusal(name, _SUBST, prefix=False)
            if reason:
                return reason
            self.vars[name] = None
        return None

    def _var_builtin(self, name: str, argv: list[str]) -> str | None:
        """Builtins that set shell variables: check the names, forget the values."""
        agent = self.agent
        args = argv[1:]
        if name == "printf" and args and _SUBST in args[0] and not agent.writable:
            return agent.read_only("run `printf` with a first argument computed at run time "
                                   "(it could be `-v NAME`, which sets a variable)")
        if name in (*_DECLARERS, "unset") and any(_SUBST in a.split("=", 1)[0] for a in args):
            return _computed_names(name)
        if name in _DECLARERS:
            flags = "".join(a[1:] for a in args if a.startswith(("-", "+")) and "=" not in a)
            if "n" in flags or "i" in flags:
                if not agent.writable:
                    return agent.read_only(f"use `{name} -{'n' if 'n' in flags else 'i'}` (a "
                                           "name reference or integer variable evaluates values)")
                self.opaque = True
            for arg in args:
                var, eq, value = arg.partition("=")
                if not eq or not is_assignment(arg):
                    continue
                var = var.split("[", 1)[0].rstrip("+")
                reason = self._assignment_refusal(var, value, prefix=False)
                if reason:
                    return reason
                self._assign(var, value)
            return None
        if name == "unset":
            for arg in args:
                if arg.startswith("OVERSTORY_"):
                    return self._assignment_refusal(arg, "", prefix=False)
                if not arg.startswith("-"):
                    self.vars[arg] = ""
            return None
        if name == "let":
            if not agent.writable:
                return agent.read_only("use `let` (arithmetic evaluates variables' values as code)")
            return self._set_unknown([a.split("=", 1)[0] for a in args if "=" in a])
        if name == "printf":
            options, _ = _parse_options(args, ("-v",), stop_at_positional=True)
            return self._set_unknown([v for k, v in options if k == "-v" and v])
        if name == "getopts":
            return self._set_unknown(args[1:2])
        if name == "wait":
            options, _ = _parse_options(args, ("-p",))
            return self._set_unknown([v for k, v in options if k == "-p" and v])
        if name == "read":
            options, positionals = _parse_options(args, ("-a", "-d", "-n", "-N", "-p", "-t", "-u", "-i"))
            return self._set_unknown(positionals + [v for k, v in options if k == "-a" and v]
                                     or ["REPLY"])
        options, positionals = _parse_options(args, ("-d", "-n", "-O", "-s", "-u", "-C", "-c"))
        callbacks = [v for k, v in options if k == "-C" and v]
        if callbacks:  # mapfile -C runs its callback as shell code
            if not agent.writable:
                return agent.read_only("use `mapfile -C` (it runs a callback)")
            reason = check_shell(callbacks[0], agent, None, self.depth + 1)
            if reason:
                return reason
        return self._set_unknown(positionals[:1] or ["MAPFILE"])  # mapfile / readarray

    # ---- the working directory

    def _cd(self, argv: list[str], candidates: set[str | None], keyworded: bool) -> None:
        name = os.path.basename(argv[0])
        args = [a for a in argv[1:] if not (a.startswith("-") and a not in ("-", "--") and len(a) > 1)]
        if args[:1] == ["--"]:
            args = args[1:]
        if name == "popd" or (name == "pushd" and (not args or is_decimal_number(args[0], "+-"))):
            self._move({None}, keyworded=True)
            return
        if not args:
            home = self.lookup("HOME")
            target = home if home else _SUBST
        else:
            target = args[0]
        self._move({self._resolve_cd(cwd, target) for cwd in candidates}, keyworded=keyworded)

    def _move(self, new: set[str | None], *, keyworded: bool) -> None:
        if keyworded:
            self.chain_exact = False  # `! cd x && …`, `if cd x`: the next command may run either way
        self.exact = new if len(new) <= _MAX_CANDIDATES else {None}
        self.all = self.all | new
        if len(self.all) > _MAX_CANDIDATES:
            self.all = {None}

    def _resolve_cd(self, cwd: str | None, target: str) -> str | None:
        if _SUBST in target or target == "-":
            return None
        if self.cdpath and not target.startswith(("/", ".")):
            return None  # CDPATH may send a relative `cd` anywhere
        if target.startswith("/"):
            logical = target
        elif cwd is None:
            return None
        else:
            logical = os.path.join(cwd, target)
        if self.symlinked and ".." in target.split("/"):
            return None  # bash resolves `..` against the path it came by, not the real one
        if len(logical) > 4096:
            return None  # longer than PATH_MAX: the cd fails
        physical = self.agent._realpath(logical)
        lexical = os.path.normpath(logical)
        if lexical != logical and self.agent._realpath(lexical) != physical:
            return None
        if lexical != physical:
            self.symlinked = True
        return physical

    # ---- checks

    def _redirects_everywhere(self, redirects: list[tuple[str, list[str]]],
                              candidates: set[str | None]) -> str | None:
        for cwd in candidates:
            reason = self._redirects(redirects, cwd)
            if reason:
                return reason
        return None

    def _redirects(self, redirects: list[tuple[str, list[str]]], cwd: str | None) -> str | None:
        agent = self.agent
        for op, targets in redirects:
            for target in targets:
                if not agent.writable:
                    if target in _NULL_SINKS or target.startswith("/dev/fd/"):
                        continue
                    return agent.read_only(
                        f"redirect output into a file (`{op} {target}`); only `>/dev/null`, "
                        "`2>/dev/null` and `2>&1` are allowed"
                    )
                reason = agent.write_denial(target, cwd)
                if reason:
                    return reason
        return None

    def _check_argv(self, argv: list[str], cwd: str | None, assignments: Mapping[str, str],
                    depth: int | None = None) -> str | None:
        depth = self.depth if depth is None else depth
        agent = self.agent
        if depth > _MAX_DEPTH:
            return "this command nests wrappers too deeply to check; simplify it."
        program = argv[0]
        if _SUBST in program or not program:
            return (f"ov guard cannot check a command whose name is computed at run time (`{program}`"
                    "); write the program's name out (run the inner command first if you need "
                    "its output).")
        name = os.path.basename(program)
        if name in ("cd", "pushd", "popd"):
            return None  # run by a wrapper in a child process: the shell's directory stays
        if name in _VAR_SETTERS:
            reason = self._var_builtin(name, argv)
            if reason:
                return reason

        effect = _analyze(name, argv, agent, _ShellState(cwd), assignments)
        self.last_effect = effect
        if effect.kind == "deny":
            return effect.reason
        if not agent.writable and effect.kind not in ("read", "test"):
            return self._judge(effect, name, argv, cwd, cwd)  # say why, before what it runs
        for var, value in effect.env:
            reason = self._assignment_refusal(var, value, prefix=True, read_only_rules=False)
            if reason:
                return reason
        if effect.env_clear or any(v.startswith("OVERSTORY_") for v in effect.env_unset):
            return ("ov's OVERSTORY_* variables say who this agent is and which turn this is; no "
                    "agent may drop them (`env -i`, `env -u`, `exec -c`).")

        inner_cwd = cwd
        if effect.chdir is not None:
            inner_cwd = agent.expand(effect.chdir, cwd)
        for inner in effect.inner:
            if inner:
                reason = self._check_argv(inner, inner_cwd, {}, depth + 1)
                if reason:
                    return reason
        for script in effect.scripts:
            reason = check_shell(script, agent, inner_cwd, depth + 1)
            if reason:
                return reason
        for var, value in effect.env:
            reason = self._assignment_refusal(var, value, prefix=True)
            if reason:
                return reason
        self.last_effect = effect
        return self._judge(effect, name, argv, cwd, inner_cwd) or (
            self._set_unknown(effect.sets_vars) if effect.sets_vars else None)

    def _judge(self, effect: _Effect, name: str, argv: list[str], cwd: str | None,
               inner_cwd: str | None) -> str | None:
        agent = self.agent
        if not agent.writable:
            if effect.kind in ("read", "test"):
                if effect.unsafe:
                    return agent.read_only(effect.unsafe)
                if name in _PLAIN_READERS:
                    return None
                if cwd is None and name not in _VAR_SETTERS:
                    return agent.read_only(
                        f"run `{name}` where the working directory is unknown (after a `cd` ov "
                        "cannot follow); run the `cd` as a command of its own first")
                computed = next((a for a in argv[1:] if a == "--" or _SUBST in a), "--")
                if computed != "--" and name not in _CHECKS_COMPUTED_ARGS:
                    return agent.read_only(
                        f"pass `{name}` an argument computed at run time (`$(...)` or a variable "
                        "ov cannot know), which could turn into an option ov has not checked; run "
                        "the inner command first and use its output")
                return None
            if effect.kind in ("write", "install"):
                return agent.read_only(effect.what or f"run `{name}`, which writes files")
            if effect.kind == "code":
                return agent.read_only(
                    f"run {effect.what or name}: code that cannot be checked for writes"
                )
            return agent.read_only(
                f"run `{name}`, which is not on its list of read-only commands (cat, ls, grep, rg, "
                "find, head, tail, wc, git status/log/diff/show, ov, pytest …)"
            )
        if effect.kind == "install":
            return (
                f"{agent.who} may not install packages outside its worktree: {effect.what}. Use a "
                f"virtualenv or local node_modules inside {agent.worktree}, or ask your parent "
                "with `ov mail send`."
            )
        for target in effect.targets:
            reason = agent.write_denial(target, inner_cwd, removes=effect.removes)
            if reason:
                return reason
        if effect.writes_cwd:
            if inner_cwd is None:
                return agent.write_denial(".", None)
            reason = agent.write_denial(inner_cwd, None)
            if reason:
                return reason
        if effect.kind in ("unknown", "code"):
            return agent.protected_zone_denial(argv[1:], cwd)
        return None


def _computed_names(what: str) -> str:
    return (f"`{what}` here names variables computed at run time; ov guard cannot tell which "
            "variables it sets. Write the names out.")


def _in_shell_core(argv: list[str]) -> list[str]:
    """The command that ``builtin``, ``command`` and ``time`` run in this same shell."""
    while argv and os.path.basename(argv[0]) in ("builtin", "command", "time"):
        options, rest = _parse_options(argv[1:], (), stop_at_positional=True)
        if os.path.basename(argv[0]) == "command" and _names(options) & {"-v", "-V"}:
            return argv
        argv = rest
    return argv
