"""Published region-feature files read in place: VL-T5's HDF5 and the bottom-up-attention TSV.

Both hold pixel boxes ``(x1, y1, x2, y2)`` and the image size; Visual-T5 consumes
``norm_boxes``: ``(x1/W, y1/H, x2/W, y2/H, w/W, h/H)`` after the 2,048 pooled features, the layout of
the release's ``norm_bb``, under the box rule of every store (`qace.data.features.checked_boxes`). Any
image with other than 36 boxes, a size that is no positive number, or members that are missing,
damaged or hold no numbers raises `FeatureError`, which costs that image's records only.

Image ids are matched by the rule of every store, `qace.data.image_ids`.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
from pathlib import Path
from typing import IO, Any

import numpy as np

from qace.data.features import FEATURE_DIM, NUM_BOXES, boxes_fit, combine, content_identity, numbers, validate
from qace.data.image_ids import IdIndex
from qace.errors import ConfigError, FeatureError

log = logging.getLogger(__name__)

INDEX_SUFFIX = ".qace-index.json"
INDEX_VERSION = 1
TSV_FIELDS = {
    6: ("image_id", "image_w", "image_h", "num_boxes", "boxes", "features"),
    10: (
        "img_id", "img_h", "img_w", "objects_id", "objects_conf", "attrs_id", "attrs_conf",
        "num_boxes", "boxes", "features",
    ),
}  # fmt: skip
"""Column layouts by count: the original release's ``generate_tsv.py`` and LXMERT's re-extraction.
Neither writes a header row; arrays are base64 of little-endian float32 (int64 for ids)."""


def norm_boxes(image_id: str, boxes: np.ndarray, width: float, height: float, where: str) -> np.ndarray:
    """Pixel ``(x1, y1, x2, y2)`` boxes -> ``(x1/W, y1/H, x2/W, y2/H, w/W, h/H)`` float32 (`validate` applies
    the box rule); boxes that lie outside the image only as given but inside it with width and height
    swapped raise `FeatureError` saying so."""
    boxes = numbers(image_id, "boxes", boxes, where).astype(np.float64)
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise FeatureError(f"image {image_id!r} in {where}: boxes have shape {boxes.shape}, expected (N, 4)")
    if not (np.isfinite(width) and np.isfinite(height) and width > 0 and height > 0):
        raise FeatureError(f"image {image_id!r} in {where}: image size {width:g}x{height:g} is not positive")
    out, swapped = (_normalised(boxes, w, h) for w, h in ((width, height), (height, width)))
    fits = boxes_fit(out)
    if not fits.all() and boxes_fit(swapped).all():
        row = int(np.argmin(fits))
        raise FeatureError(
            f"image {image_id!r} in {where}: box {row} {boxes[row].tolist()} lies outside the {width:g}x"
            f"{height:g} image but inside a {height:g}x{width:g} one: are its width and height swapped?"
        )
    return out.astype(np.float32)


def _normalised(boxes: np.ndarray, width: float, height: float) -> np.ndarray:
    scaled = boxes / np.array([width, height, width, height])
    return np.concatenate([scaled, scaled[:, 2:] - scaled[:, :2]], axis=1)


def regions(
    image_id: str, features: np.ndarray, boxes: np.ndarray, width: float, height: float, where: str
) -> np.ndarray:
    """The validated (36, 2054) model input from pooled features and pixel boxes."""
    features = numbers(image_id, "features", features, where)
    boxes = numbers(image_id, "boxes", boxes, where)
    if features.ndim != 2 or features.shape[0] != NUM_BOXES or boxes.ndim < 1 or len(boxes) != NUM_BOXES:
        raise FeatureError(
            f"image {image_id!r} in {where}: {features.shape[0] if features.ndim else 0} regions, but "
            f"Visual-T5 needs exactly {NUM_BOXES} (use a 36-box release such as trainval_36, or "
            "extract with `qace features extract`)"
        )
    norm = norm_boxes(image_id, boxes, width, height, where)
    return validate(image_id, combine(image_id, features.astype(np.float32), norm, where), where)


class IndexedStore:
    """What the published-file stores share: membership and ids through their `IdIndex` (``_ids``)."""

    _ids: IdIndex

    def __contains__(self, image_id: object) -> bool:
        return self._ids.find(image_id) is not None

    def ids(self) -> list[str]:
        return list(self._ids.stored)


class VLT5HDF5Store(IndexedStore):
    """VL-T5's feature files (``COCO_val2014_obj36.h5``, ``flickr30k_obj36.h5``): one group per image id
    with ``features`` (36, 2048), ``boxes`` (36, 4) pixel x1, y1, x2, y2, ``img_h`` and ``img_w``.
    Other members (class and attribute ids and confidences) are not read."""

    def __init__(self, path: str | Path) -> None:
        import h5py

        self.path = Path(path)
        try:
            self._file = h5py.File(self.path, "r")
        except OSError as exc:
            raise ConfigError(f"cannot open {str(self.path)!r} as HDF5: {exc}") from exc
        self.signature = f"vlt5-h5:{self.path.name}:{len(self._file)} images"
        self._ids = IdIndex(list(self._file.keys()), self.signature)
        self.identity = content_identity("vlt5", self.ids(), self.get)

    @staticmethod
    def recognises(path: Path) -> bool:
        """Whether ``path`` is an HDF5 file in VL-T5's layout (groups holding ``features`` and ``boxes``)."""
        import h5py

        try:
            with h5py.File(path, "r") as f:
                first = next(iter(f.values()), None)
                return isinstance(first, h5py.Group) and {"features", "boxes", "img_h", "img_w"} <= set(first)
        except OSError:
            return False

    def get(self, image_id: str) -> np.ndarray:
        import h5py

        key = self._ids.key(image_id)
        where = f"{self.signature} group {key!r}"
        group = self._file.get(key)
        if not isinstance(group, h5py.Group):
            raise FeatureError(
                f"image {image_id!r}: {self.signature} holds {key!r} as a {type(group).__name__}, not a "
                "group of features, boxes, img_h and img_w"
            )
        features, boxes, height, width = (_member(image_id, group, name, where) for name in _VLT5_MEMBERS)
        width_px, height_px = _size(image_id, width, "img_w", where), _size(image_id, height, "img_h", where)
        return regions(image_id, features, boxes, width_px, height_px, where)

    def close(self) -> None:
        self._file.close()


_VLT5_MEMBERS = ("features", "boxes", "img_h", "img_w")


def _member(image_id: str, group: Any, name: str, where: str) -> np.ndarray:
    """The dataset ``name`` of an image's group, read whole; `FeatureError` when it is missing, no dataset,
    or cannot be read (a damaged chunk)."""
    import h5py

    member = group.get(name)
    if not isinstance(member, h5py.Dataset):
        found = "missing" if member is None else f"a {type(member).__name__}, not a dataset"
        raise FeatureError(f"image {image_id!r}: {where} member {name!r} is {found}")
    try:
        return np.asarray(member[()])
    except (OSError, ValueError, TypeError) as exc:  # a damaged chunk: "filter returned failure during read"
        raise FeatureError(
            f"image {image_id!r}: {where} member {name!r} cannot be read ({exc}); the file is damaged: "
            "copy it again"
        ) from exc


def _size(image_id: str, value: np.ndarray, name: str, where: str) -> float:
    """An image side stored as one number (a scalar or a one-element array), else `FeatureError`."""
    value = numbers(image_id, name, value, where)
    if value.size != 1:
        raise FeatureError(
            f"image {image_id!r} in {where}: {name} is an array of shape {value.shape}, not one number"
        )
    return float(value.reshape(()))


class BUTDTSVStore(IndexedStore):
    """A bottom-up-attention TSV (``trainval_36.tsv`` and the like), read in place by byte offset.

    The first open scans the file once for each line's image id and byte offset and writes them to a
    sidecar ``<file>.qace-index.json`` (or keeps them in memory if the folder is read-only); later
    opens read the sidecar, which is rebuilt when the file's size or modification time changes.
    Threads may share a store: a line is sought and read under a lock, and must name the image asked for.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ConfigError(f"feature file {str(self.path)!r} does not exist")
        offsets = load_or_build_index(self.path)
        self._offsets = offsets
        self.signature = f"butd-tsv:{self.path.name}:{len(offsets)} images"
        self._ids = IdIndex(list(offsets), self.signature)
        self._file: IO[bytes] | None = None
        self._lock = threading.Lock()
        self.identity = content_identity("tsv", self.ids(), self.get)

    def get(self, image_id: str) -> np.ndarray:
        key = self._ids.key(image_id)
        with self._lock:  # one file position: a seek and its read are not split between threads
            if self._file is None:
                self._file = self.path.open("rb")
            self._file.seek(self._offsets[key])
            line = self._file.readline()
        where = f"{self.signature} line of {key!r}"
        found = _line_id(line)
        if found != key:
            raise FeatureError(
                f"image {image_id!r}: {where} holds image {found!r}; its index is stale: delete "
                f"{str(self.path.with_name(self.path.name + INDEX_SUFFIX))!r} and run again"
            )
        return parse_tsv_line(image_id, line, where)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def parse_tsv_line(image_id: str, line: bytes, where: str) -> np.ndarray:
    """One TSV line (either layout of `TSV_FIELDS`) -> the validated (36, 2054) model input."""
    cells = line.rstrip(b"\r\n").split(b"\t")
    names = TSV_FIELDS.get(len(cells))
    if names is None:
        raise FeatureError(f"image {image_id!r} in {where}: {len(cells)} columns, expected 6 or 10")
    row = dict(zip(names, cells, strict=True))
    try:
        count = int(row["num_boxes"])
        width = float(row["image_w" if "image_w" in row else "img_w"])
        height = float(row["image_h" if "image_h" in row else "img_h"])
        boxes = np.frombuffer(base64.b64decode(row["boxes"]), dtype="<f4").reshape(count, 4)
        features = np.frombuffer(base64.b64decode(row["features"]), dtype="<f4").reshape(count, -1)
    except ValueError as exc:
        raise FeatureError(f"image {image_id!r} in {where}: unreadable row ({exc})") from exc
    if features.shape[1] != FEATURE_DIM:
        raise FeatureError(f"image {image_id!r} in {where}: features are {features.shape[1]}-d, not 2048")
    return regions(image_id, features, boxes, width, height, where)


def _line_id(line: bytes) -> str:
    """The image id a TSV line starts with (its first column)."""
    return line.split(b"\t", 1)[0].decode("utf-8", errors="replace").strip()


def load_or_build_index(path: Path) -> dict[str, int]:
    """Image id -> byte offset of its line, from the sidecar if it matches the file, else by one scan."""
    sidecar = path.with_name(path.name + INDEX_SUFFIX)
    stat = path.stat()
    stamp = {"version": INDEX_VERSION, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    try:
        data = json.loads(sidecar.read_text())
        if {k: data.get(k) for k in stamp} == stamp:
            return {str(k): int(v) for k, v in data["offsets"].items()}
        log.info("%s changed since it was indexed; re-indexing", path)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    offsets: dict[str, int] = {}
    position = 0
    with path.open("rb") as f:
        for line in f:
            key = _line_id(line)
            if key in offsets:
                raise ConfigError(f"{str(path)!r}: image id {key!r} appears twice")
            if key:
                offsets[key] = position
            position += len(line)
    try:
        tmp = sidecar.with_name(sidecar.name + ".tmp")
        tmp.write_text(json.dumps({**stamp, "offsets": offsets}))
        os.replace(tmp, sidecar)
    except OSError as exc:
        log.warning("cannot write the index %s (%s); it is kept in memory for this run", sidecar, exc)
    return offsets


def open_published(path: Path):  # noqa: ANN201
    """A store for a published feature file, or None when ``path`` is not one: ``.tsv`` files, and
    ``.h5``/``.hdf5`` files in VL-T5's layout."""
    suffix = path.suffix.lower()
    if suffix == ".tsv":
        return BUTDTSVStore(path)
    if suffix in (".h5", ".hdf5") and path.is_file() and VLT5HDF5Store.recognises(path):
        return VLT5HDF5Store(path)
    return None
