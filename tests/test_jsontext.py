"""overstory.jsontext must read and write exactly what the json package does, for every option it takes."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import typing as t

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


# ---- malformed input: the same accept/reject decision and the same error as json.loads ----------

# Pieces of JSON and of things that look like it: structure, escapes (surrogate halves, pairs, broken ones),
# the constants json.loads accepts (NaN, Infinity) and near misses, numbers large and malformed, whitespace
# JSON allows and whitespace it does not, control characters and raw surrogates.
PIECES = ["{", "}", "[", "]", ",", ":", '"', '"a"', '"é"', "\\", "\\u", "\\ud800", "\\udc00", "\\uDBFF\\uDFFF",
          "\\ud83d\\ude00", "\\ud83d", "\\u12", "\\uZZZZ", "\\x41", '\\"', "\\n", "\\/", "u", "0", "1", "-", "+", ".",
          "e", "E", "1e999", "-1e-999", "1.5e+3", "01", "-0", "1.", ".5", "1e", "9" * 400, "9" * 4400, "NaN",
          "Infinity", "-Infinity", "-NaN", "+Infinity", "nan", "inf", "Infinityx", "true", "tru", "false", "null",
          "nul", " ", "\t", "\n", "\r", "\f", "\v", "\x00", "\x1f", "\x7f", "\u00a0", "\u2028", "\ufeff", "\ud800",
          "é", "€", "\U0001f600"]
WHITESPACE_ANY = st.text(alphabet=" \t\n\r\f\v\u00a0\ufeff", max_size=3)


def _mutate(text: str, edits: list[tuple[int, int, str]]) -> str:
    for kind, where, piece in edits:
        at = where % (len(text) + 1)
        if kind == 0:  # truncate
            text = text[:at]
        elif kind == 1:  # insert
            text = text[:at] + piece + text[at:]
        elif kind == 2:  # delete one character
            text = text[:at] + text[at + 1:]
        else:  # replace one character
            text = text[:at] + piece + text[at + 1:]
    return text


edits = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 10_000), st.sampled_from(PIECES)), max_size=3)
mutated = st.builds(lambda doc, indent, changes: _mutate(json.dumps(doc, indent=indent), changes),
                    documents, st.sampled_from([None, 1]), edits)
assembled = st.lists(st.sampled_from(PIECES), max_size=12).map("".join)
nested = st.builds(lambda depth, inner, close, tail: "[" * depth + inner + "]" * close + tail,
                   st.one_of(st.integers(0, 50), st.integers(900, 1100), st.just(60_000)),
                   st.sampled_from(["", "1", '{"a": 1}', "{", '"x', "NaN"]), st.integers(0, 60), st.sampled_from(
                       ["", " ", "]", ",", "x"]))
malformed = st.builds(lambda pad, body, trail: pad + body + trail, WHITESPACE_ANY,
                      st.one_of(mutated, assembled, nested), st.one_of(WHITESPACE_ANY, st.sampled_from(PIECES)))


def _outcome(loads: t.Callable[[t.Any], t.Any], text: t.Any) -> tuple[str, ...]:
    try:
        value = loads(text)
    except Exception as exc:  # noqa: BLE001 - the kind of error is what is compared
        kind = type(exc)
        return ("error", f"{kind.__module__}.{kind.__qualname__}", str(exc), str(isinstance(exc, ValueError)))
    return ("ok", repr(value))


def _fresh_process_loads(text: t.Any) -> t.Any:
    """``jsontext.loads`` as a hot command runs it: the json package not imported (``_json`` then cannot make its
    own error). The package's modules are put back afterwards, so the rest of the tests see the same objects."""
    saved = {name: module for name, module in sys.modules.items() if name == "json" or name.startswith("json.")}
    for name in saved:
        del sys.modules[name]
    try:
        return jsontext.loads(text)
    finally:
        for name in [n for n in sys.modules if n == "json" or n.startswith("json.")]:
            del sys.modules[name]
        sys.modules.update(saved)


@settings(max_examples=400, deadline=None)
@given(malformed)
def test_loads_decides_and_fails_as_json_loads_on_every_input(text):
    expected = _outcome(json.loads, text)
    assert _outcome(jsontext.loads, text) == expected
    assert _outcome(_fresh_process_loads, text) == expected  # a fresh import of json per call: the slow part
    raw = text.encode("utf-8", errors="surrogatepass")  # bytes are decoded as json.loads decodes them
    assert _outcome(jsontext.loads, raw) == _outcome(json.loads, raw)


@pytest.mark.parametrize("text", ["{", "[1", '{"a" 1}', '{"a":1,}', '"\\u12"', '"abc', '["\x01"]', "[1e999 x",
                                  "\ufeff{}", "9" * 5000, "[" * 2000])
def test_a_fresh_process_gets_the_json_packages_error_not_a_system_error(text):
    """The case the in-process comparison cannot show by itself: `ov mail send --payload "{"` printed
    ``SystemError: <_json.Scanner ...> returned NULL``."""
    code = ("import sys, overstory.jsontext as j\n"
            "try:\n    j.loads(sys.argv[1])\nexcept BaseException as e:\n"
            "    print(type(e).__module__ + '.' + type(e).__qualname__, e, sep='|')\n")
    done = subprocess.run([sys.executable, "-c", code, text], capture_output=True, text=True, check=True)
    try:
        json.loads(text)
    except Exception as exc:  # noqa: BLE001
        expected = f"{type(exc).__module__}.{type(exc).__qualname__}|{exc}"
    assert done.stdout.strip() == expected


BAD_PAYLOADS = ["{", "{nope", '{"a":1,}', '{"a": "\\ud800x\\u12"}', '{"a": 1} trailing', '{"a": NaN', "[" * 3]


@pytest.mark.parametrize("payload", BAD_PAYLOADS)
def test_ov_mail_send_with_a_malformed_payload_is_a_usage_error(project, state_db, payload):
    from conftest import run_ov

    done = run_ov("mail", "send", "--to", "operator", "--subject", "s", "--payload", payload, cwd=project.root)
    with pytest.raises(json.JSONDecodeError) as expected:
        json.loads(payload)
    assert done.returncode == 2, done.stderr
    assert f"Error: Invalid value for --payload: not valid JSON: {expected.value}\n" in done.stderr
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr
    assert state_db.execute("SELECT count(*) FROM mail").fetchone()[0] == 0, "nothing was sent"
