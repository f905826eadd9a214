"""``qace features extract`` and QACE-Img straight from image files, with the tiny random detector."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

from qace.cli import main
from qace.data.features import HDF5_LAYOUT, HDF5Store, RandomFeatureStore
from qace.errors import ConfigError, InputError
from qace.features import extract as extract_module
from qace.features.extract import (
    ImageItem,
    RegionWriter,
    decode_batches,
    extract_features,
    gather_images,
    load_detector,
)
from qace.testing.detector import make_test_detector

Image = pytest.importorskip("PIL.Image")


@pytest.fixture(scope="module")
def detector_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_test_detector(tmp_path_factory.mktemp("detector"))


def _png(path: Path, seed: int, size: tuple[int, int] = (64, 48), mode: str = "RGB") -> Path:
    rng = np.random.default_rng(seed)
    w, h = size
    pixels = np.kron(rng.integers(0, 255, (h // 4, w // 4, 3), dtype=np.uint8), np.ones((4, 4, 1), np.uint8))
    image = Image.fromarray(pixels).convert(mode)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)
    return path


def _extract(source: Path, out: Path, detector_dir: Path, *extra: str) -> int:
    args = ["features", "extract", str(source), "-o", str(out), "--detector", str(detector_dir)]
    return main([*args, "--detector-workers", "0", "--detector-batch", "3", "--no-progress", *extra])


def test_extract_folder_reports_bad_images_and_resumes(detector_dir: Path, tmp_path: Path, capsys) -> None:
    folder = tmp_path / "imgs"
    _png(folder / "dog.png", 0)
    _png(folder / "sub" / "cat.jpg", 1, mode="CMYK")  # JPEG keeps CMYK
    _png(folder / "grey.png", 2, mode="L")
    _png(folder / "tiny.png", 3, size=(8, 8))
    (folder / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    out = tmp_path / "feats.h5"
    assert _extract(folder, out, detector_dir) == 0
    assert "extracted 3 images" in capsys.readouterr().out
    store = HDF5Store(out)
    assert sorted(store.ids()) == ["cat", "dog", "grey"]
    regions = store.get("dog")
    assert regions.shape == (36, 2054) and np.isfinite(regions).all()
    store.close()
    errors = {e["image_id"]: e["reason"] for e in map(json.loads, (tmp_path / "feats.errors.jsonl").open())}
    assert set(errors) == {"tiny", "broken"}
    assert "8x8 pixels" in errors["tiny"] and "unreadable image" in errors["broken"]

    # resumable: a rerun extracts only what is missing, and the store keeps what it had
    _png(folder / "new.png", 4)
    assert _extract(folder, out, detector_dir) == 0
    printed = capsys.readouterr().out
    assert "extracted 1 images" in printed and "3 already in the store" in printed
    with HDF5Store(out) as again:
        assert sorted(again.ids()) == ["cat", "dog", "grey", "new"]
        np.testing.assert_array_equal(again.get("dog"), regions)

    # another detector setting must not be mixed into the same store
    assert _extract(folder, out, detector_dir, "--detector-precision", "bf16") == 2
    assert "holds features of" in capsys.readouterr().err


def _regions(features: np.ndarray) -> np.ndarray:
    """(36, 2054) float32: ``features`` with well-formed boxes (those of a random store's image)."""
    boxes = RandomFeatureStore(0).get("boxes")[:, 2048:]
    return np.concatenate([features, boxes], axis=1).astype(np.float32)


def test_region_writer_writes_a_batch_at_once_and_lists_the_images_it_refuses(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    good = [_regions(rng.standard_normal((36, 2048))) for _ in range(3)]
    nan = good[0].copy()
    nan[0, 0] = np.nan
    huge = good[0].copy()
    huge[:, :2048] *= 1e6  # finite in float32, overflows the store's float16
    writer = RegionWriter(tmp_path / "f.h5", "d")
    errors = writer.add([("a", good[0]), ("nan", nan), ("b", good[1]), ("huge", huge)])
    assert [e["image_id"] for e in errors] == ["nan", "huge"]
    assert "non-finite" in errors[0]["reason"] and "overflow float16" in errors[1]["reason"]
    assert writer.add([]) == []
    writer.add([("c", good[2])])
    writer.close()
    with HDF5Store(tmp_path / "f.h5") as store:
        assert store.ids() == ["a", "b", "c"]
        for key, value in zip("abc", good, strict=True):
            np.testing.assert_array_equal(store.get(key), value.astype(np.float16).astype(np.float32))
    again = RegionWriter(tmp_path / "f.h5", "d")  # resuming keeps the rows and knows their ids
    assert again.ids == {"a", "b", "c"}
    again.close()


def test_region_writer_stores_chunks_hdf5_reads_through_its_own_filters(tmp_path: Path) -> None:
    """The writer compresses each chunk itself (shuffle, then deflate): h5py reads them back through
    HDF5's filters as the values written, in float16 and float32 stores, as it reads a store written
    through h5py's own filters; a features dataset of another layout is written through h5py."""
    import h5py

    rng = np.random.default_rng(1)
    rows = [_regions(np.abs(rng.standard_normal((36, 2048)))) for _ in range(5)]
    rows[2][:, :100] = 0.0  # compressible stretches
    for dtype in (np.float16, np.float32):
        writer = RegionWriter(tmp_path / f"{dtype.__name__}.h5", "d", dtype=dtype)
        assert writer._direct
        writer.add([(str(i), r) for i, r in enumerate(rows)])
        writer.close()
        with h5py.File(tmp_path / f"{dtype.__name__}.h5") as f:
            stored = f["features"]
            assert stored.compression == "gzip" and stored.shuffle
            np.testing.assert_array_equal(stored[:], np.stack(rows).astype(dtype))
            chunk = stored.id.read_direct_chunk((2, 0, 0))[1]
            assert len(chunk) < rows[2].astype(dtype).nbytes  # stored compressed
    with h5py.File(tmp_path / "plain.h5", "w") as f:
        f.create_dataset("features", shape=(0, 36, 2054), maxshape=(None, 36, 2054), dtype=np.float16)
        f.create_dataset("ids", shape=(0,), maxshape=(None,), dtype=h5py.string_dtype("utf-8"))
        f.attrs["layout"], f.attrs["detector"] = HDF5_LAYOUT, "d"
    writer = RegionWriter(tmp_path / "plain.h5", "d")
    assert not writer._direct
    writer.add([("a", rows[0])])
    writer.close()
    with HDF5Store(tmp_path / "plain.h5") as store:
        np.testing.assert_array_equal(store.get("a"), rows[0].astype(np.float16).astype(np.float32))


def test_gather_from_list_and_records_files(tmp_path: Path) -> None:
    a, b = _png(tmp_path / "x" / "a.png", 0), _png(tmp_path / "y" / "COCO_val2014_000000000042.jpg", 1)
    listing = tmp_path / "images.txt"
    listing.write_text("x/a.png\n\n# a comment\ny/COCO_val2014_000000000042.jpg\n")
    assert gather_images(listing) == [
        ImageItem("a", str(tmp_path / "x" / "a.png")),
        ImageItem("COCO_val2014_000000000042", str(tmp_path / "y" / "COCO_val2014_000000000042.jpg")),
    ]
    records = tmp_path / "caps.jsonl"
    rows = [
        {"id": "1", "caption": "c", "image": "x/a.png"},
        {"id": "2", "caption": "c", "image": "x/a.png"},
        {"id": "3", "caption": "c", "image_id": "42", "image": str(b)},
        {"id": "4", "caption": "no image", "image_id": "7"},
    ]
    records.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert gather_images(records) == [ImageItem("a", str(a)), ImageItem("42", str(b))]
    clash = tmp_path / "clash.txt"
    clash.write_text("x/a.png\nother/a.png\n")
    with pytest.raises(InputError, match="'a' names two files"):
        gather_images(clash)
    with pytest.raises(InputError, match="neither a folder"):
        gather_images(tmp_path / "missing")


def test_bad_detector_settings_fail_before_loading(tmp_path: Path, capsys) -> None:
    _png(tmp_path / "i" / "a.png", 0)
    code = main(["features", "extract", str(tmp_path / "i"), "-o", str(tmp_path / "o.h5"),
                 "--detector", str(tmp_path / "nowhere"), "--detector-batch", "0"])  # fmt: skip
    assert code == 2 and "--detector-batch must be at least 1" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="no pytorch_model.bin"):
        from qace.features.detector import BottomUpDetector

        BottomUpDetector.from_pretrained(tmp_path)


def test_folder_of_images_and_captions_score_with_qace_img_in_one_command(
    test_models_dir: Path, detector_dir: Path, tmp_path: Path, capsys
) -> None:
    """The issue's CI check: raw images + captions -> QACE-Img scores, one command, no feature step."""
    data = tmp_path / "data"
    for i, name in enumerate(("beach", "dog", "kitchen")):
        _png(data / "images" / f"{name}.png", i)
    captions = [
        {"id": "a", "image": "images/beach.png", "caption": "a girl runs on the beach"},
        {"id": "b", "image": "images/dog.png", "caption": "a dog catches a frisbee"},
        {"id": "c", "image": "images/kitchen.png", "caption": "a kitchen with a red kettle"},
        {"id": "d", "image_id": "kitchen", "image": "images/kitchen.png", "caption": "an empty kitchen"},
        {"id": "e", "image": "images/broken.jpg", "caption": "an image that cannot be read"},
        {"id": "f", "image_id": 7, "image": "images/dog.png", "caption": "a dog under an integer id"},
    ]
    (data / "images" / "broken.jpg").write_bytes(b"not an image")
    source = data / "captions.jsonl"
    source.write_text("".join(json.dumps(c) + "\n" for c in captions))
    out = tmp_path / "run" / "scores.jsonl"
    out.parent.mkdir()
    args = ["score", str(source), "--variant", "img", "--models", str(test_models_dir), "-o", str(out)]
    args += ["--detector", str(detector_dir), "--detector-workers", "0", "--no-progress"]
    assert main(args) == 0
    printed = capsys.readouterr()
    assert "scored 5 captions (1 errors" in printed.out
    assert "extracted 4 images" in printed.err and "1 could not be used" in printed.err
    rows = [json.loads(line) for line in out.open()]
    assert [r["id"] for r in rows] == ["a", "b", "c", "d", "f"]
    assert all(isinstance(r["qace"], float) and 0 <= r["qace"] <= 1 for r in rows)
    assert [r["image_id"] for r in rows] == ["beach", "dog", "kitchen", "kitchen", 7]  # #37.8: 7 stays an int
    (error,) = [json.loads(line) for line in (tmp_path / "run" / "scores.errors.jsonl").open()]
    assert error["id"] == "e" and "its extraction failed (unreadable image" in error["reason"]  # #37.8
    cache = tmp_path / "run" / "scores.features.h5"
    with HDF5Store(cache) as store:
        assert sorted(store.ids()) == ["7", "beach", "dog", "kitchen"]
        assert f"|feat:{store.identity}|" in rows[0]["signature"] and store.identity.startswith(
            "det-"
        )  # #37.7


def _mixed_folder(folder: Path) -> list[ImageItem]:
    """Good images of several sizes (so batches differ in shape), with unreadable and too-small ones
    among them, some batches with none usable."""
    sizes = [(64, 48), (48, 64), (90, 40), (64, 48), (120, 90), (40, 100), (64, 64), (70, 50)]
    for i, size in enumerate(sizes):
        _png(folder / f"good{i}.png", 10 + i, size=size)
    _png(folder / "good2b.png", 30, size=(8, 8))  # too small
    (folder / "good5b.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    _png(folder / "zz_tiny.png", 31, size=(6, 9))
    (folder / "zz_zbroken.png").write_bytes(b"nope")  # the last batch of 2: nothing usable
    return gather_images(folder)


def _one_call_at_a_time(
    items: list[ImageItem], detector, batch_size: int
) -> tuple[dict[str, np.ndarray], list[str], list[dict[str, str]]]:
    """What extraction stored before the upload thread: each loader batch through `detect_resized` in this
    thread, in order; (regions as the store holds them, ids in order, errors in order)."""
    regions: dict[str, np.ndarray] = {}
    errors: list[dict[str, str]] = []
    for batch in decode_batches(items, detector.config, batch_size, 0):
        usable = [d for d in batch if d.pixels is not None]
        errors += [{"image_id": d.item.key, "path": d.item.path, "reason": d.error} for d in batch if d.error]
        if usable:
            found = detector.detect_resized([d.pixels for d in usable], [d.size for d in usable])
            for d, result in zip(usable, found, strict=True):
                if isinstance(result, str):
                    errors.append({"image_id": d.item.key, "path": d.item.path, "reason": result})
                else:
                    regions[d.item.key] = result.regions().astype(np.float16).astype(np.float32)
    return regions, list(regions), errors


def _stored(out: Path) -> tuple[dict[str, np.ndarray], list[str], list[dict[str, str]]]:
    with HDF5Store(out) as store:
        ids = store.ids()
        regions = {key: store.get(key) for key in ids}
    errors = [json.loads(line) for line in out.with_name(out.stem + ".errors.jsonl").open()]
    return regions, ids, errors


@pytest.mark.parametrize("workers", [0, 2])
def test_uploading_ahead_stores_what_one_call_at_a_time_did(
    detector_dir: Path, tmp_path: Path, workers: int
) -> None:
    """The upload thread changes nothing: the same rows in the same order and the same errors, in order,
    as each batch through `detect_resized` in turn (batches of 2, up to three uploaded ahead)."""
    detector = load_detector(str(detector_dir), "cpu")
    items = _mixed_folder(tmp_path / "imgs")
    summary = extract_features(
        items, tmp_path / "f.h5", detector, detector_name="t", batch_size=2, workers=workers, progress=False
    )
    regions, ids, errors = _stored(tmp_path / "f.h5")
    want_regions, want_ids, want_errors = _one_call_at_a_time(items, detector, 2)
    assert ids == want_ids and len(ids) == 8
    assert errors == want_errors and len(errors) == 4
    for key in ids:
        np.testing.assert_array_equal(regions[key], want_regions[key])
    assert (summary.extracted, summary.errors, summary.batches) == (8, 4, 6)
    assert summary.input_wait_s >= 0


def _broken_after(first: int, exc: Exception):
    """A stand-in for ``decode_batches`` whose iterator yields ``first`` real batches, then raises."""

    def batches(items, config, batch_size, workers):
        for k, batch in enumerate(decode_batches(items, config, batch_size, workers)):
            if k == first:
                raise exc
            yield batch

    return batches


def test_an_error_in_the_loader_or_the_upload_reaches_the_caller(
    detector_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Raised in the upload thread, raised by `extract_features` after the batches before it are stored;
    the thread is gone afterwards."""
    detector = load_detector(str(detector_dir), "cpu")
    items = [ImageItem(p.stem, str(p)) for p in (_png(tmp_path / f"{i}.png", i) for i in range(6))]
    with monkeypatch.context() as m:
        m.setattr(extract_module, "decode_batches", _broken_after(1, OSError("disk gone")))
        with pytest.raises(OSError, match="disk gone"):
            extract_features(
                items, tmp_path / "a.h5", detector, detector_name="t", batch_size=2, progress=False
            )
    with HDF5Store(tmp_path / "a.h5") as store:
        assert store.ids() == ["0", "1"]

    calls = []

    def upload(images):
        calls.append(len(images))
        if len(calls) == 2:
            raise RuntimeError("upload failed")
        return type(detector).upload(detector, images)

    with monkeypatch.context() as m:
        m.setattr(detector, "upload", upload)
        with pytest.raises(RuntimeError, match="upload failed"):
            extract_features(
                items, tmp_path / "b.h5", detector, detector_name="t", batch_size=2, progress=False
            )
    assert not [t for t in threading.enumerate() if t.name == "qace-feature-upload"]


def test_an_error_in_the_detector_stops_the_upload_thread(
    detector_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    detector = load_detector(str(detector_dir), "cpu")
    items = [ImageItem(p.stem, str(p)) for p in (_png(tmp_path / f"{i}.png", i) for i in range(8))]

    def detect_uploaded(*args, **kwargs):
        raise ValueError("detector failed")

    monkeypatch.setattr(detector, "detect_uploaded", detect_uploaded)
    with pytest.raises(ValueError, match="detector failed"):  # while the upload thread has batches queued
        extract_features(items, tmp_path / "c.h5", detector, detector_name="t", batch_size=1, progress=False)
    assert not [t for t in threading.enumerate() if t.name == "qace-feature-upload"]


@pytest.mark.gpu
def test_uploading_ahead_on_cuda_stores_what_the_cpu_does(detector_dir: Path, tmp_path: Path) -> None:
    """On a GPU (pinned buffer reused while up to three batches are uploaded ahead, one stream): the same
    ids, order and errors as one call at a time on the GPU and as the CPU, and the same regions (TF32 off,
    so that CUDA's fp32 convolutions are close to the CPU's; the store holds fp16)."""
    import torch

    items = _mixed_folder(tmp_path / "imgs")
    cpu = load_detector(str(detector_dir), "cpu")
    gpu = load_detector(str(detector_dir), "cuda")
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        extract_features(
            items, tmp_path / "g.h5", gpu, detector_name="t", batch_size=2, workers=2, progress=False
        )
        regions, ids, errors = _stored(tmp_path / "g.h5")
        sequential = _one_call_at_a_time(items, gpu, 2)
    finally:
        torch.backends.cudnn.allow_tf32 = tf32
    for want_regions, want_ids, want_errors in (sequential, _one_call_at_a_time(items, cpu, 2)):
        assert ids == want_ids and errors == want_errors and len(ids) == 8
        for key in ids:
            np.testing.assert_allclose(regions[key], want_regions[key], rtol=1e-2, atol=1e-3)


def test_a_store_records_its_detectors_weight_hash_and_settings(detector_dir: Path) -> None:
    """#37.7: an extracted store records the detector's identity (weights, settings, precision), not only
    its path; the same weights loaded twice give one identity."""
    import torch

    from qace.features.extract import detector_identity

    detector = load_detector(str(detector_dir), "cpu")
    same = detector_identity(load_detector(str(detector_dir), "cpu"), "fp32")
    assert detector_identity(detector, "fp32") == same and same.startswith("weights:sha256-")
    assert detector_identity(detector, "bf16") != same
    with torch.no_grad():
        next(detector.parameters()).add_(1.0)
    assert detector_identity(detector, "fp32").split("|")[0] != same.split("|")[0]
