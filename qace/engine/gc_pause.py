"""Keep Python's cyclic garbage collector out of a chunk's hot loop.

A chunk allocates hundreds of thousands of short-lived containers (token lists, candidate lists, result
rows) that reference counting frees on its own. Each allocation burst still triggers the cyclic
collector, which then walks every object the process holds (models, tokenizers, spaCy). With the collector
paused for the chunk, its cyclic garbage waits for the first collection after it.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_holders = 0
_was_enabled = False


@contextmanager
def collector_paused() -> Iterator[None]:
    """Disable automatic collection inside the block; the last of the blocks open in any thread puts
    it back as it was before the first."""
    global _holders, _was_enabled
    with _lock:
        if _holders == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _was_enabled:
                gc.enable()
