"""An idle agent loop imports only what it uses (issue 34: <= 10 MiB Pss, so 100 idle agents fit in 1 GiB).

``inspect`` (with ``ast``, ``dis`` and ``tokenize``, about 1 MiB) comes with ``dataclasses`` only for a
dataclass without a docstring, and the loop defers it (``overstory.deferred``); ``secrets`` and
``hashlib`` (OpenSSL's libcrypto) are imported where a token or a hash is made; programs are looked up
with ``procs.which``, not shutil's (which brings bz2 and lzma); standard modules the loop has a lighter way
to do without are left out too (``NOT_IN_AN_IDLE_LOOP``). The loop's own
``-X importtime`` report (PYTHONPROFILEIMPORTTIME, in its log) says what it imported.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from agent_helpers import agent_env, wait_for
from overstory.config.load import load
from overstory.paths import ProjectPaths

NOT_IN_AN_IDLE_LOOP = ("inspect", "ast", "dis", "tokenize", "secrets", "hashlib", "shutil", "bz2", "lzma",
                       "pydantic", "yaml",
                       # issue 34's last round: pathlib's urllib.parse (with ipaddress) is deferred until Path.as_uri;
                       # SQLite through its C module (the package brings datetime); jsontext, not the json package;
                       # _queue's SimpleQueue without queue.py; base64 only for a turn on another machine
                       "urllib.parse", "ipaddress", "sqlite3", "datetime", "json", "queue", "heapq", "base64",
                       # 2026-12-07: typing is deferred (its modules use it for annotations and TYPE_CHECKING alone),
                       # and locale (subprocess uses its getencoding alone, which is _locale's)
                       "typing", "locale",
                       # budgets: a turn past a limit parks with agents.budgeting (and its store.runs), others need neither
                       "overstory.agents.budgeting", "overstory.store.runs")


def test_an_idle_loop_imports_none_of_what_it_does_not_use(project: ProjectPaths, tmp_path: Path) -> None:
    from overstory.agents.spawn import SlingRequest, sling
    from overstory.store import sessions
    from overstory.store.db import open_state

    scenario = tmp_path / "idle.json"
    # As bench figure 6's idle scouts: one tool call (through the guard and the endpoint), then waiting for mail.
    scenario.write_text(json.dumps({"turns": [{"actions": [
        {"bash": "ov mail send --to operator --subject 'waiting for review' --body \"arenas: ${MALLOC_ARENA_MAX:-unset}\""}],
        "result": "waiting for mail"}]}))
    config = load(project.config_file, project.local_config_file, environ={})
    conn = open_state(project.state_db)
    try:
        result = sling(project, config, conn, SlingRequest(capability="scout", task_id="idle", runtime="scripted",
                                                           scenario=scenario),
                       environ={**agent_env(), "PYTHONPROFILEIMPORTTIME": "1"})

        def idle() -> sessions.Session | None:
            agent = sessions.get(conn, result.name)
            return agent if agent is not None and agent.state == "between_turns" and agent.turns == 1 else None

        wait_for(idle, 60, message="the scout's first turn to end")
        sent = conn.execute("SELECT body FROM mail WHERE recipient = 'operator' AND subject = 'waiting for review'")
        # the turn's tool call went through the guard and the endpoint; the turn's command has the launch environment
        assert [row[0] for row in sent.fetchall()] == ["arenas: unset"]
        loop = sessions.get(conn, result.name)
        assert loop is not None and loop.loop_pid
        loop_env = Path(f"/proc/{loop.loop_pid}/environ").read_bytes().split(b"\0")
        assert b"MALLOC_ARENA_MAX=1" in loop_env  # one malloc arena for the loop's threads (agents.process)
        # the endpoint's pooled connections were closed after the turn: the loop's own are left, one per database
        # (counted by their WAL files: SQLite keeps a closed connection's database file open for the next one
        # while another connection of the process holds a lock on it)
        def journals() -> list[str]:
            files = [os.readlink(fd) for fd in Path(f"/proc/{loop.loop_pid}/fd").iterdir()]
            return sorted(Path(f).name for f in files if f.endswith(".db-wal"))

        wait_for(lambda: journals() == ["events.db-wal", "state.db-wal"], 10, message="the endpoint's pool to close")
    finally:
        conn.close()
    log = (project.run_dir / result.name / "loop.log").read_text()
    imported = set(re.findall(r"^import time:[^|]*\|[^|]*\| +(\S+)$", log, re.MULTILINE))
    assert {"overstory.agents.process", "overstory.agents.turns", "dataclasses"} <= imported  # the report is there
    assert sorted(imported & set(NOT_IN_AN_IDLE_LOOP)) == []


def test_which_finds_what_shutil_finds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from overstory.procs import which

    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    (tmp_path / "first" / "tool").write_text("not executable")
    (tmp_path / "first" / "folder").mkdir()
    for folder in ("first", "second"):
        (tmp_path / folder / "prog").write_text("#!/bin/sh\n")
    (tmp_path / "second" / "prog").chmod(0o755)
    (tmp_path / "second" / "tool").write_text("#!/bin/sh\n")
    (tmp_path / "second" / "tool").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'first'}:{tmp_path / 'second'}:/usr/bin:/bin")
    for name in ("prog", "tool", "folder", "sh", "no-such-program", str(tmp_path / "second" / "prog"),
                 str(tmp_path / "first" / "prog"), str(tmp_path / "first"), "/bin/sh"):
        assert which(name) == shutil.which(name), name
    assert which("tool") == str(tmp_path / "second" / "tool")


def test_pathlib_works_with_url_parsing_deferred() -> None:
    """The loop defers urllib.parse before pathlib binds ``quote_from_bytes``: nothing is imported until a call
    needs it, and then every way of reaching the module gets the real one."""
    import subprocess
    import sys

    code = ("import sys\nfrom overstory.deferred import defer\ndefer('urllib.parse', 'quote_from_bytes')\n"
            "import pathlib\nassert 'ipaddress' not in sys.modules\n"
            "assert type(sys.modules['urllib.parse']).__name__ == '_Deferred'\n"
            "print(pathlib.Path('/tmp/a b').as_uri())\nassert 'ipaddress' in sys.modules\n"
            "import urllib.parse\nprint(urllib.parse.urlsplit('http://h/p?q').query)\n"
            "from urllib.parse import quote\nprint(quote('x y'), urllib.parse.quote_from_bytes(b'z w'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["file:///tmp/a%20b", "q", "x%20y z%20w"]


def test_typing_and_locale_deferred_as_the_loop_defers_them() -> None:
    """The loop's stand-in for typing: ``TYPE_CHECKING`` without loading it; any other name loads it; false (as
    if not imported) while it is not, so that defining a dataclass does not load it to look for ClassVars. Its
    stand-in for locale gives subprocess ``getencoding`` (``_locale``'s) without loading it."""
    import subprocess
    import sys

    code = ("from __future__ import annotations\nimport sys\nfrom overstory.deferred import defer\n"
            "defer('typing', constants={'TYPE_CHECKING': False})\n"
            "import _locale\ndefer('locale', constants={'getencoding': _locale.getencoding})\n"
            "import typing as t\nfrom dataclasses import dataclass, fields\n"
            "@dataclass\nclass A:\n    a: t.Any = 1\n"
            "assert t.TYPE_CHECKING is False and not t and type(sys.modules['typing']).__name__ == '_Deferred'\n"
            "from overstory.runtimes.prices import Tokens\nfrom overstory.endpoint import server, routes\n"
            "from overstory.agents import turns, turn_stream\nfrom overstory.executors import base\n"
            "assert Tokens(1) + Tokens(2, 3) == (3, 3, 0, 0) and Tokens(1, 2).total == 3\n"
            "assert type(sys.modules['typing']).__name__ == '_Deferred' and not t\n"
            "print([f.name for f in fields(A)], t.cast(int, 3), t.Mapping.__name__, bool(t))\n"
            "import typing\nassert sys.modules['typing'] is typing and typing.TYPE_CHECKING is False\n"
            # locale as the loop defers it: subprocess's text mode asks it for the encoding without loading it
            "import subprocess\n"
            "assert subprocess.run(['echo', 'é'], capture_output=True, text=True).stdout == 'é\\n'\n"
            "assert type(sys.modules['locale']).__name__ == '_Deferred'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["['a']", "3", "Mapping", "True"]


def test_no_dataclass_has_a_class_variable() -> None:
    """``dataclasses`` finds a ``t.ClassVar`` annotation only where typing is imported; in an agent loop it is
    deferred (``overstory.deferred``), so such a field would be a field there: ov's dataclasses have none."""
    import ast

    source = Path(__file__).resolve().parent.parent / "src" / "overstory"
    found = []
    for path in source.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any("dataclass" in ast.unparse(d) for d in node.decorator_list):
                found += [f"{path.name}: {node.name}.{ast.unparse(item.target)}" for item in node.body
                          if isinstance(item, ast.AnnAssign) and "ClassVar" in ast.unparse(item.annotation)]
    assert found == []


def test_freed_memory_goes_back_to_the_system() -> None:
    """``give_back_memory`` (the loop's, after each turn): what was freed in holes of the heap leaves the process."""
    import subprocess
    import sys

    code = ("from overstory.agents.process import give_back_memory\n"
            "def dirty():\n"
            "    return next(int(line.split()[1]) for line in open('/proc/self/smaps_rollup')\n"
            "                if line.startswith('Private_Dirty'))\n"
            "chunks = [bytes(3000) for _ in range(20000)]\n"
            "kept = chunks[::16]\n"
            "del chunks\n"
            "before = dirty()\n"
            "assert give_back_memory() and give_back_memory()\n"
            "print(before - dirty())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 20_000  # KiB: most of the 57 MiB freed in 45 KiB holes


def test_without_malloc_trim_nothing_is_done(monkeypatch: pytest.MonkeyPatch) -> None:
    import _ctypes

    from overstory.agents import process

    def no_such_symbol(handle: int, name: str) -> int:
        raise OSError(f"undefined symbol: {name}")

    monkeypatch.setattr(process, "_malloc_trim", None)
    monkeypatch.setattr(_ctypes, "dlsym", no_such_symbol)
    assert process.give_back_memory() is False and process.give_back_memory() is False


def test_after_a_turn_the_loop_opens_its_databases_anew(project: ProjectPaths, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its own connections are opened anew after each turn (the turn's statements and pages go with the old
    ones), as durable as before; where one cannot be opened, the loop keeps the ones it has."""
    import signal

    from overstory.agents import loop as loop_module
    from overstory.agents import process
    from overstory.errors import StoreError
    from overstory.store import sessions
    from overstory.store.db import open_state

    conn = open_state(project.state_db)
    try:
        generation = sessions.create_session(conn, name="scout-idle", capability="scout", task_id="idle", runtime="scripted",
                                        actor="test", parent="operator", depth=0)
    finally:
        conn.close()
    handlers = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    loop = loop_module.AgentLoop(project, "scout-idle", generation)
    try:
        old = (loop.state, loop.events)
        loop._give_back_memory()
        assert loop.state is not old[0] and loop.events is not old[1]
        for closed in old:
            with pytest.raises(Exception, match="closed"):
                closed.execute("SELECT 1")
        for new in (loop.state, loop.events):
            pragmas = [new.execute(f"PRAGMA {name}").fetchone()[0]
                       for name in ("journal_mode", "busy_timeout", "synchronous", "foreign_keys")]
            assert pragmas == ["wal", 10_000, 1, 1]  # as open_state and open_events make them
        assert loop.current() is not None

        def refused(path: object) -> object:
            raise StoreError(f"cannot open {path}: disk I/O error")

        monkeypatch.setattr(process, "open_events", refused)
        kept = (loop.state, loop.events)
        loop._give_back_memory()
        assert (loop.state, loop.events) == kept and loop.current() is not None
    finally:
        loop.close()
        for number, handler in handlers.items():
            signal.signal(number, handler)
