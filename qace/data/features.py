"""Region features keyed by image id: the (36, 2054) float32 input Visual-T5 consumes.

The release stores one ``.npz`` per image with ``features`` (36, 2048) and ``norm_bb`` (36, 6)
(both fp16); the model input is their concatenation in stored box order (region order matters:
the relative position bias spans all 102 encoder positions). Every store validates what it
returns: a missing image, a wrong shape or NaN/Inf raises `FeatureError` naming the image and the
store, and so does a file that cannot be read (a damaged HDF5 chunk, a truncated, bad-CRC or
badly compressed ``.npz``, a file that is no ``.npz``), so one bad file costs its captions only, never
the run. Nothing is silently fixed, because a zero-filled or clipped feature would quietly change
scores.

Stores:
- `NpzDirStore`: the release layout, ``<dir>/<image_id>.npz``.
- `HDF5Store`: one consolidated file for a whole data set (see its docstring for why HDF5), made by
  `pack_features`.
- `RandomFeatureStore`: deterministic random features for benchmarks and offline demos.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import tokenize
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Sized
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from qace.errors import ConfigError, FeatureError

log = logging.getLogger(__name__)

NUM_BOXES = 36
FEATURE_DIM = 2048
BOX_DIM = 6
REGION_DIM = FEATURE_DIM + BOX_DIM
REGION_SHAPE = (NUM_BOXES, REGION_DIM)
HDF5_LAYOUT = "qace-region-features-v1"
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
"""The first bytes of an HDF5 file (without a user block, as every store qace writes)."""


@runtime_checkable
class FeatureStore(Protocol):
    """Anything that maps an image id to its validated (36, 2054) float32 region features."""

    signature: str
    """Short description of the store (kind, location, size) for logs and error messages."""

    def get(self, image_id: str) -> np.ndarray: ...

    def __contains__(self, image_id: object) -> bool: ...

    def ids(self) -> Iterable[str]: ...


def combine(image_id: str, features: np.ndarray, norm_bb: np.ndarray, where: str) -> np.ndarray:
    """Concatenate the release's ``features`` and ``norm_bb`` into the model input, after checking shapes."""
    if features.shape != (NUM_BOXES, FEATURE_DIM):
        raise FeatureError(
            f"image {image_id!r} in {where}: 'features' has shape {features.shape}, "
            f"expected {(NUM_BOXES, FEATURE_DIM)}"
        )
    if norm_bb.shape != (NUM_BOXES, BOX_DIM):
        raise FeatureError(
            f"image {image_id!r} in {where}: 'norm_bb' has shape {norm_bb.shape}, "
            f"expected {(NUM_BOXES, BOX_DIM)}"
        )
    return np.concatenate([features, norm_bb], axis=1).astype(np.float32)


def validate(image_id: str, array: np.ndarray, where: str) -> np.ndarray:
    """Return `array` as float32 if it is (36, 2054) and finite, else raise `FeatureError`."""
    if array.shape != REGION_SHAPE:
        raise FeatureError(
            f"image {image_id!r} in {where}: region features have shape {array.shape}, "
            f"expected {REGION_SHAPE}"
        )
    array = np.asarray(array, dtype=np.float32)
    finite = np.isfinite(array)
    if not finite.all():
        bad = int(array.size - np.count_nonzero(finite))
        nans = int(np.isnan(array).sum())
        raise FeatureError(
            f"image {image_id!r} in {where}: {bad} non-finite values ({nans} NaN, {bad - nans} Inf); "
            "re-extract the features"
        )
    return array


def _missing(image_id: str, where: str) -> FeatureError:
    return FeatureError(f"no region features for image {image_id!r} in {where}", record_id=None)


def _candidates(image_id: str) -> list[str]:
    """The id itself, then the id with its extension stripped (Flickr ids look like ``123_abc.jpg``)."""
    stem, ext = os.path.splitext(image_id)
    return [image_id, stem] if ext and stem else [image_id]


ZIP_MAGIC = b"PK\x03\x04"
"""How every ``.npz`` (a zip archive of ``.npy`` files) begins."""
DAMAGED_NPZ = (
    OSError,
    ValueError,
    EOFError,
    SyntaxError,
    tokenize.TokenError,
    zipfile.BadZipFile,
    zlib.error,
)
"""What numpy and zipfile raise on a truncated, bad-CRC or badly compressed archive (numpy parses an
array's header with ``ast``, so a damaged header raises SyntaxError or TokenError)."""


def read_npz(image_id: str, path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``features`` and ``norm_bb`` of a release ``.npz``; a file that is no ``.npz``, is truncated or
    damaged, or lacks a key raises `FeatureError` naming the image, the file and the fix."""
    try:
        with path.open("rb") as handle:
            head = handle.read(len(ZIP_MAGIC))
    except OSError as exc:
        raise FeatureError(f"image {image_id!r}: cannot read {path}: {exc}") from exc
    if head != ZIP_MAGIC:  # np.load would take it for a .npy, or for pickled data
        raise FeatureError(
            f"image {image_id!r}: {path} is not an .npz file (no zip header; "
            f"{'it is empty' if not head else f'it starts with {head!r}'}); re-extract the features"
        )
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = [key for key in ("features", "norm_bb") if key not in data.files]
            if missing:
                raise FeatureError(f"image {image_id!r}: {path} lacks {missing} (has {data.files})")
            return data["features"], data["norm_bb"]
    except DAMAGED_NPZ as exc:
        kind = f"{type(exc).__module__}.{type(exc).__name__}".removeprefix("builtins.")
        raise FeatureError(
            f"image {image_id!r}: {path} cannot be read, it is truncated or damaged ({kind}: {exc}); "
            "re-extract it or copy it again"
        ) from exc


class NpzDirStore:
    """The release layout: one ``<directory>/<image_id>.npz`` per image.

    Ids are tried as given, then with their extension stripped, since Flickr ids carry ``.jpg``.
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise ConfigError(f"feature directory {str(self.directory)!r} does not exist")
        self.signature = f"npz-dir:{self.directory}"

    def _path(self, image_id: str) -> Path | None:
        if not image_id or "/" in image_id or "\\" in image_id or image_id in (".", ".."):
            return None  # never let an id escape the directory
        for name in _candidates(image_id):
            path = self.directory / f"{name}.npz"
            if path.is_file():
                return path
        return None

    def __contains__(self, image_id: object) -> bool:
        return isinstance(image_id, str) and self._path(image_id) is not None

    def ids(self) -> list[str]:
        """File stems of every ``.npz`` in the directory, sorted (a stable packing order)."""
        return sorted(p.stem for p in self.directory.glob("*.npz"))

    def get(self, image_id: str) -> np.ndarray:
        path = self._path(image_id)
        if path is None:
            raise _missing(image_id, self.signature)
        features, norm_bb = read_npz(image_id, path)
        return validate(image_id, combine(image_id, features, norm_bb, str(path)), str(path))


class HDF5Store:
    """Many images in one HDF5 file, made by `pack_features`.

    Layout: dataset ``features`` (N, 36, 2054) in the source dtype (fp16 by default: the release
    features are fp16, so this halves the size at no loss), chunked one image per chunk with
    shuffle + gzip level 1, and ``ids`` (N,) utf-8 strings; the id -> row index is built on open.

    Why HDF5: random access by image reads exactly one chunk; one file instead of 100k small
    files (kind to shared and network file systems, one thing to copy); per-chunk compression;
    readable from any language (h5py, HDF5 C, MATLAB, Julia); partial reads without loading the
    file. Parquet is built for column scans, so a single image means decoding a whole row group;
    LMDB needs its own package, is not readable without it, and grows its map size by hand.
    """

    def __init__(self, path: str | Path) -> None:
        import h5py

        self.path = Path(path)
        if not self.path.is_file():
            raise ConfigError(f"feature file {str(self.path)!r} does not exist")
        try:
            self._file = h5py.File(self.path, "r")
        except OSError as exc:
            with self.path.open("rb") as f:
                hdf5 = f.read(len(HDF5_SIGNATURE)) == HDF5_SIGNATURE
            what = "an HDF5 file that is truncated or damaged" if hdf5 else "not an HDF5 file"
            raise ConfigError(
                f"{str(self.path)!r} is {what} ({exc}); make it again (pack_features, qace features pack)"
            ) from exc
        try:
            self._features = self._file["features"]
            names = self._file["ids"].asstr()[:]
        except (OSError, KeyError) as exc:
            raise ConfigError(
                f"{str(self.path)!r} is not a qace feature file (pack_features makes one): {exc}"
            ) from exc
        if self._features.shape[1:] != REGION_SHAPE or len(names) != self._features.shape[0]:
            raise ConfigError(
                f"{str(self.path)!r}: features {self._features.shape} and {len(names)} ids do not match "
                f"the (N, {NUM_BOXES}, {REGION_DIM}) layout"
            )
        self._index = {str(name): row for row, name in enumerate(names)}
        self.dtype = np.dtype(self._features.dtype)
        self.signature = f"hdf5:{self.path.name}:{len(self._index)} images:{self.dtype.name}"

    def _row(self, image_id: object) -> int | None:
        if not isinstance(image_id, str):
            return None
        for name in _candidates(image_id):
            if name in self._index:
                return self._index[name]
        return None

    def __contains__(self, image_id: object) -> bool:
        return self._row(image_id) is not None

    def __len__(self) -> int:
        return len(self._index)

    def ids(self) -> list[str]:
        """Image ids in file order."""
        return list(self._index)

    def get(self, image_id: str) -> np.ndarray:
        row = self._row(image_id)
        if row is None:
            raise _missing(image_id, self.signature)
        try:
            stored = self._features[row]
        except OSError as exc:  # e.g. a damaged chunk: "filter returned failure during read"
            raise FeatureError(
                f"image {image_id!r} in {self.signature}: row {row} cannot be read ({exc}); the file is "
                "damaged: pack it again from the source features"
            ) from exc
        return validate(image_id, stored, self.signature)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> HDF5Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RandomFeatureStore:
    """Deterministic random features per image id (a hash of seed and id), for benchmarks and demos.

    Every id is "contained" and `ids()` is empty (the domain is unbounded). Values look like the
    real thing: non-negative pooled features and well-formed normalized boxes.
    """

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.signature = f"random:seed={seed}"

    def __contains__(self, image_id: object) -> bool:
        return isinstance(image_id, str)

    def ids(self) -> list[str]:
        return []

    def get(self, image_id: str) -> np.ndarray:
        digest = hashlib.blake2b(f"{self.seed}\0{image_id}".encode(), digest_size=8).digest()
        rng = np.random.default_rng(int.from_bytes(digest, "little"))
        features = rng.exponential(0.5, size=(NUM_BOXES, FEATURE_DIM))
        corners = np.sort(rng.uniform(0.0, 1.0, size=(NUM_BOXES, 2, 2)), axis=1)  # [x1, x2], [y1, y2]
        x1, x2, y1, y2 = corners[:, 0, 0], corners[:, 1, 0], corners[:, 0, 1], corners[:, 1, 1]
        boxes = np.stack([x1, y1, x2, y2, x2 - x1, y2 - y1], axis=1)
        return np.concatenate([features, boxes], axis=1).astype(np.float32)


def pack_features(
    source: FeatureStore | Iterable[tuple[str, np.ndarray]],
    out_path: str | Path,
    *,
    dtype: Any = np.float16,
    progress: bool = True,
    errors: list[tuple[str, str]] | None = None,
) -> int:
    """Write `source` (a store, or (image_id, array) pairs) to one HDF5 file; return the image count.

    The file is written to ``<out_path>.tmp`` and renamed, so a crash never leaves a half file.
    Inputs are validated first and must stay finite in `dtype` (fp16 overflows above 65504). A bad
    image (unreadable, misshaped, non-finite, overflowing `dtype`, or an id seen before) raises
    `FeatureError`; with an ``errors`` list it is appended there as ``(image_id, reason)`` instead,
    left out of the file, and packing goes on.
    """
    import h5py

    from qace.progress import track

    dtype = np.dtype(dtype)
    if dtype not in (np.float16, np.float32):
        raise ConfigError(f"pack_features stores float16 or float32, not {dtype}")
    out_path = Path(out_path)
    tmp = out_path.with_name(out_path.name + ".tmp")
    pairs, total = _pairs(source)
    seen: set[str] = set()
    try:
        with (
            h5py.File(tmp, "w") as f,
            track("packing features", total=total, unit="image", enabled=progress) as bar,
        ):
            data = f.create_dataset(
                "features",
                shape=(0, *REGION_SHAPE),
                maxshape=(None, *REGION_SHAPE),
                dtype=dtype,
                chunks=(1, *REGION_SHAPE),
                compression="gzip",
                compression_opts=1,
                shuffle=True,
            )
            names = f.create_dataset("ids", shape=(0,), maxshape=(None,), dtype=h5py.string_dtype("utf-8"))
            f.attrs["layout"] = HDF5_LAYOUT
            for image_id, load in pairs:
                try:
                    stored = _packable(image_id, load, dtype, seen)
                except FeatureError as exc:
                    if errors is None:
                        raise
                    errors.append((image_id, str(exc)))
                    bar.update(1)
                    continue
                seen.add(image_id)
                row = len(seen) - 1
                data.resize(row + 1, axis=0)
                names.resize(row + 1, axis=0)
                data[row] = stored
                names[row] = image_id
                bar.update(1)
        os.replace(tmp, out_path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    log.info("packed %d images into %s (%s)", len(seen), out_path, dtype.name)
    return len(seen)


def _packable(image_id: str, load: Callable[[], Any], dtype: np.dtype, seen: set[str]) -> np.ndarray:
    """The validated features of one image in `dtype`, or `FeatureError` saying why it cannot be packed."""
    if image_id in seen:
        raise FeatureError(f"image {image_id!r} appears twice in the packing source")
    with np.errstate(over="ignore"):  # overflow is reported just below, by image
        stored = validate(image_id, np.asarray(load()), "packing source").astype(dtype)
    if not np.isfinite(stored).all():
        raise FeatureError(
            f"image {image_id!r}: values overflow {dtype.name}; pack with float32 "
            "(`qace features pack --dtype float32`, or pack_features(dtype=np.float32))"
        )
    return stored


def _pairs(
    source: FeatureStore | Iterable[tuple[str, np.ndarray]],
) -> tuple[Iterator[tuple[str, Callable[[], Any]]], int | None]:
    """(image_id, loader) pairs and their count when known; a loader reads its image when called, so
    one unreadable image fails alone."""
    if isinstance(source, FeatureStore):
        ids = list(source.ids())
        return ((image_id, functools.partial(source.get, image_id)) for image_id in ids), len(ids)
    total = len(source) if isinstance(source, Sized) else None
    return ((image_id, functools.partial(_given, array)) for image_id, array in source), total


def _given(array: Any) -> Any:
    return array
