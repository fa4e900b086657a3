"""``Record``: a frozen, dataclass-like class that costs nothing to define.

A dataclass generates and compiles its ``__init__``, ``__eq__`` and ``__repr__`` when the
class is defined, about a millisecond per class, plus importing ``dataclasses``. The hot
commands (`ov mail check`, `ov status`) are whole processes that must start in a few
milliseconds, so the rows they build (mail messages, events, the project's paths) are
Records instead: the fields are the class's ``__slots__``, in order.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import typing as t


class Record:
    """Fields from ``__slots__``; built positionally or by keyword; compared, hashed and shown by value; frozen."""

    __slots__: tuple[str, ...] = ()

    def __init__(self, *args: t.Any, **kwargs: t.Any) -> None:
        names = self.__slots__
        if not kwargs and len(args) == len(names):  # the common case (rows read back): every field, in order
            for name, value in zip(names, args):
                object.__setattr__(self, name, value)
            return
        kind = type(self).__name__
        if len(args) > len(names):
            raise TypeError(f"{kind}() takes {len(names)} arguments but {len(args)} were given")
        values = dict(zip(names, args))
        for name, value in kwargs.items():
            if name not in names:
                raise TypeError(f"{kind}() got an unexpected keyword argument {name!r}")
            if name in values:
                raise TypeError(f"{kind}() got multiple values for argument {name!r}")
            values[name] = value
        missing = [name for name in names if name not in values]
        if missing:
            raise TypeError(f"{kind}() missing arguments: {', '.join(missing)}")
        for name in names:
            object.__setattr__(self, name, values[name])

    def _values(self) -> tuple[t.Any, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __setattr__(self, name: str, value: t.Any) -> None:
        raise AttributeError(f"cannot assign to field {name!r} of a {type(self).__name__}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r} of a {type(self).__name__}")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{n}={getattr(self, n)!r}' for n in self.__slots__)})"

    def __reduce__(self) -> tuple[t.Any, ...]:
        return (type(self), self._values())
