"""``records.Record`` behaves like the frozen dataclass it replaces on the hot path."""

from __future__ import annotations

import copy
import pickle
from dataclasses import FrozenInstanceError, dataclass

import pytest

from overstory.records import Record


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
