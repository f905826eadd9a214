"""The host feature cache: LRU-bounded, and safe to share between the prefetch thread and the models."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from qace.data.features import RandomFeatureStore
from qace.engine.feature_cache import FeatureCache
from qace.errors import FeatureError


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


class _Counting:
    """A store that counts its reads and fails for ids starting with ``bad``."""

    def __init__(self) -> None:
        self.store = RandomFeatureStore(seed=0)
        self.reads: list[str] = []

    def get(self, image_id: str) -> np.ndarray:
        self.reads.append(image_id)
        if image_id.startswith("bad"):
            raise FeatureError(f"image {image_id!r}: no features")
        return self.store.get(image_id)


def test_load_reads_each_new_image_once_and_leaves_failures_to_get() -> None:
    store = _Counting()
    cache = FeatureCache(store, capacity=8)
    cache.get("a")
    cache.load(["a", "b", "c", "b", "bad1", "d"])
    assert sorted(store.reads) == ["a", "b", "bad1", "c", "d"] and cache.loads == 4  # "a" was held
    store.reads.clear()
    for image in "abcd":
        np.testing.assert_array_equal(cache.get(image), store.store.get(image))
    assert store.reads == []  # all held
    with pytest.raises(FeatureError, match="bad1"):
        cache.get("bad1")  # read again, and its error raised
    cache.close()


def test_load_keeps_to_the_capacity_and_uses_the_stores_get_many() -> None:
    calls: list[list[str]] = []

    class Many(_Counting):
        def get_many(self, image_ids: list[str], pool: object) -> list[object]:
            calls.append(list(image_ids))
            return [self.store.get(i) for i in image_ids]

    cache = FeatureCache(Many(), capacity=3)
    cache.load([f"i{k}" for k in range(5)])
    assert calls == [["i0", "i1", "i2"]] and list(cache._items) == ["i0", "i1", "i2"]
    cache.load(["i0"])  # one image: left to `get`
    assert len(calls) == 1
    cache.close()
