"""Region features keyed by image id: the (36, 2054) float32 input Visual-T5 consumes.

The release stores one ``.npz`` per image with ``features`` (36, 2048) and ``norm_bb`` (36, 6)
(both fp16); the model input is their concatenation in stored box order (region order matters:
the relative position bias spans all 102 encoder positions). Every store validates what it
returns (`validate`): a missing image, a wrong shape, values that are no numbers or NaN/Inf raise
`FeatureError` naming the image and the store, and so does a file that cannot be read (a damaged HDF5
chunk, a truncated, bad-CRC or badly compressed ``.npz``, a file that is no ``.npz``), so one bad file
costs its captions only, never the run. Nothing is silently fixed, because a zero-filled or clipped
feature would quietly change scores, with one exception, VL-T5's: the box rule (`checked_boxes`)
clamps a box number that lies at most `BOX_TOLERANCE` outside ``[0, 1]`` (float rounding) and refuses
one further out, in every store.

Every store matches image ids by one rule (`qace.data.image_ids`) and states its ``identity``, which
QACE-Img's score signature carries (`content_identity`, and docs/features.md).

Stores:
- `NpzDirStore`: the release layout, ``<dir>/<image_id>.npz``.
- `HDF5Store`: one consolidated file for a whole data set (see its docstring for why HDF5), made by
  `pack_features`.
- `RandomFeatureStore`: deterministic random features for benchmarks and offline demos.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import tokenize
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from qace.data.hdf5_chunks import direct_chunks, inflated_unshuffled
from qace.data.image_ids import IdIndex
from qace.errors import ConfigError, FeatureError

log = logging.getLogger(__name__)

NUM_BOXES = 36
FEATURE_DIM = 2048
BOX_DIM = 6
REGION_DIM = FEATURE_DIM + BOX_DIM
REGION_SHAPE = (NUM_BOXES, REGION_DIM)
HDF5_LAYOUT = "qace-region-features-v1"
BOX_TOLERANCE = 1e-5
"""How far outside ``[0, 1]`` a normalised box number may lie and be clamped (VL-T5's check)."""
IDENTITY_SAMPLE = 16
"""Images whose features a content identity hashes (`content_identity`)."""
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
"""The first bytes of an HDF5 file (without a user block, as every store qace writes)."""


@runtime_checkable
class FeatureStore(Protocol):
    """Anything that maps an image id to its validated (36, 2054) float32 region features. ``get`` may be
    called from several threads at once (a scorer's prefetch thread, the reward service's concurrent
    batches), so a store reading through one shared handle holds a lock around each read."""

    signature: str
    """Short description of the store (kind, location, size) for logs and error messages."""
    identity: str
    """What the features are, for score signatures: ``<kind>-<12 hex>`` (`content_identity`, or a detector's
    weight hash and settings), or ``random:<seed>``."""

    def get(self, image_id: str) -> np.ndarray: ...

    def __contains__(self, image_id: object) -> bool: ...

    def ids(self) -> Iterable[str]: ...


def combine(image_id: str, features: np.ndarray, norm_bb: np.ndarray, where: str) -> np.ndarray:
    """Concatenate the release's ``features`` and ``norm_bb`` into the model input, after checking that
    both hold numbers and their shapes."""
    features = numbers(image_id, "features", features, where)
    norm_bb = numbers(image_id, "norm_bb", norm_bb, where)
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


def numbers(image_id: str, name: str, array: Any, where: str) -> np.ndarray:
    """``array`` as an ndarray when it holds integers or floats; `FeatureError` naming ``name`` otherwise
    (strings, objects, booleans, complex numbers)."""
    array = np.asarray(array)
    if array.dtype.kind not in "fiu":
        raise FeatureError(
            f"image {image_id!r} in {where}: {name!r} holds {array.dtype} values, not numbers; "
            "re-extract the features"
        )
    return array


def validate(image_id: str, array: np.ndarray, where: str) -> np.ndarray:
    """Return `array` as float32 if it holds numbers, is (36, 2054) and finite and its boxes pass
    `checked_boxes` (which clamps them), else raise `FeatureError`."""
    array = numbers(image_id, "region features", array, where)
    if array.shape != REGION_SHAPE:
        raise FeatureError(
            f"image {image_id!r} in {where}: region features have shape {array.shape}, "
            f"expected {REGION_SHAPE}"
        )
    array = _as_float32(array)
    finite = np.isfinite(array)
    if not finite.all():
        bad = int(array.size - np.count_nonzero(finite))
        nans = int(np.isnan(array).sum())
        raise FeatureError(
            f"image {image_id!r} in {where}: {bad} non-finite values ({nans} NaN, {bad - nans} Inf); "
            "re-extract the features"
        )
    boxes = array[:, FEATURE_DIM:]
    clamped = checked_boxes(image_id, boxes, where)
    if clamped is not boxes:
        array = array.copy()
        array[:, FEATURE_DIM:] = clamped
    return array


@functools.cache
def _half_to_float() -> np.ndarray:
    """Every float16 bit pattern's float32 value, as numpy converts it (NaN payloads included)."""
    return np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)


def _as_float32(array: np.ndarray) -> np.ndarray:
    """``array`` as float32, bit for bit as ``astype`` gives it. Native float16 (how stores keep features)
    is looked up in `_half_to_float`: numpy converts half precision element by element, about 0.3 ms an
    image on a 2-core host's CPU, the lookup about a fifth of that."""
    if array.dtype == np.dtype(np.float16):
        return np.take(_half_to_float(), np.ascontiguousarray(array).view(np.uint16))
    return np.asarray(array, dtype=np.float32)


def boxes_fit(boxes: np.ndarray) -> np.ndarray:
    """Per box (a row ``x1, y1, x2, y2, w, h`` over the image's width and height): whether every number
    lies in ``[0, 1]`` within `BOX_TOLERANCE`."""
    return np.all((boxes >= -BOX_TOLERANCE) & (boxes <= 1 + BOX_TOLERANCE), axis=1)


def checked_boxes(image_id: str, boxes: np.ndarray, where: str) -> np.ndarray:
    """The box rule of every store, VL-T5's: ``boxes`` (N, 6) clamped to ``[0, 1]`` when every number
    lies within `BOX_TOLERANCE` of it (``boxes`` itself when nothing needs clamping); `FeatureError`
    naming the first box that is upside down (y2 < y1), mirrored (x2 < x1) or reaches further out."""
    for low, high, fault in (
        (1, 3, "upside down: its bottom edge y2 is above its top edge y1"),
        (0, 2, "mirrored: its right edge x2 is left of its left edge x1"),
    ):
        flipped = boxes[:, high] < boxes[:, low] - BOX_TOLERANCE
        if flipped.any():
            row = int(np.argmax(flipped))
            raise FeatureError(
                f"image {image_id!r} in {where}: box {row} {_box(boxes[row])} is {fault}; re-extract the "
                "features (boxes are x1, y1, x2, y2, w, h)"
            )
    fits = boxes_fit(boxes)
    if not fits.all():
        row = int(np.argmin(fits))
        raise FeatureError(
            f"image {image_id!r} in {where}: box {row} {_box(boxes[row])} reaches outside the image: "
            f"x1, y1, x2, y2, w and h over the image's size must lie in [0, 1] (within {BOX_TOLERANCE:g}); "
            "re-extract the features, or check the image size"
        )
    if (boxes < 0).any() or (boxes > 1).any():
        return np.clip(boxes, 0.0, 1.0)
    return boxes


def _box(box: np.ndarray) -> str:
    return "(" + ", ".join(f"{value:.6g}" for value in box.tolist()) + ")"


def content_identity(kind: str, ids: list[str], get: Callable[[str], np.ndarray]) -> str:
    """``<kind>-<12 hex>``: a SHA-256 of every id in order and of the validated features (as ``get``
    returns them) of `IDENTITY_SAMPLE` ids spread evenly over them, an unreadable one as a marker. Cheap
    (a few images read) and blind to a change in an image outside the sample that keeps its id."""
    digest = hashlib.sha256(kind.encode())
    for image_id in ids:
        digest.update(image_id.encode("utf-8", "surrogateescape") + b"\0")
    picks = sorted({round(i * (len(ids) - 1) / (IDENTITY_SAMPLE - 1)) for i in range(IDENTITY_SAMPLE)})
    for pick in picks if ids else []:
        try:
            digest.update(get(ids[pick]).tobytes())
        except FeatureError:
            digest.update(b"unreadable\0")
    return f"{kind}-{digest.hexdigest()[:12]}"


def store_identity(store: Any) -> str:
    """The ``identity`` of a feature store (`FeatureStore`); `ConfigError` when it states none."""
    identity = getattr(store, "identity", None)
    if not isinstance(identity, str) or not identity:
        raise ConfigError(
            f"feature store {type(store).__name__} has no 'identity' (a string naming its features, which "
            "score signatures carry); give it one, e.g. qace.data.features.content_identity(...)"
        )
    return identity


def extraction_errors_path(store: str | Path) -> Path:
    """Where `qace features extract` lists the images it could not store in ``store``, with the reason."""
    store = Path(store)
    return store.with_name(store.stem + ".errors.jsonl")


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
    """The release layout: one ``<directory>/<image_id>.npz`` per image, the files listed when it opens.

    Ids are matched by `qace.data.image_ids` against the file stems (so ``391895`` finds
    ``COCO_val2014_000000391895.npz``); an id never reaches a file outside the directory.
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise ConfigError(f"feature directory {str(self.directory)!r} does not exist")
        self.signature = f"npz-dir:{self.directory}"
        stems = sorted(p.stem for p in self.directory.glob("*.npz") if p.stem)
        self._ids = IdIndex(stems, self.signature)
        self.identity = content_identity("npz", stems, self.get)

    def __contains__(self, image_id: object) -> bool:
        return self._ids.find(image_id) is not None

    def ids(self) -> list[str]:
        """File stems of every ``.npz`` in the directory, sorted (a stable packing order)."""
        return list(self._ids.stored)

    def get(self, image_id: str) -> np.ndarray:
        path = self.directory / f"{self._ids.key(image_id)}.npz"
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

    Ids are matched by `qace.data.image_ids`. A store `qace features extract` wrote records the
    detector (attribute ``detector``: its weight hash and settings, `qace.features.extract`), which is
    then its ``identity``; an image its extraction could not store is reported with the reason listed
    beside it (`extraction_errors_path`). Any other store's identity is its `content_identity`.
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
        self._raw = direct_chunks(self._features, REGION_SHAPE)
        """Whether a row's chunk can be read raw and decoded outside h5py (`get_many`)."""
        self.signature = f"hdf5:{self.path.name}:{len(self._index)} images:{self.dtype.name}"
        self._ids = IdIndex(self._index, self.signature)
        self._failed: tuple[IdIndex, dict[str, str]] | None = None
        detector = self._file.attrs.get("detector")
        if detector is not None:
            stated = hashlib.sha256(f"{detector}\0{self.dtype.name}".encode()).hexdigest()[:12]
            self.identity = f"det-{stated}"
        else:
            self.identity = content_identity(f"h5.{self.dtype.name}", self.ids(), self.get)

    def __contains__(self, image_id: object) -> bool:
        return self._ids.find(image_id) is not None

    def __len__(self) -> int:
        return len(self._index)

    def ids(self) -> list[str]:
        """Image ids in file order."""
        return list(self._index)

    def get(self, image_id: str) -> np.ndarray:
        key = self._ids.find(image_id)
        if key is None:
            raise self._missing(image_id)
        row = self._index[key]
        try:
            stored = self._features[row]
        except OSError as exc:  # e.g. a damaged chunk: "filter returned failure during read"
            raise self._damaged(image_id, row, exc) from exc
        return validate(image_id, stored, self.signature)

    def get_many(self, image_ids: Sequence[str], pool: Executor) -> list[np.ndarray | FeatureError]:
        """`get` of each id, in order, with the `FeatureError` that `get` would raise in its place.

        In `pack_features`' layout each row's chunk is read raw, one after another (h5py runs one call
        at a time, and a raw read costs a few microseconds), and inflated, unshuffled and validated in
        ``pool``'s threads as soon as it is read: zlib and numpy let them run at once, where `get` spends
        about a millisecond an image inflating under h5py's lock. Other layouts are read by `get`."""
        if not self._raw:
            return [_or_error(self.get, image_id) for image_id in image_ids]
        staged = [pool.submit(self._decode, image_id, self._raw_chunk(image_id)) for image_id in image_ids]
        return [future.result() for future in staged]

    def _raw_chunk(self, image_id: str) -> tuple[int, int, bytes] | np.ndarray | FeatureError:
        """``(row, filter mask, compressed bytes)`` of an image; or, where its chunk cannot be read raw,
        what `get` gives (its array or its error)."""
        key = self._ids.find(image_id)
        if key is None:
            return self._missing(image_id)
        row = self._index[key]
        try:
            mask, raw = self._features.id.read_direct_chunk((row, 0, 0))
        except Exception:  # noqa: BLE001 - h5py's own read names what is wrong with the row
            return _or_error(self.get, image_id)
        return row, mask, raw

    def _decode(
        self, image_id: str, chunk: tuple[int, int, bytes] | np.ndarray | FeatureError
    ) -> np.ndarray | FeatureError:
        if not isinstance(chunk, tuple):
            return chunk
        row, mask, raw = chunk
        try:
            return validate(
                image_id, inflated_unshuffled(raw, mask, self.dtype, REGION_SHAPE), self.signature
            )
        except FeatureError as exc:
            return exc
        except (zlib.error, ValueError) as exc:
            return self._damaged(image_id, row, exc)

    def _damaged(self, image_id: str, row: int, exc: Exception) -> FeatureError:
        return FeatureError(
            f"image {image_id!r} in {self.signature}: row {row} cannot be read ({exc}); the file is "
            "damaged: pack it again from the source features"
        )

    def _missing(self, image_id: str) -> FeatureError:
        """The error of an id the store lacks, with the extraction's reason when one is listed."""
        if self._failed is None:  # read at the first miss
            failures = _extraction_failures(self.path) if "detector" in self._file.attrs else {}
            self._failed = (IdIndex(failures, str(self.path)), failures)
        index, failures = self._failed
        key = index.find(image_id)
        if key is None:
            return self._ids.missing(image_id)
        return FeatureError(
            f"image {image_id!r} has no region features in {self.signature}: its extraction failed "
            f"({failures[key]}; listed in {extraction_errors_path(self.path)})"
        )

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> HDF5Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _or_error(get: Callable[[str], np.ndarray], image_id: str) -> np.ndarray | FeatureError:
    """``get(image_id)``, or the `FeatureError` it raises."""
    try:
        return get(image_id)
    except FeatureError as exc:
        return exc


class RandomFeatureStore:
    """Deterministic random features per image id (a hash of seed and id), for benchmarks and demos.

    Every id is "contained" and `ids()` is empty (the domain is unbounded). Values look like the
    real thing: non-negative pooled features and well-formed normalized boxes.
    """

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.signature = f"random:seed={seed}"
        self.identity = f"random:{seed}"

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


def _extraction_failures(store: Path) -> dict[str, str]:
    """Image id -> why its extraction failed, from the list beside an extracted store (empty if none)."""
    failures: dict[str, str] = {}
    try:
        with extraction_errors_path(store).open(encoding="utf-8") as f:
            for line in f:
                try:
                    entry = json.loads(line)
                    failures[str(entry["image_id"])] = str(entry["reason"])
                except (ValueError, KeyError, TypeError):
                    continue
    except OSError:
        return {}
    return failures
