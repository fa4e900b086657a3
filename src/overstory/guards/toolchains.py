"""Handlers for language toolchains other than Python's: linters, build tools, package
managers.

Running linters and type checkers is allowed for read-only agents (reviewers need it);
rewriting files (``--fix``, formatters without ``--check``) is a write, and installing
outside the worktree (global npm, system packages) is refused for writers too.
"""

from __future__ import annotations

import os

from overstory.guards.agent import _Agent
from overstory.guards.effects import (
    _READ,
    _VERSION_FLAGS,
    _Effect,
    _Handler,
    _names,
    _parse_options,
    _values,
)
from overstory.guards.python import _PIP_READ, _first_word, _test_args

# ---- linters, build tools


def _fixable(check_flags: frozenset[str], fix_flags: frozenset[str] = frozenset()) -> _Handler:
    """Formatters/linters: read-only with a check flag and without a fix flag."""

    def handler(argv: list[str], agent: _Agent, *_rest: object) -> _Effect:
        tool = os.path.basename(argv[0])
        args = {a.split("=", 1)[0] for a in argv[1:]}
        if not check_flags or args & check_flags:
            if not args & fix_flags:
                return _test_args(argv[1:], tool, agent, tool)
        paths = [a for a in argv[1:] if not a.startswith("-")]
        return _Effect("write", what=f"rewrite files with `{tool}`", targets=paths,
                       writes_cwd=not paths)

    return handler


def _ruff(argv: list[str], agent: _Agent, *_rest: object) -> _Effect:
    args = argv[1:]
    fix = {"--fix", "--unsafe-fixes", "--add-noqa", "--fix-only"}
    sub = next((a for a in args if not a.startswith("-")), "check")
    if any(a in _VERSION_FLAGS for a in args) or sub in ("version", "rule", "config", "linter",
                                                        "help"):
        return _READ
    rest = [a for a in args if a != sub]
    if sub == "check" and not fix & {a.split("=", 1)[0] for a in args}:
        return _test_args(rest, "ruff check", agent, "ruff")
    if sub == "format" and {"--check", "--diff"} & set(args):
        return _test_args(rest, "ruff format --check", agent, "ruff")
    return _Effect("write", what=f"rewrite files with `ruff {sub}`", writes_cwd=True)


def _tsc(argv: list[str], agent: _Agent, *_rest: object) -> _Effect:
    if {"--noEmit", "--version", "-v", "--help", "-h"} & set(argv[1:]):
        return _test_args(argv[1:], "tsc --noEmit", agent, "tsc")
    return _Effect("write", what="emit compiled files with `tsc`", writes_cwd=True)


def _make(argv: list[str], agent: _Agent, *_rest: object) -> _Effect:
    options, positionals = _parse_options(argv[1:], ("-C", "--directory", "-f", "--file",
                                                     "--makefile", "-j", "--jobs", "-l",
                                                     "-o", "-W", "-I"))
    names = _names(options)
    directory = _values(options, "-C", "--directory")
    chdir = directory[0] if directory else None
    if names & {"-n", "--dry-run", "--just-print", "-q", "--question", "-p",
                "--print-data-base", "--version", "-v", "-h", "--help"}:
        return _READ
    goals = [p for p in positionals if "=" not in p]
    if goals and all(g in ("test", "tests", "check", "lint", "typecheck") for g in goals):
        effect = _test_args(argv[1:], f"make {' '.join(goals)}", agent, "make")
        effect.writes_cwd, effect.chdir = True, chdir
        if len(goals) < len(positionals) and not agent.writable:
            effect.unsafe = effect.unsafe or "override make variables (they can change the commands make runs)"
        return effect
    return _Effect("unknown", what="make", writes_cwd=True, chdir=chdir)


# ---- package managers

_NODE_READ = frozenset({"ls", "list", "ll", "la", "view", "v", "info", "show", "outdated",
                        "why", "explain", "help", "search", "root", "prefix", "bin", "doctor",
                        "whoami", "licenses"})
_NODE_TEST = frozenset({"test", "t", "tst"})
_NODE_INSTALL = frozenset({"install", "i", "in", "ci", "add", "uninstall", "remove", "rm", "r",
                           "un", "update", "up", "upgrade", "link", "ln", "unlink", "global",
                           "dedupe", "prune", "rebuild"})
_SYSTEM_PACKAGE_READ = frozenset({"list", "show", "search", "policy", "info", "depends",
                                  "rdepends", "madison", "showpkg", "--version", "-v",
                                  "help", "outdated", "deps", "desc", "leaves", "query"})


def _node_pm(argv: list[str], agent: _Agent, *_rest: object) -> _Effect:
    tool = os.path.basename(argv[0])
    args = argv[1:]
    sub, rest = _first_word(args)
    if not sub:
        if tool == "yarn":  # bare `yarn` installs
            return _Effect("write", what="yarn install", writes_cwd=True)
        return _READ
    if any(a in _VERSION_FLAGS for a in args[:1]) or sub in _NODE_READ:
        return _READ
    if sub in _NODE_TEST or (sub == "run" and rest[:1] and rest[0] in ("test", "lint",
                                                                         "typecheck")):
        extra = rest[1:] if sub == "run" else rest
        return _test_args(extra, f"{tool} {sub}", agent, "npm")
    if sub in _NODE_INSTALL:
        if sub == "global" or {"-g", "--global", "--location=global"} & set(args):
            shown = f"{tool} global" if sub == "global" else f"{tool} {sub} -g"
            return _Effect("install", what=f"`{shown}` installs globally")
        return _Effect("write", what=f"{tool} {sub}", writes_cwd=True)
    return _Effect("unknown", what=f"{tool} {sub}", writes_cwd=True)


def _cargo(argv: list[str], agent: _Agent, *_rest: object) -> _Effect:
    sub, rest = _first_word(argv[1:])
    if not sub or sub in ("tree", "metadata", "version", "help", "search", "locate-project",
                          "pkgid", "verify-project") or argv[1:2] == ["--version"]:
        return _READ
    if sub in ("test", "t", "check", "c", "clippy", "bench", "fmt") and (
        sub != "fmt" or "--check" in argv
    ):
        return _test_args(rest, f"cargo {sub}", agent, "cargo")
    if sub in ("install", "uninstall"):
        return _Effect("install", what=f"`cargo {sub}` writes to ~/.cargo")
    return _Effect("unknown", what=f"cargo {sub}", writes_cwd=True)


def _go(argv: list[str], agent: _Agent, *_rest: object) -> _Effect:
    sub, rest = _first_word(argv[1:])
    if sub in ("version", "list", "doc", "help") or (sub == "env" and "-w" not in rest):
        return _READ
    if sub in ("test", "vet"):
        return _test_args(rest, f"go {sub}", agent, "go")
    if sub == "install":
        return _Effect("install", what="`go install` writes to GOPATH/bin")
    return _Effect("unknown", what=f"go {sub}", writes_cwd=True)


def _system_packages(argv: list[str], *_rest: object) -> _Effect:
    tool = os.path.basename(argv[0])
    sub, _ = _first_word(argv[1:])
    if tool == "apt-cache" or not sub or sub in _SYSTEM_PACKAGE_READ:
        return _READ
    return _Effect("install", what=f"`{tool} {sub}` changes the system's packages")


def _global_installer(argv: list[str], *_rest: object) -> _Effect:
    tool = os.path.basename(argv[0])
    sub, _ = _first_word(argv[1:])
    if not sub or sub in ("list", "info", "search", "help", "environment", "show", "query"):
        return _READ
    if argv[1:2] and argv[1] in _VERSION_FLAGS:
        return _READ
    return _Effect("install", what=f"`{tool} {sub}` installs outside the worktree")


def _uv(argv: list[str], *_rest: object) -> _Effect:
    sub, rest = _first_word(argv[1:])
    if not sub or sub in ("tree", "version", "help") or argv[1:2] == ["--version"]:
        return _READ
    if sub == "pip":
        inner, _ = _first_word(rest)
        if inner in _PIP_READ or not inner:
            return _READ
        if "--system" in rest:
            return _Effect("install", what=f"`uv pip {inner} --system` writes to the system")
        return _Effect("write", what=f"uv pip {inner}", writes_cwd=True)
    if sub == "tool":
        inner, _ = _first_word(rest)
        if inner in ("list", "dir"):
            return _READ
        if inner == "run":
            return _Effect("code", what="`uv tool run`")
        return _Effect("install", what=f"`uv tool {inner}` installs outside the worktree")
    if sub == "run":
        return _python_like_run(rest, "uv run")
    return _Effect("write" if sub in ("add", "remove", "sync", "lock", "venv", "init") else
                   "unknown", what=f"uv {sub}", writes_cwd=True)


def _python_like_run(rest: list[str], label: str) -> _Effect:
    _, command = _parse_options(rest, ("--with", "--python", "-p", "--project", "--directory",
                                       "--extra", "--group"), stop_at_positional=True)
    if not command:
        return _Effect("code", what=f"`{label}`")
    return _Effect("read", inner=[command])


# ---- python


HANDLERS: dict[str, _Handler] = {
    "tox": _fixable(frozenset()),
    "nox": _fixable(frozenset()),
    "mypy": _fixable(frozenset()),
    "pyright": _fixable(frozenset()),
    "pyflakes": _fixable(frozenset()),
    "flake8": _fixable(frozenset()),
    "pylint": _fixable(frozenset()),
    "shellcheck": _fixable(frozenset()),
    "eslint": _fixable(frozenset(), frozenset({"--fix", "--fix-dry-run"})),
    "black": _fixable(frozenset({"--check", "--diff"})),
    "isort": _fixable(frozenset({"--check", "--check-only", "-c", "--diff"})),
    "prettier": _fixable(frozenset({"--check", "-c", "--list-different", "-l"}),
                         frozenset({"--write", "-w"})),
    "ruff": _ruff,
    "tsc": _tsc,
    "make": _make,
    "npm": _node_pm,
    "pnpm": _node_pm,
    "yarn": _node_pm,
    "cargo": _cargo,
    "go": _go,
    "uv": _uv,
    "apt": _system_packages,
    "apt-get": _system_packages,
    "apt-cache": _system_packages,
    "aptitude": _system_packages,
    "dpkg": _system_packages,
    "dnf": _system_packages,
    "yum": _system_packages,
    "apk": _system_packages,
    "pacman": _system_packages,
    "zypper": _system_packages,
    "brew": _system_packages,
    "port": _system_packages,
    "snap": _system_packages,
    "gem": _global_installer,
    "pipx": _global_installer,
    "conda": _global_installer,
    "mamba": _global_installer,
    "micromamba": _global_installer,
}
