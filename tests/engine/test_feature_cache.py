"""The host feature cache: LRU-bounded, and safe to share between the prefetch thread and the models."""

from __future__ import annotations

import threading
from typing import Any

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
    """A store that counts its reads, fails for ids starting with ``bad`` and reads several at once
    (``get_many``, each call's ids kept in ``batches``)."""

    def __init__(self) -> None:
        self.store = RandomFeatureStore(seed=0)
        self.reads: list[str] = []
        self.batches: list[list[str]] = []

    def get(self, image_id: str) -> np.ndarray:
        self.reads.append(image_id)
        if image_id.startswith("bad"):
            raise FeatureError(f"image {image_id!r}: no features")
        return self.store.get(image_id)

    def get_many(self, image_ids: list[str], pool: Any) -> list[np.ndarray | FeatureError]:
        self.batches.append(list(image_ids))
        out: list[np.ndarray | FeatureError] = []
        for image_id in image_ids:
            try:
                out.append(self.get(image_id))
            except FeatureError as exc:
                out.append(exc)
        return out


def test_load_reads_each_new_image_once_and_leaves_failures_to_get() -> None:
    store = _Counting()
    cache = FeatureCache(store, capacity=8)
    cache.get("a")
    cache.load(["a", "b", "c", "b", "bad1", "d"])
    assert store.batches == [["b", "c", "bad1", "d"]] and cache.loads == 4  # "a" was held
    store.reads.clear()
    for image in "abcd":
        np.testing.assert_array_equal(cache.get(image), store.store.get(image))
    assert store.reads == []  # all held
    with pytest.raises(FeatureError, match="bad1"):
        cache.get("bad1")  # read again, and its error raised
    cache.close()


def test_load_keeps_to_the_capacity_and_leaves_single_images_to_get() -> None:
    store = _Counting()
    cache = FeatureCache(store, capacity=3)
    cache.load([f"i{k}" for k in range(5)])
    assert store.batches == [["i0", "i1", "i2"]] and list(cache._items) == ["i0", "i1", "i2"]
    cache.load(["i0", "i9"])  # one new image: left to `get`
    assert len(store.batches) == 1
    cache.close()


def test_load_leaves_a_store_without_get_many_to_get() -> None:
    """A store that cannot say it reads safely from several threads is read one image at a time."""
    store = RandomFeatureStore(seed=0)
    cache = FeatureCache(store, capacity=8)
    cache.load(["a", "b", "c"])
    assert cache.loads == 0
    np.testing.assert_array_equal(cache.get("b"), store.get("b"))


def test_a_failing_get_many_leaves_the_reads_to_get(caplog: pytest.LogCaptureFixture) -> None:
    """Reading ahead is an optimisation: where it fails, it says so and `get` reads each image."""

    class Broken(_Counting):
        def get_many(self, image_ids: list[str], pool: Any) -> list[np.ndarray | FeatureError]:
            raise RuntimeError("the store's threads are gone")

    store = Broken()
    cache = FeatureCache(store, capacity=8)
    with caplog.at_level("WARNING"):
        cache.load(["a", "b"])
    said = "reading 2 images at once failed (the store's threads are gone); reading them one by one"
    assert said in caplog.text
    np.testing.assert_array_equal(cache.get("a"), store.store.get("a"))
    assert store.reads == ["a"] and cache.loads == 1
    cache.close()
