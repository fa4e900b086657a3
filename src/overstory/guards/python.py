"""Python: the interpreter, ``-m`` modules, pip and pytest — the toolchain on ov's hot path.

``python`` runs code that cannot be checked, unless it runs a module we know (``-m
pytest``, ``-m pip``, ``-m venv``, the linters …). Test runners are allowed for
read-only agents with options ov knows to be harmless (``testopts``); ``pip`` may only
install into a virtualenv inside the worktree. The other toolchains are in
``toolchains``, loaded only when a command uses them.
"""

from __future__ import annotations

from overstory.guards.agent import _Agent, _inside
from overstory.guards.effects import (
    _READ,
    _VERSION_FLAGS,
    _Effect,
    _Handler,
    _names,
    _parse_options,
    _ShellState,
    _values,
)

TYPE_CHECKING = False  # typing and collections.abc cost `ov guard` milliseconds
if TYPE_CHECKING:
    from collections.abc import Mapping

#: Options that never write or run anything: with only these, the option tables stay unloaded.
_COMMON_OPTIONS = frozenset({"-q", "-qq", "-x", "-v", "-vv", "-s", "-xq", "-qx", "--quiet",
                             "--verbose", "--exitfirst", "--no-header", "-rA", "--tb=short",
                             "--tb=no", "--tb=line"})


def _pytest(argv: list[str], agent: _Agent, *_rest: object) -> _Effect:
    return _test_args(argv[1:], "pytest", agent)


def _test_args(args: list[str], label: str, agent: _Agent, tool: str = "pytest") -> _Effect:
    """A test runner or linter: files its options write (targets), and for read-only agents
    whether every option is one ov knows to be harmless (``unsafe`` otherwise)."""
    if all(a in _COMMON_OPTIONS or not a.startswith("-") for a in args):
        return _Effect("test", what=label)
    if "--install-types" in args:
        return _Effect("install", what=f"`{label} --install-types` installs packages")
    from overstory.guards import testopts  # the option tables load only when needed

    targets, unsafe = testopts.inspect(tool, args, read_only=not agent.writable)
    return _Effect("test", what=label, targets=targets, unsafe=unsafe)


_PIP_READ = frozenset({"list", "show", "freeze", "check", "help", "index", "inspect", "debug",
                       "search", "hash", "cache"})

def _first_word(args: list[str]) -> tuple[str, list[str]]:
    for i, arg in enumerate(args):
        if not arg.startswith("-"):
            return arg, args[i + 1 :]
    return "", []


def _pip(argv: list[str], agent: _Agent, state: _ShellState, _a: Mapping[str, str]) -> _Effect:
    return _pip_args(argv[0], argv[1:], agent, state)


def _pip_args(program: str, args: list[str], agent: _Agent, state: _ShellState) -> _Effect:
    sub, rest = _first_word(args)
    if not sub or sub in _PIP_READ or any(a in _VERSION_FLAGS for a in args[:1]):
        return _READ
    if sub not in ("install", "uninstall", "download", "wheel"):
        return _Effect("unknown", what=f"pip {sub}")
    options, _ = _parse_options(rest, ("-t", "--target", "--prefix", "--root", "-d", "--dest",
                                       "-w", "--wheel-dir", "-r", "--requirement", "-c",
                                       "--constraint", "-e", "--editable", "-i", "--index-url",
                                       "--extra-index-url", "-f", "--find-links"))
    if sub in ("download", "wheel"):
        dest = _values(options, "-d", "--dest", "-w", "--wheel-dir")
        return _Effect("write", what=f"pip {sub}", targets=dest, writes_cwd=not dest)
    local = _values(options, "-t", "--target", "--prefix", "--root")
    if "--user" not in _names(options) and agent.worktree:
        places = local + [agent.env.get("VIRTUAL_ENV", "")]
        if "/" in program:
            places.append(program)
        for place in places:
            path = agent.expand(place, state.cwd) if place else None
            if path and _inside(path, agent.worktree):
                return _Effect("write", what=f"pip {sub}", targets=[place])
    return _Effect("install", what=f"`pip {sub}` writes to the shared Python environment")


def _python(argv: list[str], agent: _Agent, state: _ShellState, _a: Mapping[str, str]) -> _Effect:
    args = argv[1:]
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("--version", "-V", "-VV", "--help", "-h"):
            return _READ
        if arg == "-" or not arg.startswith("-"):
            return _Effect("code", what=f"a Python script (`{arg}`)")
        if not arg.startswith("--"):
            cluster = arg[1:]
            for j, flag in enumerate(cluster):
                if flag == "c":
                    return _Effect("code", what="`python -c` (inline code)")
                if flag == "m":
                    attached = cluster[j + 1 :]
                    if attached:
                        return _python_module(attached, args[i + 1 :], argv[0], agent, state)
                    module = args[i + 1] if i + 1 < len(args) else ""
                    return _python_module(module, args[i + 2 :], argv[0], agent, state)
                if flag in "WX":
                    if not cluster[j + 1 :]:
                        i += 1
                    break
        i += 1
    return _Effect("code", what="Python reading code from stdin")


def _python_module(
    module: str, rest: list[str], program: str, agent: _Agent, state: _ShellState
) -> _Effect:
    if module == "pytest":
        return _test_args(rest, "python -m pytest", agent)
    if module in ("unittest", "doctest"):
        return _Effect("test", what=f"python -m {module}")
    if module == "pip":
        return _pip_args(program, rest, agent, state)
    if module in ("overstory", "overstory.cli.main"):
        from overstory.guards.ov import ov_command

        return ov_command(["ov", *rest], agent)
    if module == "json.tool":
        if len(rest) < 2:
            return _READ
        return _Effect("write", what="write a file with `python -m json.tool IN OUT`", targets=rest[1:2])
    if module in ("mypy", "pyright", "flake8", "pylint"):
        return _test_args(rest, f"python -m {module}", agent, module)
    if module in ("pyflakes", "compileall"):
        return _Effect("test", what=f"python -m {module}")
    if module in ("ruff", "black", "isort"):
        from overstory.guards.programs import _analyze

        return _analyze(module, [module, *rest], agent, state, {})
    if module in ("venv", "virtualenv"):
        _, positionals = _parse_options(rest, ("--prompt",))
        return _Effect("write", what=f"create a virtualenv with `python -m {module}`",
                       targets=positionals)
    return _Effect("code", what=f"`python -m {module}`")




HANDLERS: dict[str, _Handler] = {
    "python": _python,
    "pytest": _pytest,
    "py.test": _pytest,
    "pip": _pip,
    "pip3": _pip,
}
