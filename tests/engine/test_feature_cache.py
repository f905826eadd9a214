"""The host feature cache: LRU-bounded, and safe to share between the prefetch thread and the models."""

from __future__ import annotations

import threading

import numpy as np

from qace.data.features import RandomFeatureStore
from qace.engine.feature_cache import FeatureCache


def test_lru_bound_and_one_read_per_hot_image() -> None:
    cache = FeatureCache(RandomFeatureStore(seed=0), capacity=2)
    for image in [
        "a",
        "b",
        "a",
        "c",
        "a",
        "b",
    ]:  # "b" is evicted by "c" (least recently used), then read again
        cache.get(image)
    assert cache.loads == 4
    assert list(cache._items) == ["a", "b"]


def test_threads_sharing_the_cache_get_the_stores_features() -> None:
    store = RandomFeatureStore(seed=0)
    cache = FeatureCache(store, capacity=16)
    ids = [f"img-{i}" for i in range(40)]
    wrong: list[str] = []

    def worker(offset: int) -> None:
        for k in range(400):
            image = ids[(offset * 7 + k) % len(ids)]
            if not np.array_equal(cache.get(image), store.get(image)):
                wrong.append(image)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []
    assert len(cache._items) == 16
