"""Keep Python's cyclic garbage collector out of a chunk's hot loop.

A chunk allocates hundreds of thousands of short-lived containers (token lists, candidate lists, result
rows) that reference counting frees on its own. Each allocation burst still triggers the cyclic
collector, which then walks every object the process holds (models, tokenizers, spaCy): on an H100,
``benchmarks/profile.py`` measured 138 collections and 146 ms of pauses per 2,048-caption call, 8% of the
call. With the collector paused for the chunk, its cyclic garbage waits for the first collection after it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """Disable automatic collection inside the block (as it was before, after it); re-entrant."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
