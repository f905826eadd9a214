"""Device-resident region features: each hot image uploaded once, LRU eviction that spares the request."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qace.engine.device_features import DeviceFeatureCache


def _features(image_id: str) -> np.ndarray:
    seed = int(image_id.removeprefix("img"))
    return np.random.default_rng(seed).standard_normal((36, 2054)).astype(np.float32)


class _Store:
    def __init__(self) -> None:
        self.reads: list[str] = []

    def __call__(self, image_id: str) -> np.ndarray:
        self.reads.append(image_id)
        return _features(image_id)


def _check(cache: DeviceFeatureCache, ids: list[str], store: _Store) -> None:
    slab, slots = cache.rows(ids, store)
    for image_id, slot in zip(ids, slots.tolist(), strict=True):
        assert torch.equal(slab[slot], torch.from_numpy(_features(image_id)))


def test_hot_images_are_uploaded_once_and_rows_are_right() -> None:
    cache, store = DeviceFeatureCache(torch.device("cpu"), torch.float32, capacity=8), _Store()
    _check(cache, ["img1", "img2", "img3"], store)
    _check(cache, ["img3", "img1", "img4"], store)  # two resident, one new
    assert store.reads == ["img1", "img2", "img3", "img4"] and cache.uploads == 4


def test_eviction_takes_the_least_recent_and_never_a_requested_image() -> None:
    cache, store = DeviceFeatureCache(torch.device("cpu"), torch.float32, capacity=4), _Store()
    _check(cache, ["img1", "img2", "img3", "img4"], store)
    _check(cache, ["img1"], store)  # img1 is now the most recent
    _check(cache, ["img5", "img6", "img1"], store)  # evicts img2 and img3, keeps img1 and img4
    assert store.reads[-2:] == ["img5", "img6"]
    _check(cache, ["img4", "img1", "img5", "img6"], store)
    assert len(store.reads) == 6
    _check(cache, ["img2"], store)
    assert store.reads[-1] == "img2"


def test_a_request_larger_than_the_cache_is_declined() -> None:
    cache, store = DeviceFeatureCache(torch.device("cpu"), torch.float32, capacity=2), _Store()
    assert cache.rows(["img1", "img2", "img3"], store) is None and store.reads == []


def test_model_dtype_and_growth() -> None:
    cache, store = DeviceFeatureCache(torch.device("cpu"), torch.bfloat16, capacity=100), _Store()
    for start in range(0, 40, 7):  # the slab grows as images arrive
        ids = [f"img{i}" for i in range(start, start + 7)]
        slab, slots = cache.rows(ids, store)
        assert slab.dtype == torch.bfloat16
        expected = torch.from_numpy(np.stack([_features(i) for i in ids])).to(torch.bfloat16)
        assert torch.equal(slab[slots], expected)
    assert cache.uploads == 42 and len(set(store.reads)) == 42


def test_qace_img_uploads_each_image_once_across_chunks(test_models_dir) -> None:
    from qace.api import QACE
    from qace.data.features import RandomFeatureStore

    captions = ["a dog runs on the grass", "a girl in a red dress", "two men ride bikes", "a cat on a sofa"]
    images = ["a", "b", "c"]
    rows = [(captions[i % 4], images[i % 3]) for i in range(12)]
    scorer = QACE(models=test_models_dir, variant="img", features=RandomFeatureStore(seed=0), chunk_size=4)
    chunked = scorer.score([c for c, _ in rows], image_ids=[i for _, i in rows])
    assert scorer.models.vqa.features.uploads == 3  # three chunks, three images, three uploads
    whole = QACE(models=test_models_dir, variant="img", features=RandomFeatureStore(seed=0), chunk_size=64)
    again = whole.score([c for c, _ in rows], image_ids=[i for _, i in rows])
    # fp32 scores agree across batch compositions to 2e-6, not bit for bit (TOLERANCE in test_parity.py)
    assert [r["qace"] for r in chunked] == pytest.approx([r["qace"] for r in again], abs=2e-6)


def test_a_load_that_fails_takes_no_slot() -> None:
    """A request whose load raises (a transient read error) leaves every slot to later requests: one
    needing the whole capacity still fits."""
    cache, store = DeviceFeatureCache(torch.device("cpu"), torch.float32, capacity=4), _Store()
    _check(cache, ["img1", "img2"], store)

    def failing(image_id: str) -> np.ndarray:
        if image_id == "img4":
            raise OSError("transient read error")
        return store(image_id)

    with pytest.raises(OSError, match="transient"):
        cache.rows(["img3", "img4"], failing)
    assert set(cache._slots) == {"img1", "img2"}
    _check(cache, ["img5", "img6", "img7", "img8"], store)
    assert set(cache._slots) == {"img5", "img6", "img7", "img8"}


def test_slots_are_the_lowest_unused_then_the_least_recent_under_requests_and_discards() -> None:
    """Against the rule spelt out with sets: a new image takes the lowest slot holding no image (the slab
    grown first when it is short), else the least recently used image's."""
    rng = np.random.default_rng(7)
    cache = DeviceFeatureCache(torch.device("cpu"), torch.float32, capacity=16)
    lru: list[str] = []  # least recent first
    slots: dict[str, int] = {}
    size = 0
    for _ in range(300):
        if rng.random() < 0.2 and slots:
            gone = [str(i) for i in rng.choice(sorted(slots), size=min(3, len(slots)), replace=False)]
            cache.discard(gone)
            for image_id in gone:
                del slots[image_id]
                lru.remove(image_id)
            continue
        ids = [f"img{i}" for i in rng.choice(40, size=int(rng.integers(1, 9)), replace=False)]
        for image_id in ids:
            if image_id in slots:
                lru.remove(image_id)
                lru.append(image_id)
        missing = [image_id for image_id in ids if image_id not in slots]
        if len(slots) + len(missing) > size and size < 16:
            size = min(16, max(len(slots) + len(missing), 2 * size))
        free = sorted(set(range(size)) - set(slots.values()))[: len(missing)]
        while len(free) < len(missing):
            free.append(slots.pop(lru.pop(0)))
        slots.update(zip(missing, free, strict=True))
        lru.extend(missing)
        _, got = cache.rows(ids, _features)
        assert got.tolist() == [slots[image_id] for image_id in ids]
