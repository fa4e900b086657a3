"""``store.sqlite_module``: SQLite's C module without ``functools`` (and what ``functools`` brings) in hot commands.

Each case runs in a fresh interpreter: what matters is the order of first imports.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(code: str) -> None:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("ok"), done.stdout


def test_the_c_module_loads_without_functools_and_works_fully() -> None:
    _run("""
        import sys
        from overstory.store.sqlite_module import sqlite3
        assert sqlite3 is sys.modules["_sqlite3"]
        left_out = {"functools", "collections", "operator", "reprlib", "types"} & set(sys.modules)
        assert not left_out, left_out
        conn = sqlite3.connect(":memory:", isolation_level=None)
        conn.row_factory = sqlite3.Row
        conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
        for i in range(500):  # the same few statements again and again: the statement cache at work
            conn.execute("INSERT INTO t (v) VALUES (?)", (str(i),))
            assert conn.execute("SELECT v FROM t WHERE k = ?", (i + 1,)).fetchone()["v"] == str(i)
        try:
            conn.execute("INSERT INTO t (k) VALUES (1)")
        except sqlite3.IntegrityError:
            pass
        # Whoever imports functools later gets the real module, and the package works on the same C module.
        import functools
        assert functools.reduce(lambda a, b: a + b, [1, 2, 3]) == 6 and functools.partial and functools.wraps
        assert functools.lru_cache(maxsize=2)(lambda x: x * 2)(4) == 8
        import sqlite3 as package
        assert package.connect is sqlite3.connect and package.Row is sqlite3.Row
        print("ok")
    """)


def test_a_process_that_has_functools_imports_the_module_plainly() -> None:
    _run("""
        import functools, sys
        from overstory.store.sqlite_module import sqlite3
        assert sys.modules["functools"] is functools and sqlite3 is sys.modules["_sqlite3"]
        assert sqlite3.connect(":memory:").execute("SELECT 1").fetchone() == (1,)
        print("ok")
    """)


def test_a_c_module_that_wants_more_of_functools_is_imported_plainly() -> None:
    """If another CPython's ``_sqlite3`` asked ``functools`` for more than ``lru_cache``, its import fails against
    the stand-in: it is imported again against the real module (simulated by a finder that fails like that)."""
    _run("""
        import sys
        assert "functools" not in sys.modules

        class Picky:  # a meta path finder (importlib.abc would import functools itself)
            tries = 0
            def find_spec(self, name, path=None, target=None):
                if name != "_sqlite3":
                    return None
                Picky.tries += 1
                loaded = sys.modules.get("functools")  # the real C module imports it when it is not there
                if loaded is not None and not hasattr(loaded, "partial"):
                    raise AttributeError("module 'functools' has no attribute 'partial'")
                return None  # the normal finders load it

        sys.meta_path.insert(0, Picky())
        from overstory.store.sqlite_module import sqlite3
        assert Picky.tries == 2 and sys.modules["functools"].partial  # the real one, which the module imported
        assert sqlite3.connect(":memory:").execute("SELECT 2").fetchone() == (2,)
        print("ok")
    """)
