"""One rule for every feature store (#37): boxes (VL-T5's clamp within 1e-5), ids (exact, then canonical),
typed garbage as the image's error, and an identity for score signatures. Each store kind is written
here from the same (36, 2048) features and normalised boxes: an ``.npz`` folder, qace's HDF5 store
(written directly, since packing refuses bad boxes), VL-T5's HDF5 and a bottom-up-attention TSV."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest

from qace.data.features import HDF5_LAYOUT, HDF5Store, RandomFeatureStore, pack_features
from qace.data.image_ids import canonical_id
from qace.errors import ConfigError, FeatureError
from qace.features.stores import open_feature_store

W, H = 640.0, 480.0
GOOD = RandomFeatureStore(0).get("good")


def _images(**boxes: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``good`` plus one image per keyword: (features (36, 2048), normalised x1, y1, x2, y2 (36, 4))."""
    images = {"good": (GOOD[:, :2048], GOOD[:, 2048:2052])}
    for name, corners in boxes.items():
        images[name] = (GOOD[:, :2048], corners)
    return images


def _six(corners: np.ndarray) -> np.ndarray:
    return np.concatenate([corners, corners[:, 2:] - corners[:, :2]], axis=1)


def write_npz(folder: Path, images: dict) -> Path:
    folder.mkdir()
    for key, (features, corners) in images.items():
        np.savez(folder / f"{key}.npz", features=features, norm_bb=_six(corners))
    return folder


def write_qace_h5(path: Path, images: dict) -> Path:
    with h5py.File(path, "w") as f:
        f["features"] = np.stack([np.concatenate([x, _six(c)], 1) for x, c in images.values()]).astype("f4")
        f.create_dataset("ids", data=list(images), dtype=h5py.string_dtype("utf-8"))
        f.attrs["layout"] = HDF5_LAYOUT
    return path


def write_vlt5(path: Path, images: dict) -> Path:
    with h5py.File(path, "w") as f:
        for key, (features, corners) in images.items():
            group = f.create_group(key)
            group["features"], group["boxes"] = features, corners * np.array([W, H, W, H])
            group["img_h"], group["img_w"] = H, W
    return path


def write_tsv(path: Path, images: dict) -> Path:
    lines = []
    for key, (features, corners) in images.items():
        boxes = (corners * np.array([W, H, W, H])).astype("<f4")
        cells = [key, str(W), str(H), "36", base64.b64encode(boxes.tobytes()).decode(),
                 base64.b64encode(features.astype("<f4").tobytes()).decode()]  # fmt: skip
        lines.append("\t".join(cells))
    path.write_text("\n".join(lines) + "\n")
    return path


WRITERS: dict[str, Callable[[Path, dict], Path]] = {
    "npz": lambda folder, images: write_npz(folder / "npz", images),
    "qace-h5": lambda folder, images: write_qace_h5(folder / "f.h5", images),
    "vlt5-h5": lambda folder, images: write_vlt5(folder / "vlt5.h5", images),
    "tsv": lambda folder, images: write_tsv(folder / "f.tsv", images),
}


def _corners(row: int = 3, **values: float) -> np.ndarray:
    corners = GOOD[:, 2048:2052].astype(np.float64).copy()
    for name, value in values.items():
        corners[row, "x1 y1 x2 y2".split().index(name)] = value
    return corners


@pytest.mark.parametrize("kind", WRITERS)
def test_one_box_rule_for_every_store(kind: str, tmp_path: Path) -> None:
    """#37.3: out-of-range boxes are their image's error in every store (npz and qace HDF5 passed them);
    within 1e-5 of [0, 1] they are clamped; an upside-down or mirrored box says so."""
    edge = _corners(x1=0.0, y1=0.0, x2=1.0, y2=1.0)
    edge[3] += [-4e-6, -4e-6, 4e-6, 4e-6]  # float rounding at the image's edges
    images = _images(
        left=_corners(x1=-0.5),
        right=_corners(x2=3.0),
        slack=_corners(x2=1.0005),  # qace allowed 1e-3 before
        edge=edge,
        upside=_corners(y1=0.6, y2=0.2),
        mirrored=_corners(x1=0.7, x2=0.1),
    )
    store = open_feature_store(WRITERS[kind](tmp_path, images))
    for name in ("left", "right", "slack"):
        with pytest.raises(FeatureError, match=f"'{name}'.*box 3 .*reaches outside the image"):
            store.get(name)
    with pytest.raises(FeatureError, match="'upside'.*box 3 .*is upside down: its bottom edge y2 is above"):
        store.get("upside")
    with pytest.raises(FeatureError, match="'mirrored'.*box 3 .*is mirrored"):
        store.get("mirrored")
    clamped = store.get("edge")[3, 2048:]
    np.testing.assert_allclose(clamped, [0, 0, 1, 1, 1, 1], atol=1e-5)
    assert clamped.min() >= 0.0 and clamped.max() <= 1.0
    np.testing.assert_allclose(store.get("good"), GOOD, rtol=1e-6, atol=1e-6)
    errors: list[tuple[str, str]] = []
    pack_features(store, tmp_path / "packed.h5", errors=errors, progress=False)
    assert sorted(image for image, _ in errors) == ["left", "mirrored", "right", "slack", "upside"]


def test_published_boxes_inside_a_swapped_size_name_the_swap(tmp_path: Path) -> None:
    """A box inside the image only with width and height swapped says so; other bad boxes do not."""
    corners = GOOD[:, 2048:2052].astype(np.float64) * 0.7 * np.array([W, H, W, H])  # inside 448 x 336
    corners[5] = [10, 500, 50, 600]  # y beyond 480, inside a 480 x 640 image
    with h5py.File(tmp_path / "v.h5", "w") as f:
        g = f.create_group("x")
        g["features"], g["boxes"], g["img_h"], g["img_w"] = GOOD[:, :2048], corners, H, W
    with pytest.raises(FeatureError, match="box 5 .* inside a 480x640 one: are its width and height swapped"):
        open_feature_store(tmp_path / "v.h5").get("x")


def _damage_chunk(path: Path, group: str) -> None:
    with h5py.File(path, "r") as f:
        chunk = f[group]["features"].id.get_chunk_info(0)
    data = bytearray(path.read_bytes())
    for k in range(chunk.size // 3, chunk.size // 3 + 64):
        data[chunk.byte_offset + k] ^= 0x5A
    path.write_bytes(bytes(data))


LONG_ID = "9" * 5000


def test_vlt5_faults_cost_their_image_only(tmp_path: Path) -> None:
    """#37.2: each of these stopped the whole run; now each is its image's error and the store opens."""
    path = tmp_path / "vlt5.h5"
    boxes = GOOD[:, 2048:2052] * np.array([W, H, W, H])
    with h5py.File(path, "w") as f:
        for key in ("good", "²", "①", LONG_ID, "damaged", "array_h", "text_w", "text_f", "no_w"):
            g = f.create_group(key)
            features = GOOD[:, :2048]
            if key == "damaged":
                g.create_dataset("features", data=features, chunks=(36, 2048), compression="gzip")
            else:
                g["features"] = features.astype("S8") if key == "text_f" else features
            g["boxes"], g["img_h"] = boxes, np.array([H, H]) if key == "array_h" else H
            if key != "no_w":
                g["img_w"] = np.bytes_(b"wide") if key == "text_w" else W
        f["a_dataset"] = np.zeros(3)
    _damage_chunk(path, "damaged")
    store = open_feature_store(path)
    for key in ("good", "²", "①", LONG_ID):
        np.testing.assert_allclose(store.get(key), GOOD, rtol=1e-6, atol=1e-5)
    assert store.get("0" + LONG_ID).shape == (36, 2054)  # a zero-padded form of a 5,000-digit number
    cases = {
        "damaged": "member 'features' cannot be read",
        "array_h": "img_h is an array of shape (2,), not one number",
        "text_w": "'img_w' holds |S4 values, not numbers",
        "text_f": "'features' holds |S8 values, not numbers",
        "no_w": "member 'img_w' is missing",
        "a_dataset": "holds 'a_dataset' as a Dataset, not a group",
    }
    for key, problem in cases.items():
        with pytest.raises(FeatureError, match=f"image '{key}'") as info:
            store.get(key)
        assert problem in str(info.value)


def test_a_tsv_with_odd_ids_opens_and_typed_garbage_is_the_images_error(tmp_path: Path) -> None:
    """#37.2: a TSV storing ``²`` or a 5,000-digit id could not be opened at all."""
    images = _images(**{"²": GOOD[:, 2048:2052], LONG_ID: GOOD[:, 2048:2052]})
    path = write_tsv(tmp_path / "f.tsv", images)
    with path.open("a") as f:
        f.write("\t".join(["garbage", "wide", "480", "36", "AAAA", "AAAA"]) + "\n")
        f.write(
            "\t".join(["inf", "inf", "480", "36", *path.read_text().split("\n")[0].split("\t")[4:]]) + "\n"
        )
    store = open_feature_store(path)
    assert store.get("²").shape == store.get(LONG_ID).shape == (36, 2054)
    with pytest.raises(FeatureError, match="'garbage'.*unreadable row"):
        store.get("garbage")
    with pytest.raises(FeatureError, match="'inf'.*image size infx480 is not positive"):
        store.get("inf")


def test_an_npz_of_strings_is_its_images_error_in_score_and_pack(tmp_path: Path) -> None:
    """#37.2: string ``features`` killed both `qace score` (the store's get) and `qace features pack`."""
    folder = tmp_path / "npz"
    folder.mkdir()
    np.savez(folder / "good.npz", features=GOOD[:, :2048], norm_bb=GOOD[:, 2048:])
    np.savez(folder / "text.npz", features=np.full((36, 2048), "x"), norm_bb=GOOD[:, 2048:])
    np.savez(folder / "flags.npz", features=GOOD[:, :2048], norm_bb=GOOD[:, 2048:] > 0.5)
    store = open_feature_store(folder)
    with pytest.raises(FeatureError, match="'text'.*'features' holds <U1 values, not numbers"):
        store.get("text")
    with pytest.raises(FeatureError, match="'flags'.*'norm_bb' holds bool values"):
        store.get("flags")
    errors: list[tuple[str, str]] = []
    assert pack_features(store, tmp_path / "p.h5", errors=errors, progress=False) == 1
    assert [image for image, _ in errors] == ["flags", "text"]


@pytest.mark.parametrize("kind", [*WRITERS, "packed"])
def test_one_id_rule_for_every_store(kind: str, tmp_path: Path) -> None:
    """#37.8: qace's own stores (npz folders, packed and extracted HDF5) match ids as the published
    files do, so packing a VL-T5 file keeps every record that scored from it."""
    images = {"COCO_val2014_000000184613": _images()["good"], "1000092795": _images()["good"]}
    if kind == "packed":
        source = open_feature_store(write_vlt5(tmp_path / "vlt5.h5", images))
        pack_features(source, tmp_path / "packed.h5", progress=False)
        store = open_feature_store(tmp_path / "packed.h5")
    else:
        store = open_feature_store(WRITERS[kind](tmp_path, images))
    for given in (
        "184613",
        "000000184613",
        "val2014/COCO_val2014_000000184613.jpg",
        184613,
        "1000092795.jpg",
    ):
        assert given in store
        assert store.get(given).shape == (36, 2054)  # type: ignore[arg-type]
    with pytest.raises(FeatureError, match="no region features for image '184614' .*look like"):
        store.get("184614")


@pytest.mark.parametrize(
    ("given", "canonical"),
    [("²", "²"), ("①", "①"), ("٣", "٣"), (LONG_ID, LONG_ID), ("0" * 3 + LONG_ID, LONG_ID), ("000", "0")],
)
def test_canonical_ids_of_odd_digits_and_long_numbers(given: str, canonical: str) -> None:
    """#37.2: only ASCII digits are a number, and no length of one raises (``int()`` did)."""
    assert canonical_id(given) == canonical


def test_every_kind_of_store_names_its_features(tmp_path: Path) -> None:
    """#37.7: the same features in seven sources give seven identities; the same content twice gives
    one; a changed sampled image or a changed id list changes it; a store object must state one."""
    images = _images()
    images["other"] = images["good"]
    identities = {}
    for kind, write in WRITERS.items():
        (tmp_path / kind).mkdir()
        identities[kind] = open_feature_store(write(tmp_path / kind, images)).identity
    pack_features(open_feature_store(tmp_path / "npz" / "npz"), tmp_path / "packed.h5", progress=False)
    identities["packed"] = open_feature_store(tmp_path / "packed.h5").identity
    identities["random:0"] = open_feature_store("random:0").identity
    identities["random:1"] = open_feature_store("random:1").identity
    assert len(set(identities.values())) == len(identities) == 7
    assert identities["random:0"] == "random:0" and identities["npz"].startswith("npz-")
    again = write_npz(tmp_path / "again", images)
    assert open_feature_store(again).identity == identities["npz"]
    np.savez(again / "other.npz", features=GOOD[:, :2048] + 1, norm_bb=GOOD[:, 2048:])
    assert open_feature_store(again).identity != identities["npz"]
    (again / "other.npz").unlink()
    assert open_feature_store(again).identity != identities["npz"]

    class Anonymous:
        signature = "mine"

        def get(self, image_id: str) -> np.ndarray:
            return GOOD

    with pytest.raises(ConfigError, match="has no 'identity'"):
        open_feature_store(Anonymous())


def test_an_extracted_store_names_its_detector_and_the_reason_an_image_failed(tmp_path: Path) -> None:
    """#37.7 and #37.8: a store with a detector recorded is identified by it (not its content), and an
    image its extraction could not store is reported with the reason listed beside it."""
    from qace.features.extract import RegionWriter

    for name, detector in (("a", "weights:sha256-1|settings:s|precision:fp32"), ("b", "weights:sha256-2|…")):
        writer = RegionWriter(tmp_path / f"{name}.h5", detector, source="/models/detector")
        writer.add([("1000092795", GOOD)])
        writer.close()
    (tmp_path / "a.errors.jsonl").write_text(
        json.dumps({"image_id": "184613", "path": "x.jpg", "reason": "unreadable image (OSError: truncated)"})
        + "\n"
    )
    a, b = HDF5Store(tmp_path / "a.h5"), HDF5Store(tmp_path / "b.h5")
    assert a.identity.startswith("det-") and a.identity != b.identity
    with h5py.File(tmp_path / "a.h5") as f:
        assert (
            f.attrs["detector"].startswith("weights:sha256-1")
            and f.attrs["detector_source"] == "/models/detector"
        )
    with pytest.raises(
        FeatureError, match=r"'COCO_val2014_000000184613'.*extraction failed \(unreadable image"
    ):
        a.get("COCO_val2014_000000184613")
    with pytest.raises(FeatureError, match="no region features for image '7'"):
        a.get("7")
    a.close()
    with pytest.raises(ConfigError, match="holds features of"):
        RegionWriter(tmp_path / "a.h5", "weights:sha256-9|settings:s|precision:fp32")


def test_qace_img_signatures_differ_with_the_features(test_models_dir: Path, tmp_path: Path) -> None:
    """#37.7 through the scorer: two feature sources, two signatures (one string before)."""
    from qace.api import QACE

    folder = write_npz(tmp_path / "npz", _images())
    signatures = {
        QACE(models=test_models_dir, variant="img", features=features, progress=False).signature
        for features in ("random:0", folder)
    }
    assert len(signatures) == 2 and all("|feat:" in s for s in signatures)
