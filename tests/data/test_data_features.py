"""Feature stores: the release .npz layout, HDF5 packing round trip, and validation errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from qace.data.features import (
    FeatureStore,
    HDF5Store,
    NpzDirStore,
    RandomFeatureStore,
    pack_features,
)
from qace.errors import ConfigError, FeatureError
from qace.features.stores import open_feature_store
from tests.corrupt_files import (
    bad_crc_npz,
    damaged_compressed_npz,
    features,
    hdf5_with_damaged_row,
    truncated_npz,
)

SAMPLE = (
    Path(__file__).resolve().parents[2].parent / "shared" / "data" / "region_features" / "butd_sample.npz"
)
FLICKR_ID = "1056338697_4f7d7ce270.jpg"


@pytest.fixture()
def sample_dir(tmp_path: Path) -> Path:
    """A release-layout directory holding the real sample under a Flickr-style id (extension stripped)."""
    if not SAMPLE.is_file():
        pytest.skip(f"real region-feature sample {SAMPLE} is absent (../shared/data next to the repo)")
    directory = tmp_path / "npz"
    directory.mkdir()
    shutil.copy(SAMPLE, directory / "1056338697_4f7d7ce270.npz")
    return directory


def test_npz_dir_store_reads_release_layout(sample_dir: Path) -> None:
    store = open_feature_store(sample_dir)
    assert isinstance(store, NpzDirStore) and isinstance(store, FeatureStore)
    features = store.get(FLICKR_ID)  # extension stripped to find the file
    with np.load(SAMPLE) as raw:
        expected = np.concatenate([raw["features"], raw["norm_bb"]], 1).astype(np.float32)
    assert features.shape == (36, 2054) and features.dtype == np.float32
    np.testing.assert_array_equal(features, expected)
    assert FLICKR_ID in store and "1056338697_4f7d7ce270" in store and "other.jpg" not in store
    assert store.ids() == ["1056338697_4f7d7ce270"]


def test_hdf5_round_trip_of_real_sample(sample_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "features.h5"
    assert pack_features(NpzDirStore(sample_dir), out, progress=False) == 1
    assert not out.with_name("features.h5.tmp").exists()
    store = open_feature_store(out)
    assert isinstance(store, HDF5Store) and store.dtype == np.float16
    np.testing.assert_array_equal(
        store.get(FLICKR_ID), NpzDirStore(sample_dir).get(FLICKR_ID)
    )  # fp16 is lossless
    with h5py.File(out) as f:
        assert f["features"].chunks == (1, 36, 2054) and f["features"].dtype == np.float16


def test_hdf5_pack_pairs_float32_and_random_access(tmp_path: Path) -> None:
    random = RandomFeatureStore(seed=3)
    ids = [f"img{i}" for i in range(7)]
    out = tmp_path / "rand.hdf5"
    count = pack_features(((i, random.get(i)) for i in ids), out, dtype=np.float32, progress=False)
    assert count == 7
    with HDF5Store(out) as store:
        assert store.ids() == ids and len(store) == 7 and "img9" not in store
        for image_id in reversed(ids):
            np.testing.assert_array_equal(store.get(image_id), random.get(image_id))
    fp16 = tmp_path / "rand16.h5"
    pack_features(((i, random.get(i)) for i in ids), fp16, progress=False)
    with HDF5Store(fp16) as store:
        np.testing.assert_allclose(store.get("img2"), random.get("img2"), rtol=1e-3, atol=1e-3)


def test_random_store_is_deterministic_and_well_formed() -> None:
    a, b, other = RandomFeatureStore(1), RandomFeatureStore(1), RandomFeatureStore(2)
    x = a.get("cat.jpg")
    np.testing.assert_array_equal(x, b.get("cat.jpg"))
    assert not np.array_equal(x, other.get("cat.jpg")) and not np.array_equal(x, a.get("dog.jpg"))
    assert x.shape == (36, 2054) and x.dtype == np.float32 and (x[:, :2048] >= 0).all()
    boxes = x[:, 2048:]
    assert (boxes >= 0).all() and (boxes <= 1).all() and (boxes[:, 2] >= boxes[:, 0]).all()
    assert isinstance(open_feature_store("random:1"), RandomFeatureStore)


def _npz(directory: Path, name: str, features: np.ndarray, norm_bb: np.ndarray) -> None:
    np.savez(directory / f"{name}.npz", features=features, norm_bb=norm_bb)


def test_validation_errors_name_image_and_problem(tmp_path: Path) -> None:
    good_f, good_b = np.ones((36, 2048), np.float16), np.full((36, 6), 0.5, np.float16)
    nan_f = good_f.copy()
    nan_f[3, 7] = np.nan
    inf_b = good_b.copy()
    inf_b[0, 0] = np.inf
    _npz(tmp_path, "nan", nan_f, good_b)
    _npz(tmp_path, "inf", good_f, inf_b)
    _npz(tmp_path, "short", good_f[:10], good_b[:10])
    _npz(tmp_path, "wide", np.ones((36, 2000)), good_b)
    np.savez(tmp_path / "nokey.npz", features=good_f)
    store = NpzDirStore(tmp_path)
    cases = {
        "nan": "1 non-finite values (1 NaN, 0 Inf)",
        "inf": "(0 NaN, 1 Inf)",
        "short": "shape (10, 2048)",
        "wide": "shape (36, 2000)",
        "nokey": "norm_bb",
    }
    for image_id, problem in cases.items():
        with pytest.raises(FeatureError, match=image_id) as info:
            store.get(image_id)
        assert problem in str(info.value)
    with pytest.raises(FeatureError, match="no region features for image 'absent.jpg'") as missing:
        store.get("absent.jpg")
    assert missing.value.record_id is None and str(tmp_path) in str(missing.value)
    outside = tmp_path.parent / "outside.npz"  # an id never reaches a file outside the directory
    np.savez(outside, features=good_f, norm_bb=good_b)
    with pytest.raises(FeatureError, match="no region features"):
        store.get("../outside")
    with pytest.raises(FeatureError, match="non-finite"):  # a path's file stem is matched inside it
        store.get("../nan")


def test_pack_refuses_bad_input_and_leaves_no_file(tmp_path: Path) -> None:
    good = np.zeros((36, 2054), np.float32)
    nan = good.copy()
    nan[0, 0] = np.nan
    big = good.copy()
    big[0, 0] = 1e6
    out = tmp_path / "f.h5"
    for pairs, problem in [
        ([("a", good), ("b", nan)], "'b'.*non-finite"),
        ([("a", good), ("a", good)], "'a' appears twice"),
        ([("a", good[:, :2048])], "'a'.*shape"),
        ([("big", big)], "'big'.*overflow float16"),
    ]:
        with pytest.raises(FeatureError, match=problem):
            pack_features(pairs, out, progress=False)
        assert not out.exists() and not out.with_name("f.h5.tmp").exists()
    with pytest.raises(ConfigError, match="float16 or float32"):
        pack_features([("a", good)], out, dtype=np.int8, progress=False)


def test_open_feature_store_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        open_feature_store(tmp_path / "missing.h5")
    with pytest.raises(ConfigError, match="directory of .npz"):
        open_feature_store(tmp_path / "features.lmdb")
    with pytest.raises(ConfigError, match="integer seed"):
        open_feature_store("random:abc")
    not_ours = tmp_path / "other.h5"
    with h5py.File(not_ours, "w") as f:
        f["x"] = np.zeros(3)
    with pytest.raises(ConfigError, match="not a qace feature file"):
        open_feature_store(not_ours)


def test_a_truncated_or_foreign_hdf5_store_is_named_so(tmp_path: Path) -> None:
    random, whole = RandomFeatureStore(seed=1), tmp_path / "f.h5"
    pack_features(((i, random.get(i)) for i in ("a", "b")), whole, progress=False)
    cut = tmp_path / "cut.h5"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with pytest.raises(ConfigError, match="is an HDF5 file that is truncated or damaged .*make it again"):
        open_feature_store(cut)
    text = tmp_path / "text.h5"
    text.write_text("not hdf5 at all")
    with pytest.raises(ConfigError, match="is not an HDF5 file"):
        open_feature_store(text)


def test_a_damaged_hdf5_chunk_fails_its_image_only(tmp_path: Path) -> None:
    ids = ["a", "b", "c"]
    store = HDF5Store(hdf5_with_damaged_row(tmp_path / "f.h5", ids, damaged="b"))
    with pytest.raises(FeatureError, match="image 'b'.*row 1 cannot be read.*pack it again") as info:
        store.get("b")
    assert "filter returned failure" in str(info.value)
    np.testing.assert_allclose(store.get("c"), RandomFeatureStore(0).get("c"), rtol=1e-3, atol=1e-3)


def test_damaged_or_foreign_npz_files_are_feature_errors(tmp_path: Path) -> None:
    truncated_npz(tmp_path / "cut.npz", "cut")
    bad_crc_npz(tmp_path / "crc.npz", "crc")
    damaged_compressed_npz(tmp_path / "zip.npz", "zip")
    (tmp_path / "text.npz").write_text("not an archive\n")
    (tmp_path / "empty.npz").write_bytes(b"")
    np.save(tmp_path / "array.npy", np.zeros(3))
    (tmp_path / "array.npy").rename(tmp_path / "array.npz")
    np.savez(tmp_path / "good.npz", **features("good"))
    store = NpzDirStore(tmp_path)
    cases = {
        "cut": "truncated or damaged (zipfile.BadZipFile",
        "crc": "Bad CRC-32",
        "zip": "(zlib.error",
        "text": "is not an .npz file (no zip header; it starts with b'not ')",
        "empty": "is not an .npz file (no zip header; it is empty)",
        "array": "is not an .npz file",
    }
    for image_id, problem in cases.items():
        with pytest.raises(FeatureError, match=f"image '{image_id}'") as info:
            store.get(image_id)
        assert problem in str(info.value) and "pickled" not in str(info.value)
    assert store.get("good").shape == (36, 2054)


def test_pack_lists_bad_images_and_packs_the_rest(tmp_path: Path) -> None:
    source = tmp_path / "npz"
    source.mkdir()
    for name in ("a", "c", "e"):
        np.savez(source / f"{name}.npz", **features(name))
    truncated_npz(source / "b.npz", "b")
    (source / "d.npz").write_text("not an archive")
    errors: list[tuple[str, str]] = []
    out = tmp_path / "f.h5"
    assert pack_features(NpzDirStore(source), out, progress=False, errors=errors) == 3
    assert [image_id for image_id, _ in errors] == ["b", "d"]
    assert "truncated or damaged" in errors[0][1] and "not an .npz" in errors[1][1]
    with HDF5Store(out) as store:
        assert store.ids() == ["a", "c", "e"]


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_get_many_reads_as_get_does(tmp_path: Path, dtype: type) -> None:
    """Raw chunks decoded outside h5py give `get`'s arrays bit for bit, and `get`'s errors in place."""
    from concurrent.futures import ThreadPoolExecutor

    source = RandomFeatureStore(3)
    ids = [f"img{i}" for i in range(12)]
    path = tmp_path / "f.h5"
    pack_features(((i, source.get(i)) for i in ids), path, dtype=dtype, progress=False)
    store = HDF5Store(path)
    assert store._raw
    asked = [*ids[::-1], "missing.jpg", ids[0]]
    with ThreadPoolExecutor(3) as pool:
        got = store.get_many(asked, pool)
    for image_id, item in zip(asked[:-2], got[:-2], strict=True):
        assert isinstance(item, np.ndarray) and item.dtype == np.float32
        np.testing.assert_array_equal(item, store.get(image_id))
    assert isinstance(got[-2], FeatureError) and "missing.jpg" in str(got[-2])
    with pytest.raises(FeatureError) as info:
        store.get("missing.jpg")
    assert str(got[-2]) == str(info.value)
    np.testing.assert_array_equal(got[-1], got[len(ids) - 1])


def test_get_many_names_a_damaged_chunk_and_reads_the_rest(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    ids = ["a", "b", "c"]
    store = HDF5Store(hdf5_with_damaged_row(tmp_path / "f.h5", ids, damaged="b"))
    with ThreadPoolExecutor(2) as pool:
        a, b, c = store.get_many(ids, pool)
    assert isinstance(b, FeatureError)
    assert "image 'b'" in str(b) and "row 1 cannot be read" in str(b) and "pack it again" in str(b)
    np.testing.assert_array_equal(a, store.get("a"))
    np.testing.assert_array_equal(c, store.get("c"))


def test_get_many_reads_other_layouts_through_h5py(tmp_path: Path) -> None:
    """A store whose chunks are filtered otherwise (LZF here) is read by `get`, the same arrays."""
    from concurrent.futures import ThreadPoolExecutor

    source = RandomFeatureStore(0)
    path = tmp_path / "lzf.h5"
    pack_features(((i, source.get(i)) for i in "xy"), path, progress=False)
    with h5py.File(path, "a") as f:
        data = f["features"][:]
        del f["features"]
        f.create_dataset("features", data=data, chunks=(1, 36, 2054), compression="lzf")
    store = HDF5Store(path)
    assert not store._raw
    with ThreadPoolExecutor(2) as pool:
        x, y = store.get_many(["x", "y"], pool)
    np.testing.assert_array_equal(x, store.get("x"))
    np.testing.assert_array_equal(y, store.get("y"))


def test_decode_chunk_skips_the_filters_the_writer_skipped() -> None:
    """HDF5 leaves a filter out of a chunk where it was optional and failed; the mask says which."""
    import zlib

    from qace.data.hdf5_chunks import inflated_unshuffled, shuffled_deflate

    array = RandomFeatureStore(1).get("z").astype(np.float16)
    raw = array.tobytes()
    shuffled = np.frombuffer(raw, np.uint8).reshape(-1, 2).T.tobytes()
    dtype = np.dtype(np.float16)

    def decoded(chunk: bytes, mask: int) -> np.ndarray:
        return inflated_unshuffled(chunk, mask, dtype, array.shape)

    np.testing.assert_array_equal(decoded(zlib.compress(shuffled), 0), array)
    np.testing.assert_array_equal(decoded(shuffled, 2), array)  # deflate skipped
    np.testing.assert_array_equal(decoded(zlib.compress(raw), 1), array)  # shuffle skipped
    np.testing.assert_array_equal(decoded(raw, 3), array)
    assert shuffled_deflate(array) == zlib.compress(shuffled, 1)  # what the writer stores


def test_half_precision_converts_bit_for_bit_as_numpy_does() -> None:
    """Every float16 bit pattern (NaN payloads too), contiguous or not, and other dtypes as `astype`."""
    from qace.data.features import _as_float32

    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16).reshape(256, 256)
    for array in (halves, halves[:, ::3], halves.astype(">f2"), halves.astype(np.float64)):
        converted = _as_float32(array)
        assert converted.dtype == np.float32 and converted.shape == array.shape
        np.testing.assert_array_equal(converted.view(np.uint32), array.astype(np.float32).view(np.uint32))


def test_get_many_reads_a_chunk_it_cannot_read_raw_through_h5py(tmp_path: Path) -> None:
    """A row never written has no chunk (h5py's raw read raises RuntimeError): `get`'s answer stands."""
    from concurrent.futures import ThreadPoolExecutor

    from qace.data.features import HDF5_LAYOUT

    source = RandomFeatureStore(0)
    path = tmp_path / "sparse.h5"
    with h5py.File(path, "w") as f:
        data = f.create_dataset(
            "features", shape=(3, 36, 2054), dtype=np.float16, chunks=(1, 36, 2054),
            compression="gzip", compression_opts=1, shuffle=True,
        )  # fmt: skip
        data[0], data[2] = source.get("a"), source.get("c")
        f.create_dataset("ids", data=["a", "b", "c"], dtype=h5py.string_dtype("utf-8"))
        f.attrs["layout"] = HDF5_LAYOUT
    store = HDF5Store(path)
    assert store._raw
    with ThreadPoolExecutor(2) as pool:
        got = store.get_many(["a", "b", "c"], pool)
    for image_id, item in zip("abc", got, strict=True):
        np.testing.assert_array_equal(item, store.get(image_id))
