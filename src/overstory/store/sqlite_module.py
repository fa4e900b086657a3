"""``_sqlite3``, the C module behind the ``sqlite3`` package, loaded as cheaply as a hot command needs.

The package only adds date and datetime adapters, which ov never stores, and imports
``datetime`` for them; the C module has the same ``connect``, ``Row`` and errors
(``sqlite3.connect is _sqlite3.connect``). Loading the C module, CPython 3.11 to 3.13 also
import ``functools`` for one name, ``lru_cache`` (each connection's statement cache), and
``functools`` brings ``collections``, ``operator``, ``reprlib`` and ``types``: about a third
of a hot command's own start-up time (bench figure 1), for modules the hot commands never use.

So, in a process that has not imported ``functools`` yet, the C module is given a
``functools`` holding only ``lru_cache``, built on the same C cache (``_functools``)
the real one wraps, and the real module takes its place in ``sys.modules`` at once. A
process that already has ``functools`` (any that has started a thread: ``threading``
imports it) just imports the module; so does any interpreter where this would not work.
"""

from __future__ import annotations

import sys

__all__ = ["sqlite3"]


def _load() -> object:
    if "functools" in sys.modules or "_sqlite3" in sys.modules:
        import _sqlite3

        return _sqlite3
    try:
        import _functools
    except ImportError:  # pragma: no cover - every CPython has it
        import _sqlite3

        return _sqlite3

    def cache_info(*numbers: object) -> tuple[object, ...]:  # (hits, misses, maxsize, currsize); never asked for
        return numbers

    def lru_cache(maxsize: int | None = 128, typed: bool = False) -> object:
        def decorating(function: object) -> object:
            return _functools._lru_cache_wrapper(function, maxsize, typed, cache_info)

        return decorating

    stand_in = type(sys)("functools")
    stand_in.lru_cache = lru_cache  # type: ignore[attr-defined]
    sys.modules["functools"] = stand_in
    try:
        import _sqlite3
    except Exception:  # noqa: BLE001 - a C module that wants more of functools: import it plainly
        sys.modules.pop("functools", None)
        sys.modules.pop("_sqlite3", None)
        import _sqlite3
    finally:
        if sys.modules.get("functools") is stand_in:
            del sys.modules["functools"]
    return _sqlite3


TYPE_CHECKING = False
if TYPE_CHECKING:
    import sqlite3
else:
    try:
        sqlite3 = _load()
    except ImportError:  # pragma: no cover - an interpreter that only ships the package
        import sqlite3
