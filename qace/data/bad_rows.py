"""What every reader of records shares: a row that failed before its fields were checked, the columns
a record has, and the lone-surrogate test (text JSON escapes can carry but UTF-8 cannot encode)."""

from __future__ import annotations

import re
from typing import Any

RECORD_COLUMNS = ("id", "caption", "image_id", "image", "references")


class Bad:
    """A row that failed before field checks; carries the id when it could still be read."""

    def __init__(self, reason: str, record_id: Any = None) -> None:
        self.reason = reason
        self.record_id = record_id


SURROGATE = re.compile("[\ud800-\udfff]")


def has_surrogate(text: str) -> bool:
    """True when `text` holds a lone surrogate: bytes that were not valid UTF-8 (decoded with
    surrogateescape), or an unpaired JSON escape."""
    return not text.isascii() and SURROGATE.search(text) is not None
