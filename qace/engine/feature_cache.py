"""Region features per image, loaded once and kept while hot.

Many captions share an image (5 candidates per image is typical), so features are read from the
store once and served from memory afterwards; an LRU bound keeps memory flat on huge inputs. The
scorer's prefetch thread loads the next chunk's features while the models read this chunk's, so the
cache is locked; a store read happens outside the lock, and the first of two concurrent reads of one
image wins. `FeatureCache.load` reads a chunk's new images several at once where the store can.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

READ_THREADS = min(8, os.cpu_count() or 1)
"""Threads that read a chunk's new images at once (`FeatureCache.load`)."""


class FeatureCache:
    """LRU cache in front of a feature store (anything with ``get(image_id) -> (36, 2054)``)."""

    def __init__(self, store: Any, capacity: int = 4096) -> None:
        self.store = store
        self.capacity = capacity
        self.loads = 0
        self._items: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self._readers: ThreadPoolExecutor | None = None

    def get(self, image_id: str) -> np.ndarray:
        """Features of ``image_id``; raises the store's ``FeatureError`` when missing or malformed."""
        with self._lock:
            item = self._items.get(image_id)
            if item is not None:
                self._items.move_to_end(image_id)
                return item
        item = self.store.get(image_id)
        with self._lock:
            self.loads += 1
            item = self._items.setdefault(image_id, item)
            self._items.move_to_end(image_id)
            if len(self._items) > self.capacity:
                self._items.popitem(last=False)
        return item

    def load(self, image_ids: Iterable[str]) -> None:
        """Read the images of ``image_ids`` that are not held (at most ``capacity`` of them) into the
        cache: several at once through the store's ``get_many(ids, pool)`` where it has one (an array or
        a `FeatureError` per id; `READ_THREADS` threads in ``pool``), else one after another through its
        ``get`` as they are asked for (a TSV file has one handle to read through, so reads at once would
        only take turns). An image whose read fails is not held: its `get` raises the store's error."""
        with self._lock:
            missing = list(dict.fromkeys(i for i in image_ids if i not in self._items))[: self.capacity]
        get_many = getattr(self.store, "get_many", None)
        if get_many is None or len(missing) < 2:
            return  # `get` reads them, one after another
        if self._readers is None:
            self._readers = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="qace-features")
        try:
            results = get_many(missing, self._readers)
        except Exception as exc:  # noqa: BLE001 - reading ahead is an optimisation: `get` reads them
            log.warning("reading %d images at once failed (%s); reading them one by one", len(missing), exc)
            return
        with self._lock:
            for image_id, item in zip(missing, results, strict=True):
                if isinstance(item, np.ndarray):
                    self.loads += 1
                    self._items.setdefault(image_id, item)
                    self._items.move_to_end(image_id)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def close(self) -> None:
        """Stop the reading threads (idle between loads); a later `load` starts them again."""
        if self._readers is not None:
            self._readers.shutdown(wait=False)
            self._readers = None
