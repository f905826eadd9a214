"""Row counts for matrix products whose shapes change from call to call.

cuBLAS picks a kernel for each new problem shape by a heuristic query, then caches the choice. On an
H200 a bf16 product of a shape met before cost 20-25 us of host time, one of a new shape 230-1,190 us
(docs/performance.md, "Reward latency"). An encoder's products have as many rows as its batch has
tokens, rows times width, which a reward call almost never repeats: each product of a call's encoders
paid the query again, about a millisecond per encoder and more than the GPU's work at 64 captions.

`padded_rows` rounds a row count up to one of 32 steps per power of two: at most 3.1% more rows (filled
with zeros, computed and dropped), and few enough shapes that the queries are cached after the first
calls. Rows are independent in a matrix product, so the kept rows are the same computation; in half
precision cuBLAS may pick another kernel for the longer product, so their last bits may change, as they
do whenever a batch's composition does.
"""

from __future__ import annotations

STEPS_PER_OCTAVE = 32
"""Row counts allowed between two powers of two."""
FEWEST = 64
"""Smaller counts all become this one."""


def padded_rows(n: int) -> int:
    """``n`` rounded up to the next multiple of ``2 ** (bit_length(n) - 6)`` (32 steps per power of
    two), at least `FEWEST`: ``n <= padded_rows(n) <= max(FEWEST, n * 33 / 32)``."""
    if n <= FEWEST:
        return FEWEST
    octave = n.bit_length() - 1  # 2 ** octave <= n < 2 ** (octave + 1)
    step = 1 << (octave - (STEPS_PER_OCTAVE.bit_length() - 1))  # n // step in [32, 64)
    return -(-n // step) * step


def row_counts(up_to: int) -> list[int]:
    """Every count `padded_rows` gives for 1 to ``up_to`` rows, ascending (what a warm-up runs the
    products at, so that no call meets a new one)."""
    counts = [FEWEST]
    while counts[-1] < up_to:
        counts.append(padded_rows(counts[-1] + 1))
    return counts
