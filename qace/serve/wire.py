"""JSON on the wire, for the reward service and its client: orjson's speed, `json`'s reach.

`dumps` writes compact UTF-8 JSON with orjson. Text that is not valid Unicode (a lone surrogate, which
orjson refuses) makes it fall back to `json.dumps`, which writes ASCII with ``\\ud800``-style escapes.
orjson writes a non-finite float as ``null``: callers keep them out (the service refuses a non-finite
score where it enters, `qace.serve.app.create_app`'s ``score_items``; a reward's ``invalid_reward`` is
finite).

`loads` reads with orjson; what orjson refuses (``\\ud800`` escapes, ``NaN`` literals, nesting over
1,024 levels) it reads with `json.loads`. So it reads what `json.loads` reads, to the same values, and
raises what `json.loads` raises (`ValueError`, `RecursionError`), with one exception: orjson reads an
integer over 64 bits as a float. The client reads the service's answers with it (no such integers);
the service reads requests, where a client may send anything, with `json.loads`.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def dumps(value: Any) -> bytes:
    """``value`` as compact JSON bytes; `ValueError` for a non-finite float only on the fallback path."""
    try:
        return orjson.dumps(value)
    except TypeError:  # a lone surrogate, or what orjson cannot write (an int over 64 bits)
        return json.dumps(value, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode()


def loads(data: bytes | bytearray | str) -> Any:
    """The value of the JSON text ``data``."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)
