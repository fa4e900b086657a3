"""The package's layering rules (docs/architecture.md), checked by parsing the source with ``ast``.

- ``store/`` imports no other layer of ov (only itself and the base modules below);
- ``runtimes/`` never imports ``agents/``, ``cli/`` or ``ui/``;
- no import circle anywhere in ``src/`` (imports inside functions count; imports
  under ``if TYPE_CHECKING:`` do not, since they never run);
- ``guards/`` and the hot modules of ``store/`` import only the standard library and ov;
- only ``store/`` runs SQL: no ``.execute(``/``.executemany(``/``.executescript(`` call anywhere else;
- no module over 600 lines.
"""

from __future__ import annotations

import ast
import sys
import typing as t
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = SRC / "overstory"
# Modules every layer may use: they import nothing of ov but each other.
BASE_MODULES = {"overstory", "overstory.capabilities", "overstory.clock", "overstory.errors", "overstory.jsontext",
                "overstory.names", "overstory.paths", "overstory.printable", "overstory.records"}
NO_IMPORT_MODULES = {"overstory", "overstory.capabilities"}  # import nothing at all: even guards may use them
# Guards may also use these, which import no ov module and only the standard library: jsontext is json without the
# json package (whose import costs `ov guard` about a millisecond, with re already loaded).
STDLIB_ONLY_MODULES = {"overstory.jsontext"}
STORE_HOT_MODULES = ("db", "migrations", "events_migrations", "sessions", "mail", "mail_text", "mail_queries",
                     "overview", "events", "turns", "lifecycle")
SQL_METHODS = frozenset({"execute", "executemany", "executescript"})
# Modules outside store/ allowed to call them anyway, each with the reason. None today: keep it so.
SQL_OUTSIDE_STORE: dict[str, str] = {}
MAX_LINES = 600


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(source: str, module: str, known: t.Collection[str], *, top_level_only: bool = False) -> set[str]:
    """The modules ``module`` imports (resolved to known ov modules where they are ov's)."""
    tree = ast.parse(source)
    found: set[str] = set()
    package = module if (PACKAGE / Path(*module.split(".")[1:]) / "__init__.py").exists() else module.rpartition(".")[0]

    def visit(node: ast.AST, depth: int) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(sub, depth)
                continue
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and top_level_only:
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (child.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in child.names:
                    candidate = f"{base}.{alias.name}"
                    found.add(candidate if candidate in known else base)
            visit(child, depth + 1)

    visit(tree, 0)
    return found


def ov_graph() -> dict[str, set[str]]:
    modules = all_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = imports_of(path.read_text(encoding="utf-8"), name, modules)
        graph[name] = {target for target in targets if target in modules and target != name}
    return graph


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def forbidden_imports(graph: dict[str, set[str]], layer: str, forbidden_layers: set[str],
                      allowed: t.Callable[[str], bool] | None = None) -> list[str]:
    problems = []
    for module, targets in sorted(graph.items()):
        if layer_of(module) != layer:
            continue
        for target in sorted(targets):
            if layer_of(target) in forbidden_layers or (allowed is not None and not allowed(target)):
                problems.append(f"{module} imports {target}")
    return problems


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle (as a path that ends where it starts), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return stack[stack.index(target):] + [target]
            if target not in state:
                found = dfs(target)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = dfs(node)
            if found:
                return found
    return None


def sql_calls(source: str) -> list[int]:
    """Lines of the calls ``X.execute(...)``, ``X.executemany(...)``, ``X.executescript(...)`` in ``source``.

    The parser cannot know X's type: any object's method of those names counts, which is the
    point (a cursor, a connection held under another name, ``self.state``, a transaction).
    """
    return sorted(node.lineno for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr in SQL_METHODS)


def sql_outside_store() -> list[str]:
    return [f"{module}:{line}" for module, path in all_modules().items()
            if layer_of(module) != "store" and module not in SQL_OUTSIDE_STORE
            for line in sql_calls(path.read_text(encoding="utf-8"))]


def _store_may_import(target: str) -> bool:
    return target in BASE_MODULES or target.startswith("overstory.store")


# ---- the rules, on the real source --------------------------------------------------------


def test_store_imports_no_other_layer() -> None:
    assert forbidden_imports(ov_graph(), "store", {"agents", "runtimes", "guards", "merge", "cli", "ui"},
                             allowed=_store_may_import) == []


def test_runtimes_never_import_agents() -> None:
    assert forbidden_imports(ov_graph(), "runtimes", {"agents", "cli", "ui"}) == []


# The package's root holds only modules every part shares (ARCHITECTURE §3): a new capability gets a
# package whose name says what it is (config/, views/, watchdog/, scheduling/, project/, ...).
ROOT_MODULES = {"__init__", "__main__", "capabilities", "clock", "deferred", "errors", "gitutil", "jsontext",
                "limits", "names", "notify", "paths", "printable", "procs", "records", "resources", "serve_token",
                "wire"}


def test_the_root_holds_only_the_shared_modules() -> None:
    assert {path.stem for path in PACKAGE.glob("*.py")} == ROOT_MODULES


def test_read_models_and_config_import_no_actor() -> None:
    """``views/`` (what status, watch, diff, costs and wait show) and ``config/`` only read: they import
    nothing that acts (agents, merges, the watchdog, schedules, operator commands) and no front end."""
    actors = {"agents", "merge", "watchdog", "scheduling", "project", "executors", "endpoint", "cli", "ui"}
    graph = ov_graph()
    assert forbidden_imports(graph, "views", actors) == []
    assert forbidden_imports(graph, "config", actors | {"views"}) == []


def test_no_import_circles() -> None:
    assert find_cycle(ov_graph()) is None


def test_guards_and_hot_store_modules_import_only_the_standard_library() -> None:
    modules = all_modules()
    hot = [m for m in modules if layer_of(m) == "guards"] + [f"overstory.store.{m}" for m in STORE_HOT_MODULES]
    problems = []
    for module in hot:
        for target in imports_of(modules[module].read_text(encoding="utf-8"), module, modules, top_level_only=True):
            root = target.split(".")[0]
            if root == "overstory":
                if layer_of(module) == "guards" and not (layer_of(target) == "guards"
                                                         or target in NO_IMPORT_MODULES | STDLIB_ONLY_MODULES):
                    problems.append(f"{module} imports {target}")
            elif root not in sys.stdlib_module_names and root != "__future__":
                problems.append(f"{module} imports {target}")
    assert problems == []


def test_only_store_runs_sql() -> None:
    """Every query lives in a named function of ``store/`` (ARCHITECTURE: store/ is the only SQL writer)."""
    assert sql_outside_store() == []
    assert set(SQL_OUTSIDE_STORE) <= set(all_modules())  # an exception names a module that exists


def test_executors_import_no_agents_store_or_cli() -> None:
    """Where a turn runs knows nothing of agents: the agent loop hands it a command (``executors.base``)."""
    assert forbidden_imports(ov_graph(), "executors", {"agents", "store", "cli", "ui", "runtimes", "merge"}) == []


def test_only_the_ray_executor_imports_ray_and_only_inside_functions() -> None:
    modules = all_modules()
    users, at_top = set(), set()
    for module, path in modules.items():
        source = path.read_text(encoding="utf-8")
        if any(target == "ray" or target.startswith("ray.") for target in imports_of(source, module, modules)):
            users.add(module)
        if any(target == "ray" or target.startswith("ray.")
               for target in imports_of(source, module, modules, top_level_only=True)):
            at_top.add(module)
    assert users <= {"overstory.executors.ray_executor", "overstory.executors.ray_hub", "overstory.executors.ray_doctor"}
    assert at_top == set()


def test_no_module_is_over_600_lines() -> None:
    long = {name: n for name, path in all_modules().items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}


# ---- the checker itself catches what it should ----------------------------------------------


def test_a_store_module_importing_agents_is_caught() -> None:
    modules = {**all_modules(), "overstory.store.fake": PACKAGE / "store" / "fake.py"}
    for line in ("from overstory.agents import spawn", "from overstory.agents.spawn import sling",
                 "import overstory.runtimes.claude", "from ..agents import loop"):
        graph = ov_graph()
        graph["overstory.store.fake"] = {target for target in imports_of(line + "\n", "overstory.store.fake", modules)
                                         if target in modules}
        assert forbidden_imports(graph, "store", {"agents", "runtimes"}, allowed=_store_may_import), line


def test_a_lazy_import_inside_a_function_counts_but_type_checking_does_not() -> None:
    modules = all_modules()
    source = ("import typing as t\nif t.TYPE_CHECKING:\n    from overstory.agents import spawn\n"
              "def f():\n    from overstory.agents.loop import AgentLoop\n")
    found = imports_of(source, "overstory.runtimes.fake", modules)
    assert "overstory.agents.loop" in found and "overstory.agents.spawn" not in found


def test_sql_outside_a_store_function_is_caught() -> None:
    source = ("def f(conn, self, tx):\n    conn.execute('SELECT 1')\n    self.state.executemany('x', [])\n"
              "    with tx:\n        tx.executescript('y')\n    return pool.submit(run)\n")
    assert sql_calls(source) == [2, 3, 5]
    assert sql_calls("execute('SELECT 1')\nconn.fetchone()\n") == []


def test_a_circle_is_found() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("module", sorted(m for m in all_modules() if not m.endswith("__main__")))
def test_every_module_imports(module: str) -> None:
    __import__(module)


def test_modules_that_guards_may_import_import_nothing() -> None:
    modules = all_modules()
    for module in NO_IMPORT_MODULES - {"overstory"}:
        assert imports_of(modules[module].read_text(encoding="utf-8"), module, modules) == set(), module
    for module in STDLIB_ONLY_MODULES:
        imported = imports_of(modules[module].read_text(encoding="utf-8"), module, modules)
        assert {name for name in imported if name.split(".")[0] not in sys.stdlib_module_names} == set(), module
