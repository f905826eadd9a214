"""``qace features extract`` and QACE-Img straight from image files, with the tiny random detector."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from qace.cli import main
from qace.data.features import HDF5Store
from qace.errors import ConfigError, InputError
from qace.features.extract import ImageItem, RegionWriter, gather_images
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


def test_region_writer_writes_a_batch_at_once_and_lists_the_images_it_refuses(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    good = [rng.standard_normal((36, 2054)).astype(np.float32) for _ in range(3)]
    nan = good[0].copy()
    nan[0, 0] = np.nan
    huge = good[0] * 1e6  # finite in float32, overflows the store's float16
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
    assert "scored 4 captions (1 errors" in printed.out
    assert "extracted 3 images" in printed.err and "1 could not be used" in printed.err
    rows = [json.loads(line) for line in out.open()]
    assert [r["id"] for r in rows] == ["a", "b", "c", "d"]
    assert all(isinstance(r["qace"], float) and 0 <= r["qace"] <= 1 for r in rows)
    (error,) = [json.loads(line) for line in (tmp_path / "run" / "scores.errors.jsonl").open()]
    assert error["id"] == "e" and "broken" in error["reason"]
    cache = tmp_path / "run" / "scores.features.h5"
    with HDF5Store(cache) as store:
        assert sorted(store.ids()) == ["beach", "dog", "kitchen"]
