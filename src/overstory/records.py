"""``Record``: a frozen, dataclass-like class that costs nothing to define.

A dataclass generates and compiles its ``__init__``, ``__eq__`` and ``__repr__`` when the
class is defined, about a millisecond per class, plus importing ``dataclasses``. The hot
commands (`ov mail check`, `ov status`) are whole processes that must start in a few
milliseconds, so the rows they build (mail messages, events, the project's paths) are
Records instead: the fields are the class's ``__slots__``, in order.

``NamedTuple``: ``typing.NamedTuple`` without ``typing`` (which an agent loop defers: ``overstory.deferred``) and
without compiling each field's annotation into a ``ForwardRef`` (the first ``compile()`` in a process builds the
parser's node classes: 0.2 MiB of every agent loop). Modules import ``typing``'s under ``TYPE_CHECKING``, for mypy.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import typing as t


class Record:
    """Fields from ``__slots__``; built positionally or by keyword; compared, hashed and shown by value; frozen.
    ``_defaults``: values of the last fields, for a call that leaves them out (a dataclass's defaults)."""

    __slots__: tuple[str, ...] = ()
    _defaults: t.ClassVar[dict[str, t.Any]] = {}  # the values of the last fields when they are not given

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
        for name, value in self._defaults.items():
            values.setdefault(name, value)
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


_NAMED_TUPLE_OWN = frozenset({"__new__", "__init__", "__slots__", "__getnewargs__", "_fields", "_field_defaults",
                              "_make", "_replace", "_asdict", "_source"})  # typing refuses to overwrite these


class _NamedTupleType(type):
    def __new__(mcs, name: str, bases: tuple[type, ...], namespace: dict[str, t.Any]) -> t.Any:
        if not bases:  # ``NamedTuple`` itself
            return super().__new__(mcs, name, bases, namespace)
        if bases != (NamedTuple,):
            raise TypeError("a NamedTuple can only inherit from NamedTuple")
        from collections import namedtuple

        annotations = namespace.get("__annotations__", {})  # strings (``from __future__ import annotations``)
        defaults = [namespace[field] for field in annotations if field in namespace]
        if any(field not in namespace for field in list(annotations)[len(annotations) - len(defaults):]):
            raise TypeError(f"{name}: a field without a default cannot follow one with a default")
        made = namedtuple(name, tuple(annotations), defaults=defaults,  # type: ignore[misc]  # mypy: not a literal
                          module=namespace["__module__"])
        made.__annotations__ = dict(annotations)
        for key, value in namespace.items():
            if key in _NAMED_TUPLE_OWN:
                raise AttributeError(f"Cannot overwrite NamedTuple attribute {key}")
            if key not in ("__module__", "__annotations__") and key not in annotations:
                setattr(made, key, value)
        return made


class NamedTuple(metaclass=_NamedTupleType):
    """``class Point(NamedTuple): x: int; y: int = 0`` makes what ``typing.NamedTuple`` makes: a
    ``collections.namedtuple`` class with the annotated fields (in order), their defaults, and the class's methods."""
