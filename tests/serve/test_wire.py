"""JSON on the wire (`qace.serve.wire`): orjson where it can, the standard library where it cannot."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("orjson")

from qace.serve import wire  # noqa: E402

TEXTS = [
    '{"request_id": "r", "items": [{"id": "0", "caption": "a dog", "references": ["a dog runs"]}]}',
    '["\\ud800", "a \\udfff b", "\\u00e9", "😀"]',  # lone surrogates: orjson refuses them, json reads them
    "[NaN, Infinity, -Infinity]",  # not JSON, but json.loads reads it
    "[0.1, 1e-05, 1e22, 5e-324, 1.7976931348623157e308, -0.0]",
    "[" * 1500 + "]" * 1500,  # deeper than orjson reads
    '{"a": 1, "a": 2}',
    "[1, 2",
    "",
    '"\\x"',
    b'{"caption": "\xc3\xa9"}',
    b'{"caption": "\xff"}',
]


def _outcome(read, text):
    try:
        return "value", json.dumps(read(text), allow_nan=True)  # NaN compared by its spelling
    except RecursionError:
        return "raised", "RecursionError"
    except ValueError:
        return "raised", "ValueError"


@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_loads_reads_what_json_loads_reads_to_the_same_values(text) -> None:
    assert _outcome(wire.loads, text) == _outcome(json.loads, text)
    if isinstance(text, str):
        assert _outcome(wire.loads, text.encode("utf-8", "surrogatepass")) == _outcome(json.loads, text)


def test_loads_reads_an_integer_over_64_bits_as_a_float() -> None:
    """The one value orjson reads differently (why the service reads requests with `json.loads`)."""
    assert wire.loads("[1180591620717411303424, 7]") == [1.1805916207174113e21, 7]
    assert json.loads("[1180591620717411303424]") == [1180591620717411303424]


VALUES = [
    {"results": [{"id": "0", "reward": 0.30000000000000004, "valid": True, "reason": None}]},
    [0.1, 1e-05, 1e22, 5e-324, 1.7976931348623157e308, -0.0, 2**63 - 1, -(2**63)],
    ["é", "😀", "a\x00b", 'q"uote\\'],
    {"id": "\udfff", "reason": "a dog\ud800"},  # orjson refuses: written with \ud800 escapes
    [2**70],  # over 64 bits: orjson refuses
]


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_dumps_writes_json_that_reads_back_to_the_same_value(value) -> None:
    data = wire.dumps(value)
    assert isinstance(data, bytes) and json.loads(data) == value and wire.loads(data) == value
    assert b"\n" not in data and b", " not in data and b": " not in data


def test_dumps_refuses_a_non_finite_float_only_where_orjson_cannot_write_the_value() -> None:
    """orjson writes NaN as null (the service keeps NaN out of what it sends); on the fallback path the
    standard library refuses it, as the service did before."""
    assert wire.dumps([float("nan")]) == b"[null]"
    with pytest.raises(ValueError, match="Out of range float"):
        wire.dumps([float("nan"), "\ud800"])
