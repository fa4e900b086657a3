"""``records.Record`` behaves like the frozen dataclass it replaces on the hot path; ``records.NamedTuple`` like
``typing.NamedTuple``."""

from __future__ import annotations

import copy
import pickle
from dataclasses import FrozenInstanceError, dataclass

import pytest

from overstory.records import NamedTuple, Record


class Point(Record):
    __slots__ = ("x", "y", "label")
    x: int
    y: int
    label: str | None


@dataclass(frozen=True)
class DataPoint:
    x: int
    y: int
    label: str | None


def test_built_positionally_or_by_keyword_like_a_dataclass() -> None:
    assert Point(1, 2, None) == Point(y=2, x=1, label=None) == Point(1, label=None, y=2)
    assert repr(Point(1, 2, "a")) == repr(DataPoint(1, 2, "a")).replace("DataPoint", "Point")
    for args, kwargs in [((1, 2), {}), ((1, 2, 3, 4), {}), ((1, 2, 3), {"x": 1}), ((1, 2, 3), {"z": 0})]:
        with pytest.raises(TypeError):
            DataPoint(*args, **kwargs)
        with pytest.raises(TypeError):
            Point(*args, **kwargs)


def test_equality_hashing_and_freezing_like_a_frozen_dataclass() -> None:
    a, b, c = Point(1, 2, "a"), Point(1, 2, "a"), Point(1, 3, "a")
    assert a == b and hash(a) == hash(b) and a != c and len({a, b, c}) == 2
    assert a != DataPoint(1, 2, "a") and (a == (1, 2, "a")) is False
    with pytest.raises(AttributeError):
        a.x = 5  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        DataPoint(1, 2, "a").x = 5  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del a.x
    with pytest.raises(TypeError):
        hash(Point(1, 2, {"unhashable": []}))  # type: ignore[arg-type]


def test_copies_and_pickles() -> None:
    a = Point(1, 2, "a")
    assert pickle.loads(pickle.dumps(a)) == a and copy.copy(a) == a and copy.deepcopy(a) == a


def test_named_tuple_makes_what_typing_makes() -> None:
    """``records.NamedTuple`` (an agent loop's, without typing) builds the class ``typing.NamedTuple`` builds."""
    import typing

    class Light(NamedTuple):
        """Counts."""

        a: int
        b: int = 2
        c: str = "c"

        def total(self) -> int:
            return self.a + self.b

        @property
        def twice(self) -> int:
            return 2 * self.a

    class Typed(typing.NamedTuple):
        """Counts."""

        a: int
        b: int = 2
        c: str = "c"

        def total(self) -> int:
            return self.a + self.b

        @property
        def twice(self) -> int:
            return 2 * self.a

    for kind in (Light, Typed):
        value = kind(1)
        assert value == (1, 2, "c") and tuple(value) == (1, 2, "c") and value[1] == 2
        assert value.total() == 3 and value.twice == 2 and kind(4, c="x") == (4, 2, "x")
        assert kind._fields == ("a", "b", "c") and kind._field_defaults == {"b": 2, "c": "c"}
        assert kind.__doc__ == "Counts." and kind.__mro__[1:] == (tuple, object)
        assert kind.__qualname__.endswith(kind.__name__) and kind.__module__ == __name__
        assert value._replace(b=5) == kind(1, 5) and type(value._replace(b=5)) is kind
        assert value._asdict() == {"a": 1, "b": 2, "c": "c"}
        assert pickle.loads(pickle.dumps(GLOBAL_LIGHT)) == GLOBAL_LIGHT
        assert not hasattr(value, "__dict__")
        with pytest.raises(TypeError):
            kind()  # type: ignore[call-arg]
        with pytest.raises(AttributeError):
            value.a = 3  # type: ignore[misc]
    assert repr(Light(1)) == repr(Typed(1)).replace("Typed", "Light")
    with pytest.raises(TypeError):
        class Unordered(NamedTuple):
            a: int = 0
            b: int  # type: ignore[misc]
    with pytest.raises(AttributeError):
        class Overwrites(NamedTuple):
            a: int

            def _replace(self) -> None:  # type: ignore[override]
                pass


class _GlobalLight(NamedTuple):
    x: int
    y: int = 0


GLOBAL_LIGHT = _GlobalLight(3)


class WithDefaults(Record):
    __slots__ = ("a", "b", "c")
    _defaults = {"b": 2, "c": None}
    a: int
    b: int
    c: str | None


@dataclass(frozen=True)
class DataWithDefaults:
    a: int
    b: int = 2
    c: str | None = None


def test_defaults_as_a_dataclass_has_them() -> None:
    for kind in (WithDefaults, DataWithDefaults):
        assert kind(1) == kind(1, 2, None) == kind(a=1) == kind(1, c=None)  # type: ignore[call-arg]
        assert kind(1, 3).b == 3 and kind(1, c="x").c == "x" and kind(a=0, b=1, c="y").c == "y"  # type: ignore[call-arg]
        with pytest.raises(TypeError):
            kind()  # type: ignore[call-arg]
        with pytest.raises(TypeError):
            kind(b=3)  # type: ignore[call-arg]
    assert repr(WithDefaults(1)) == repr(DataWithDefaults(1)).replace("DataWithDefaults", "WithDefaults")
    assert Point(1, 2, None) == Point(x=1, y=2, label=None)  # no defaults: every field is needed
    with pytest.raises(TypeError):
        Point(1, 2)  # type: ignore[call-arg]
