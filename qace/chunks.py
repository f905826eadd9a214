"""How `qace.api.QACE` cuts an input into chunks: a fixed size (`take`) or tapered ends (`Tapered`)."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator

from qace.data.records import Record, RecordError


def take(iterator: Iterator[Record | RecordError], sizes: Iterator[int]) -> list[Record | RecordError]:
    """The next chunk: as many records as ``sizes`` says next."""
    return list(itertools.islice(iterator, next(sizes)))


class Tapered:
    """Chunks of an input longer than one chunk: the first three grow (an eighth, a quarter, half a
    chunk) so the device starts early (only the first chunk's parsing is waited for) and host
    processes fill up, and the last two chunks' worth shrink by halves down to an eighth, so the device
    is not left alone with the last chunk's host work. The cuts depend on the input only (never on
    timing or the design), so rows do too."""

    def __init__(self, iterator: Iterator[Record | RecordError], size: int) -> None:
        self.iterator, self.size = iterator, size
        self.buffer: deque[Record | RecordError] = deque()
        self.rising = [max(1, size // 8), max(1, size // 4), max(1, size // 2)]

    def _fill(self, n: int) -> None:
        self.buffer.extend(itertools.islice(self.iterator, max(0, n - len(self.buffer))))

    def next_chunk(self) -> list[Record | RecordError]:
        if self.rising:
            n = self.rising.pop(0)
        else:
            self._fill(2 * self.size)
            left, floor = len(self.buffer), max(1, self.size // 8)
            n = self.size if left >= 2 * self.size else left if left <= 2 * floor else -(-left // 2)
        self._fill(n)
        return [self.buffer.popleft() for _ in range(min(n, len(self.buffer)))]
