"""Standard modules loaded only when something really uses them (``defer``).

``inspect`` and ``copy`` are imported by ``dataclasses`` for things ov's processes rarely do (the
docstring of a dataclass without one; ``asdict``/``replace``): ``inspect`` brings ``ast``, ``dis``
and ``tokenize`` with it. The hot commands (``cli.fast``) and the agent loop (a resident process
per agent: its memory counts 50 times) put stand-ins in ``sys.modules`` instead, which import the
real module on first attribute access.
"""

from __future__ import annotations

import sys


class _Deferred(type(sys)):  # type: ignore[misc]  # types.ModuleType, without importing types
    """A stand-in in ``sys.modules`` that imports the real module on first attribute access."""

    def __getattr__(self, attribute: str) -> object:
        name = str(self.__name__)
        if sys.modules.get(name) is self:
            del sys.modules[name]
        import importlib

        real = importlib.import_module(name)
        self.__dict__.update(real.__dict__)  # modules that imported the stand-in now see the real thing
        return getattr(real, attribute)


DEFERRED = ("inspect", "copy")


def defer(name: str) -> None:
    if name not in sys.modules:
        sys.modules[name] = _Deferred(name)
