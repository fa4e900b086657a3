"""Standard modules loaded only when something really uses them (``defer``).

``inspect`` and ``copy`` are imported by ``dataclasses`` for things ov's processes rarely do (the
docstring of a dataclass without one; ``asdict``/``replace``): ``inspect`` brings ``ast``, ``dis``
and ``tokenize`` with it. The hot commands (``cli.fast``) and the agent loop (a resident process
per agent: its memory counts 50 times) put stand-ins in ``sys.modules`` instead, which import the
real module on first attribute access.

A module that is imported only for a function another module binds by name when it is imported
(``pathlib`` does ``from urllib.parse import quote_from_bytes``, for ``Path.as_uri``) is deferred
with that function named: the stand-in offers it, and its first call imports the real module.

A stand-in may also offer constants: the real module's own values (``defer_in_an_agent_loop``: typing's
``TYPE_CHECKING``, locale's ``getencoding``).
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import typing as t


class _Deferred(type(sys)):  # type: ignore[misc]  # types.ModuleType, without importing types
    """A stand-in in ``sys.modules`` that imports the real module on first attribute access."""

    def _load(self) -> t.Any:
        name = str(self.__name__)
        real = sys.modules.get(name)
        if real is None or real is self:
            sys.modules.pop(name, None)
            import importlib

            real = importlib.import_module(name)
            self.__dict__.update(real.__dict__)  # modules that imported the stand-in now see the real thing
        return real

    def __getattr__(self, attribute: str) -> object:
        if attribute == "__path__":  # asked by `from NAME import x`: a module (never a package here) has none
            raise AttributeError(attribute)
        return getattr(self._load(), attribute)

    def __bool__(self) -> bool:
        """False while the module is not imported (this stand-in is what ``sys.modules`` holds), as if it were
        absent. ``dataclasses`` asks ``sys.modules.get("typing")`` whether a field's annotation could be a
        ``typing.ClassVar``; none can before ``typing`` is imported (no ov dataclass has one:
        tests/test_idle_loop_imports.py), so it does not load it to ask."""
        return sys.modules.get(str(self.__name__)) is not self


DEFERRED = ("inspect", "copy")


def _on_first_call(stand_in: _Deferred, function: str) -> t.Callable[..., t.Any]:
    def call(*args: t.Any, **kwargs: t.Any) -> t.Any:
        return getattr(stand_in._load(), function)(*args, **kwargs)

    call.__name__ = call.__qualname__ = function
    return call


def defer(name: str, *functions: str, constants: t.Mapping[str, object] | None = None) -> None:
    """Put a stand-in for module ``name`` (a module, not a package) in ``sys.modules`` unless it is imported already.

    ``functions``: names the stand-in offers without importing anything; calling one imports the module.
    ``constants``: values the stand-in offers as they are (the real module's own, which replace them once loaded).
    A submodule's stand-in is also set on its package, as an import of the submodule would set it.
    """
    if name in sys.modules:
        return
    stand_in = _Deferred(name)
    for function in functions:
        setattr(stand_in, function, _on_first_call(stand_in, function))
    for constant, value in (constants or {}).items():
        setattr(stand_in, constant, value)
    sys.modules[name] = stand_in
    package, _, child = name.rpartition(".")
    if package:
        __import__(package)
        setattr(sys.modules[package], child, stand_in)


def defer_in_an_agent_loop() -> None:
    """What an agent loop defers besides ``DEFERRED``, before it imports anything else (issue 34).

    ``typing``: the loop's modules import it for their annotations (``from __future__ import annotations`` never
    evaluates them) and for ``t.TYPE_CHECKING``, which the stand-in offers: 0.5 MiB. ``locale``: ``subprocess``
    imports it (with its alias tables: 0.15 MiB) for ``getencoding()`` alone, which is ``_locale``'s own.
    """
    import _locale

    defer("typing", constants={"TYPE_CHECKING": False})
    defer("locale", constants={"getencoding": _locale.getencoding})
