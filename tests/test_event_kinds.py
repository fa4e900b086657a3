"""Event kinds are a vocabulary (store/event_kinds.py): `events.record` refuses any other kind.

The static check reads the source with ``ast``: every call that records an event, directly
(``event_store.record(conn, KIND, ...)``) or through a module's own wrapper that passes one of its
parameters on as the kind (found the same way, to any depth), must name its kind with a string
literal, a conditional between literals, a module constant, or a local assigned only literals, and
that kind must be in ``KINDS``. A runtime parser's ``ParsedEvent(KIND, ...)`` counts too: the turn
runner records those as they come. Every kind in ``KINDS`` must also be recorded somewhere, so
the vocabulary never keeps a name nothing writes.
"""

from __future__ import annotations

import ast
import sqlite3
import typing as t
from pathlib import Path

import pytest

from conftest import run_ov
from overstory.paths import ProjectPaths
from overstory.store import events as event_store
from overstory.store.event_kinds import KINDS

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = SRC / "overstory"
RECORD = ("overstory.store.events", "record")
# Where a parsed runtime event is recorded as it came (``item.kind``): its kind was checked where the parser made it.
PASSES_PARSED_ON = {"overstory.agents.turn_stream"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


class Source:
    """Every module of the package, parsed, with its string constants and what its imported names stand for."""

    def __init__(self) -> None:
        self.texts = {_module_name(p): p.read_text(encoding="utf-8") for p in sorted(PACKAGE.rglob("*.py"))}
        self.trees: dict[str, ast.Module] = {}
        self.constants: dict[str, dict[str, str]] = {}
        self.aliases: dict[str, dict[str, tuple[str, str | None]]] = {}
        self.scopes: dict[str, list[tuple[ast.FunctionDef, bool, list[ast.Call]]]] = {}

    def add(self, module: str, text: str) -> None:
        self.texts[module] = text
        self.trees[module] = tree = ast.parse(text)
        self.constants[module] = self._constants(tree)
        self.aliases[module] = self._aliases(tree)
        self.scopes[module] = [(function, method, [node for node in ast.walk(function) if isinstance(node, ast.Call)])
                               for function, method in self._functions(tree)]

    def parse_mentioning(self, names: t.Collection[str]) -> None:
        """Parse the modules whose text names one of ``names`` (only those can call them)."""
        for module, text in self.texts.items():
            if module not in self.trees and any(name in text for name in names):
                self.add(module, text)

    @staticmethod
    def _constants(tree: ast.Module) -> dict[str, str]:
        found = {}
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                found.update({target.id: node.value.value for target in node.targets if isinstance(target, ast.Name)})
        return found

    def _aliases(self, tree: ast.Module) -> dict[str, tuple[str, str | None]]:
        """Local name -> (module, None) for an imported module, (module, attribute) for an imported name."""
        found: dict[str, tuple[str, str | None]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("overstory"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    found[alias.asname or alias.name] = (full, None) if full in self.texts else (node.module or "", alias.name)
            elif isinstance(node, ast.Import):
                found.update({alias.asname or alias.name: (alias.name, None) for alias in node.names
                              if alias.name in self.texts})
        return found

    @staticmethod
    def _functions(tree: ast.Module) -> t.Iterator[tuple[ast.FunctionDef, bool]]:
        """Top-level functions and methods (the flag says which); nested functions are part of theirs."""
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                yield node, False
            elif isinstance(node, ast.ClassDef):
                yield from ((item, True) for item in node.body if isinstance(item, ast.FunctionDef))

    def target(self, module: str, call: ast.Call) -> tuple[str, str] | None:
        """The (module, function) a call goes to, as far as the imports tell."""
        func = call.func
        if isinstance(func, ast.Name):
            where = self.aliases[module].get(func.id)
            return (where[0], where[1]) if where and where[1] else (module, func.id)
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            if func.value.id == "self":
                return module, func.attr
            where = self.aliases[module].get(func.value.id)
            if where and where[1] is None:
                return where[0], func.attr
        return None

    def strings(self, node: ast.AST | None, module: str, scope: ast.FunctionDef | None) -> set[str] | None:
        """The strings an expression can be, or None when the source alone cannot tell."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        if isinstance(node, ast.IfExp):
            body, orelse = self.strings(node.body, module, scope), self.strings(node.orelse, module, scope)
            return None if body is None or orelse is None else body | orelse
        if not isinstance(node, ast.Name):
            return None
        if node.id in self.constants[module]:
            return {self.constants[module][node.id]}
        where = self.aliases[module].get(node.id)
        if where and where[1] and where[0] in self.texts:
            if where[0] not in self.trees:
                self.add(where[0], self.texts[where[0]])
            if where[1] in self.constants[where[0]]:
                return {self.constants[where[0]][where[1]]}
        assigned = [a.value for a in ast.walk(scope) if isinstance(a, ast.Assign)
                    and any(isinstance(x, ast.Name) and x.id == node.id for x in a.targets)] if scope else []
        found: set[str] = set()
        for value in assigned:
            got = self.strings(value, module, None)
            if got is None:
                return None
            found |= got
        return found or None


def _kind_arg(call: ast.Call, index: int) -> ast.AST | None:
    if index < len(call.args):
        return call.args[index]
    return next((kw.value for kw in call.keywords if kw.arg == "kind"), None)


def _params(function: ast.FunctionDef, method: bool) -> list[str]:
    return [a.arg for a in function.args.args][1 if method else 0:]


def recording_functions(source: Source) -> dict[tuple[str, str], int]:
    """``events.record`` and every function that hands one of its parameters on to it as the kind, to any depth:
    (module, function) -> the position of the kind among its arguments (``self`` not counted). Parses the
    modules that mention one of them (a call names what it calls)."""
    sinks = {RECORD: 1}
    grew = True
    while grew:
        grew = False
        source.parse_mentioning({name for _, name in sinks} | {"ParsedEvent"})
        for module in list(source.trees):
            for function, method, calls in source.scopes[module]:
                if (module, function.name) in sinks:
                    continue
                params = _params(function, method)
                for call in calls:
                    where = source.target(module, call)
                    arg = _kind_arg(call, sinks[where]) if where is not None and where in sinks else None
                    if isinstance(arg, ast.Name) and arg.id in params:
                        sinks[(module, function.name)] = params.index(arg.id)
                        grew = True
                        break
    return sinks


def recorded_kinds(source: Source) -> tuple[dict[str, list[str]], list[str]]:
    """Every kind the code records (kind -> where), and the places whose kind the source cannot tell."""
    sinks = recording_functions(source)
    kinds: dict[str, list[str]] = {}
    unknown: list[str] = []
    for module in list(source.trees):
        for scope, method, calls in source.scopes[module]:
            for call in calls:
                arg = _recorded_kind(source, sinks, module, call, _params(scope, method))
                if arg is None:
                    continue
                got = source.strings(arg, module, scope)
                if got is None:
                    unknown.append(f"{module}:{call.lineno}")
                for kind in got or ():
                    kinds.setdefault(kind, []).append(f"{module}:{call.lineno}")
    return kinds, unknown


def _recorded_kind(source: Source, sinks: dict[tuple[str, str], int], module: str, call: ast.Call,
                   params: list[str]) -> ast.AST | None:
    """The expression a call records as an event's kind; None for a call that records none (or whose kind is
    checked elsewhere: a wrapper's own parameter, a parsed event passed on)."""
    func = call.func
    if (isinstance(func, ast.Name) and func.id == "ParsedEvent") or (
            isinstance(func, ast.Attribute) and func.attr == "ParsedEvent"):
        return _kind_arg(call, 0)
    where = source.target(module, call)
    if where not in sinks:
        return None
    arg = _kind_arg(call, sinks[t.cast(tuple[str, str], where)])
    if isinstance(arg, ast.Name) and arg.id in params:
        return None  # a wrapper passing its own parameter on: its callers are checked instead
    if module in PASSES_PARSED_ON and isinstance(arg, ast.Attribute) and arg.attr == "kind":
        return None
    return arg


@pytest.fixture(scope="module")
def scanned() -> tuple[dict[str, list[str]], list[str]]:
    return recorded_kinds(Source())


def test_every_kind_the_code_records_is_in_the_vocabulary(scanned: tuple[dict[str, list[str]], list[str]]) -> None:
    kinds, unknown = scanned
    assert unknown == [], "name these events' kinds with literals, so this test can check them"
    outside = {kind: where for kind, where in kinds.items() if kind not in KINDS}
    assert outside == {}, "add these kinds to overstory.store.event_kinds.KINDS (or fix the typo)"
    # The scan does find them: direct calls, wrappers of wrappers (scheduler.event -> record_event -> record),
    # conditionals, module constants, and the runtime parsers' kinds.
    assert {"turn_end", "schedule_claimed", "approval_approved", "approval_rejected", "tool_call_flagged",
            "tool_start", "watchdog_zombie"} <= kinds.keys()


def test_every_kind_in_the_vocabulary_is_recorded_somewhere(scanned: tuple[dict[str, list[str]], list[str]]) -> None:
    kinds, _ = scanned
    assert sorted(KINDS - kinds.keys()) == []


def test_the_scan_catches_a_typo_through_a_wrapper(tmp_path: Path) -> None:
    """The static check itself: a misspelt kind passed through a wrapper of a wrapper is caught."""
    source = Source()
    source.texts["overstory.fake"] = (
        "from overstory.store import events as event_store\n"
        "def _event(conn, kind):\n    event_store.record(conn, kind)\n"
        "class Thing:\n    def note(self, kind):\n        _event(None, kind)\n"
        "    def act(self):\n        self.note('turn_ned')\n")
    kinds, _ = recorded_kinds(source)
    assert kinds["turn_ned"] == ["overstory.fake:8"]


def test_record_refuses_an_unknown_kind(events_db: sqlite3.Connection) -> None:
    before = event_store.newest_id(events_db)
    with pytest.raises(ValueError, match="unknown event kind 'turn_ned'"):
        event_store.record(events_db, "turn_ned", agent="builder-1", summary="a typo")
    assert event_store.newest_id(events_db) == before  # nothing written
    assert event_store.record(events_db, "turn_end", agent="builder-1", summary="ok") > before


def test_feed_and_logs_refuse_a_kind_outside_the_vocabulary(project: ProjectPaths) -> None:
    """A typo in a filter is an error that says so, not an empty feed."""
    typo = run_ov("feed", "--kind", "tool_strat", cwd=project.root)
    assert typo.returncode == 2
    assert typo.stderr.strip().splitlines()[-1].endswith(
        "--kind: unknown event kind 'tool_strat' (did you mean 'tool_start'?)")
    assert "Traceback" not in typo.stderr
    assert run_ov("logs", "builder-1", "--kind", "nope", cwd=project.root).returncode == 2
    fine = run_ov("feed", "--kind", "tool_start", "--kind", "turn_end", cwd=project.root)
    assert fine.returncode == 0, fine.stderr
