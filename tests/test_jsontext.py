"""overstory.jsontext must read and write exactly what the json package does, for every option it takes."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overstory import jsontext

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text())
documents = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.tuples(inner, inner),
    st.dictionaries(st.text(max_size=8), inner, max_size=5)), max_leaves=40)
keyed = st.dictionaries(st.one_of(st.text(max_size=4), st.integers(), st.booleans(), st.none(),
                                  st.floats(allow_nan=False)), scalars, max_size=6)


@settings(max_examples=300, deadline=None)
@given(documents, st.booleans(), st.booleans(), st.sampled_from([None, 0, 2, 4]),
       st.sampled_from([None, (",", ":"), (", ", ": ")]))
def test_dumps_writes_what_json_dumps_writes(document, ensure_ascii, sort_keys, indent, separators):
    options = {"ensure_ascii": ensure_ascii, "indent": indent, "separators": separators}
    try:
        expected = json.dumps(document, sort_keys=sort_keys, **options)
    except TypeError:  # keys of mixed types cannot be sorted: both must refuse
        with pytest.raises(TypeError):
            jsontext.dumps(document, sort_keys=sort_keys, **options)
        return
    assert jsontext.dumps(document, sort_keys=sort_keys, **options) == expected


@settings(max_examples=200, deadline=None)
@given(keyed, st.sampled_from([None, 2]))
def test_keys_of_every_kind_are_written_as_json_writes_them(document, indent):
    assert jsontext.dumps(document, indent=indent) == json.dumps(document, indent=indent)


@settings(max_examples=300, deadline=None)
@given(documents, st.sampled_from([None, 2]), st.sampled_from(["", " ", "\n\t "]))
def test_loads_reads_what_json_loads_reads(document, indent, padding):
    text = padding + json.dumps(document, indent=indent) + padding
    assert jsontext.loads(text) == json.loads(text)
    assert jsontext.loads(text.encode("utf-8")) == json.loads(text.encode("utf-8"))


@pytest.mark.parametrize("text", ["", "   ", "{", '{"a": }', "[1, 2] x", "nul", "\ufeff{}", '"\x01"', "{} {}",
                                  "01", '{"a" 1}'])
def test_bad_text_raises_the_json_packages_own_error(text):
    with pytest.raises(json.JSONDecodeError) as expected:
        json.loads(text)
    with pytest.raises(json.JSONDecodeError) as got:
        jsontext.loads(text)
    assert str(got.value) == str(expected.value)


def test_specials_defaults_and_refusals_match():
    specials = [math.nan, math.inf, -math.inf, 1e300, -0.0, 2**80]
    for indent in (None, 2):
        assert jsontext.dumps(specials, indent=indent) == json.dumps(specials, indent=indent)
    assert jsontext.loads("[NaN, Infinity, -Infinity]")[1:] == [math.inf, -math.inf]

    class Thing:
        def __str__(self) -> str:
            return "a thing"

    for indent in (None, 2):
        assert jsontext.dumps({"x": Thing()}, default=str, indent=indent) == json.dumps({"x": Thing()}, default=str,
                                                                                        indent=indent)
        with pytest.raises(TypeError, match="Object of type Thing is not JSON serializable"):
            jsontext.dumps({"x": Thing()}, indent=indent)
    loop: list[object] = []
    loop.append(loop)
    for indent in (None, 2):
        with pytest.raises(ValueError, match="Circular reference"):
            jsontext.dumps(loop, indent=indent)
    assert jsontext.dumps([[], {}, [[]]], indent=2) == json.dumps([[], {}, [[]]], indent=2)


def test_importing_it_does_not_import_re_or_the_json_package():
    code = "import sys, overstory.jsontext as j; j.loads(j.dumps({'a': [1, 'é']}, indent=2)); print(sorted(" \
           "m for m in ('re', 'json', 'enum') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
