"""Region features per image, loaded once and kept while hot.

Many captions share an image (5 candidates per image is typical), so features are read from the
store once and served from memory afterwards; an LRU bound keeps memory flat on huge inputs. The
scorer's prefetch thread loads the next chunk's features while the models read this chunk's, so the
cache is locked; a store read happens outside the lock, and the first of two concurrent reads of one
image wins.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import numpy as np


class FeatureCache:
    """LRU cache in front of a feature store (anything with ``get(image_id) -> (36, 2054)``)."""

    def __init__(self, store: Any, capacity: int = 4096) -> None:
        self.store = store
        self.capacity = capacity
        self.loads = 0
        self._items: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

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
