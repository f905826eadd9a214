"""Published feature files read in place: VL-T5 HDF5 and bottom-up-attention TSV, written here."""

from __future__ import annotations

import base64
import os
import threading
from pathlib import Path

import h5py
import numpy as np
import pytest

from qace.data.features import HDF5Store, pack_features
from qace.data.image_ids import canonical_id
from qace.errors import FeatureError
from qace.features.formats import INDEX_SUFFIX, BUTDTSVStore, VLT5HDF5Store, norm_boxes
from qace.features.stores import open_feature_store

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
SAMPLE = SHARED / "data" / "region_features" / "butd_sample.npz"
W, H = 640, 427


@pytest.fixture(scope="module")
def sample() -> tuple[np.ndarray, np.ndarray]:
    """The real sample's features (float32) and its boxes in pixels of a W x H image."""
    if not SAMPLE.is_file():
        pytest.skip(f"real region-feature sample {SAMPLE} is absent (../shared/data next to the repo)")
    with np.load(SAMPLE) as raw:
        features, norm = raw["features"].astype(np.float32), raw["norm_bb"].astype(np.float64)
    return features, norm[:, :4] * np.array([W, H, W, H])


def test_sample_norm_bb_is_the_documented_box_layout() -> None:
    """The release's norm_bb: corners in [0, 1], then width and height as corner differences."""
    if not SAMPLE.is_file():
        pytest.skip("real region-feature sample absent")
    with np.load(SAMPLE) as raw:
        b = raw["norm_bb"].astype(np.float64)
    assert ((b[:, :4] >= 0) & (b[:, :4] <= 1)).all()
    assert (b[:, 2] >= b[:, 0]).all() and (b[:, 3] >= b[:, 1]).all()
    np.testing.assert_allclose(b[:, 4], b[:, 2] - b[:, 0], atol=1e-3)  # fp16 storage
    np.testing.assert_allclose(b[:, 5], b[:, 3] - b[:, 1], atol=1e-3)
    # and norm_boxes gives back that layout from pixels
    pixels = b[:, :4] * np.array([W, H, W, H])
    np.testing.assert_allclose(norm_boxes("s", pixels, W, H, "test"), b, atol=1e-3)


def _write_vlt5(path: Path, items: dict[str, tuple[np.ndarray, np.ndarray, int, int]]) -> None:
    with h5py.File(path, "w") as f:
        for key, (features, boxes, w, h) in items.items():
            g = f.create_group(key)
            g["features"] = features
            g["boxes"] = boxes.astype(np.float32)
            g["img_h"], g["img_w"] = h, w
            g["obj_id"] = np.zeros(len(boxes), np.int64)
            g["obj_conf"] = np.ones(len(boxes), np.float32)
            g["num_boxes"] = len(boxes)


def _expected(features: np.ndarray, boxes: np.ndarray, w: float, h: float) -> np.ndarray:
    b = boxes / np.array([w, h, w, h])
    return np.concatenate([features, b, b[:, 2:] - b[:, :2]], axis=1).astype(np.float32)


def test_vlt5_hdf5_read_in_place_and_ids_matched(sample, tmp_path: Path) -> None:
    features, boxes = sample
    path = tmp_path / "COCO_val2014_obj36.h5"
    _write_vlt5(path, {"COCO_val2014_000000391895": (features, boxes, W, H)})
    store = open_feature_store(path)
    assert isinstance(store, VLT5HDF5Store)
    got = store.get("391895")
    assert got.shape == (36, 2054) and got.dtype == np.float32
    np.testing.assert_allclose(got, _expected(features, boxes, W, H), rtol=1e-6, atol=1e-6)
    for alias in ("COCO_val2014_000000391895", "000000391895", "imgs/COCO_val2014_000000391895.jpg"):
        assert alias in store
        np.testing.assert_array_equal(store.get(alias), got)
    with pytest.raises(FeatureError, match=r"'42'.*matched as '42'.*COCO_val2014_000000391895"):
        store.get("42")


def test_vlt5_wrong_size_and_box_count_are_errors_naming_the_image(sample, tmp_path: Path) -> None:
    features, boxes = sample
    path = tmp_path / "f.h5"
    _write_vlt5(path, {"swapped": (features, boxes, H, W), "ten": (features[:10], boxes[:10], W, H)})
    store = VLT5HDF5Store(path)
    assert (boxes[:, 2] > H).any()  # so that reading it as H wide must fail
    with pytest.raises(FeatureError, match="'swapped'.*outside.*swapped"):
        store.get("swapped")
    with pytest.raises(FeatureError, match="'ten'.*10 regions.*exactly 36"):
        store.get("ten")


def _tsv_line(image_id: str, features: np.ndarray, boxes: np.ndarray, wide: bool = False) -> bytes:
    b64 = lambda a: base64.b64encode(np.ascontiguousarray(a, dtype="<f4").tobytes()).decode()  # noqa: E731
    n = str(len(boxes))
    if wide:  # LXMERT's ten columns: img_id, img_h, img_w, objects_id, objects_conf, attrs_id, ...
        ids = base64.b64encode(np.zeros(len(boxes), "<i8").tobytes()).decode()
        cells = [image_id, str(H), str(W), ids, b64(np.ones(len(boxes))), ids, b64(np.ones(len(boxes)))]
        cells += [n, b64(boxes), b64(features)]
    else:  # the original release: image_id, image_w, image_h, num_boxes, boxes, features
        cells = [image_id, str(W), str(H), n, b64(boxes), b64(features)]
    return ("\t".join(cells) + "\r\n").encode()


def test_butd_tsv_both_layouts_sidecar_index_and_invalidation(sample, tmp_path: Path) -> None:
    features, boxes = sample
    path = tmp_path / "trainval_36.tsv"
    path.write_bytes(_tsv_line("9", features, boxes) + _tsv_line("391895", features * 2, boxes, wide=True))
    store = open_feature_store(path)
    assert isinstance(store, BUTDTSVStore) and store.ids() == ["9", "391895"]
    np.testing.assert_allclose(store.get("COCO_train2014_000000000009"), _expected(features, boxes, W, H))
    np.testing.assert_allclose(store.get("391895"), _expected(features * 2, boxes, W, H))
    sidecar = tmp_path / ("trainval_36.tsv" + INDEX_SUFFIX)
    assert sidecar.is_file()

    # a second open reads the sidecar, not the file: poison the sidecar's offsets to prove it
    text = sidecar.read_text().replace('"391895": ', '"391896": ')
    sidecar.write_text(text)
    assert "391896" in BUTDTSVStore(path) and "391895" not in BUTDTSVStore(path)

    # the file changes (size and mtime): the index is rebuilt
    with path.open("ab") as f:
        f.write(_tsv_line("77", features, boxes))
    os.utime(path, ns=(1, 1))
    rebuilt = BUTDTSVStore(path)
    assert rebuilt.ids() == ["9", "391895", "77"]
    np.testing.assert_allclose(rebuilt.get("77.jpg"), _expected(features, boxes, W, H))


def test_an_id_of_superscript_digits_is_missing_not_a_crash(sample, tmp_path: Path) -> None:
    """'²' is a digit to str.isdigit but not to int(): QACE-Img's lookup raised ValueError, failing the
    reward service's whole batch."""
    features, boxes = sample
    path = tmp_path / "f.tsv"
    path.write_bytes(_tsv_line("2", features, boxes))
    store = open_feature_store(path)
    assert "²" not in store and "2" in store
    with pytest.raises(FeatureError, match="no region features for image '²'"):
        store.get("²")


def test_threads_sharing_a_tsv_store_each_get_their_own_image(sample, tmp_path: Path) -> None:
    """Two threads read one store (the reward service's batches, each through its prefetch thread): both
    seek before either reads, where the GIL lets them; each must still get its own image's features."""
    features, boxes = sample
    path = tmp_path / "f.tsv"
    path.write_bytes(b"".join(_tsv_line(k, features * (1 + n), boxes) for n, k in enumerate("123")))
    store = BUTDTSVStore(path)
    meet = threading.Barrier(2)

    class SeekThenWait:
        def __init__(self, file) -> None:  # noqa: ANN001 - the store's binary file
            self.file = file

        def seek(self, offset: int) -> int:
            at = self.file.seek(offset)
            try:  # without the store's lock the other thread seeks here too, before this one reads
                meet.wait(timeout=0.5)
            except threading.BrokenBarrierError:
                pass
            return at

        def readline(self) -> bytes:
            return self.file.readline()

    store._file = SeekThenWait(path.open("rb"))
    got: dict[str, np.ndarray] = {}
    threads = [threading.Thread(target=lambda k=k: got.__setitem__(k, store.get(k))) for k in "12"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for n, k in enumerate("12"):
        np.testing.assert_allclose(got[k], _expected(features * (1 + n), boxes, W, H))


def test_a_stale_tsv_index_is_an_error_naming_the_sidecar(sample, tmp_path: Path) -> None:
    features, boxes = sample
    path = tmp_path / "f.tsv"
    path.write_bytes(_tsv_line("1", features, boxes) + _tsv_line("2", features, boxes))
    store = BUTDTSVStore(path)
    store._offsets["2"] = store._offsets["1"]  # as if the file changed under an index that still matched
    with pytest.raises(FeatureError, match=r"image '2'.*holds image '1'.*stale.*f\.tsv\.qace-index\.json"):
        store.get("2")


def test_butd_tsv_fewer_than_36_boxes_is_an_error(sample, tmp_path: Path) -> None:
    features, boxes = sample
    path = tmp_path / "adaptive.tsv"
    path.write_bytes(_tsv_line("5", features[:12], boxes[:12]))
    with pytest.raises(FeatureError, match="'5'.*12 regions.*exactly 36"):
        BUTDTSVStore(path).get("5")


def test_pack_converts_a_published_file_to_the_fast_store(sample, tmp_path: Path) -> None:
    features, boxes = sample
    path = tmp_path / "f.tsv"
    path.write_bytes(_tsv_line("1", features, boxes) + _tsv_line("2", features / 2, boxes))
    out = tmp_path / "packed.h5"
    assert pack_features(open_feature_store(path), out, dtype=np.float32, progress=False) == 2
    packed = HDF5Store(out)
    np.testing.assert_array_equal(packed.get("2"), BUTDTSVStore(path).get("2"))


@pytest.mark.parametrize(
    ("given", "canonical"),
    [
        (391895, "391895"),
        ("000000391895", "391895"),
        ("COCO_val2014_000000391895", "391895"),
        ("/data/coco/val2014/COCO_val2014_000000391895.jpg", "391895"),
        ("1000092795.jpg", "1000092795"),
        ("1056338697_4f7d7ce270.jpg", "1056338697_4f7d7ce270"),
        ("dog", "dog"),
        ("²", "²"),  # a digit to str.isdigit, not to int(): an id as written, not a ValueError
        ("12³", "12³"),
    ],
)
def test_canonical_id(given: object, canonical: str) -> None:
    assert canonical_id(given) == canonical
