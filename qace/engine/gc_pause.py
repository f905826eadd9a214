"""Keep Python's cyclic garbage collector out of a chunk's hot loop.

A chunk allocates hundreds of thousands of short-lived containers (token lists, candidate lists, result
rows) that reference counting frees on its own. Each allocation burst still triggers the cyclic
collector, which then walks every object the process holds (models, tokenizers, spaCy). With the collector
paused for the chunk, its cyclic garbage waits for the first collection after it.

A collection of the oldest generation still walks the whole heap whenever it comes, in the middle of
whatever runs then (a reward request, a host process's task; docs/performance.md measures it).
`freeze_heap`, once a process is set up, takes what it holds then out of every
later collection (vLLM freezes its heap after its warm-up the same way).
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


def freeze_heap() -> None:
    """Collect once, then move every object alive now to the permanent generation (``gc.freeze``), so
    later collections walk only what was made after. Frozen objects are still freed when their last
    reference goes; only reference cycles among them stay until ``gc.unfreeze``. For long-lived
    processes, once set up (a warmed-up scorer, a host process after its setup)."""
    gc.collect()
    gc.freeze()
