"""``qace features extract``: raw images -> 36 regions per image in qace's HDF5 store.

Images come from a folder (its image files, recursively, in sorted order), a list file (one path a
line, relative paths against the list's folder) or a records file (``.jsonl``/``.csv``/``.json``:
each record's ``image`` field). An image's id in the store is the record's ``image_id`` when it has
one, else its file stem (`image_key`), which is what QACE-Img looks up (`qace.features.formats`
matches ids such as ``COCO_val2014_000000391895`` and ``391895`` to each other).

The work is a pipeline: CPU workers decode and resize images ahead of the GPU (a ``DataLoader`` with
prefetch), an upload thread takes their batches and queues each on the device (`_Prefetch`, up to two
ahead), the detector runs on whole batches in the calling thread, and a writer thread appends results
to the store, so decoding, receiving and uploading, detection and writing overlap. The store is the
same layout `qace.data.features.HDF5Store` reads, written in place and resumable: a rerun skips the
ids already there. The store records the detector (`detector_identity`: its weights' hash, settings and
precision; a store of another detector is refused) and its source. Images that cannot be used
(unreadable, too small, fewer than 36 regions) are listed with the reason in ``<store>.errors.jsonl``
(rewritten each run; `HDF5Store` reports a record of such an image with that reason) and nothing else
is lost; CMYK, grey, palette and alpha images are converted to RGB.
"""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np

from qace.data.features import HDF5_LAYOUT, REGION_SHAPE, extraction_errors_path, validate
from qace.data.hdf5_chunks import direct_chunks, shuffled_deflate
from qace.errors import ConfigError, FeatureError, InputError
from qace.precision import torch_dtype
from qace.progress import track

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")
RECORD_SUFFIXES = (".jsonl", ".ndjson", ".csv", ".tsv", ".json")


@dataclass(frozen=True)
class ImageItem:
    """One image to extract: its id in the store and its file."""

    key: str
    path: str


@dataclass(frozen=True)
class ExtractSummary:
    extracted: int
    skipped: int
    errors: int
    seconds: float
    errors_path: Path
    batches: int = 0
    """Batches that reached the detector."""
    input_wait_s: float = 0.0
    """Seconds the detector's thread waited for its next uploaded batch, the first batch's wait (the
    loader's start) not counted: near zero when the detector is the slowest part."""
    start_s: float = 0.0
    """Seconds from the call to the first batch's arrival at the detector (opening the store, starting
    the loader's processes, decoding the first batch); ``seconds`` less this is the steady part."""

    def line(self) -> str:
        rate = self.extracted / self.seconds if self.seconds > 0 else 0.0
        return (
            f"extracted {self.extracted} images ({rate:.1f}/s), {self.skipped} already in the store, "
            f"{self.errors} could not be used" + (f" (see {self.errors_path})" if self.errors else "")
        )


def image_key(image_id: str | None, path: str) -> str:
    """The store id of an image: its record's ``image_id`` if given, else its file stem."""
    return image_id if image_id else Path(path).stem


def gather_images(source: str | Path, *, records: bool = False, fmt: str = "auto") -> list[ImageItem]:
    """The images named by a folder, a list file or a records file (see the module docstring); with
    ``records`` the file is read as records whatever its extension, in format ``fmt``."""
    source = Path(source)
    if source.is_dir():
        paths = sorted(p for p in source.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        items = [ImageItem(p.stem, str(p)) for p in paths]
    elif not source.is_file():
        raise InputError(f"{str(source)!r} is neither a folder of images nor a list or records file")
    elif records or source.suffix.lower() in RECORD_SUFFIXES:
        from qace.data.records import Record, read_records

        items = [
            ImageItem(image_key(r.image_id, r.image), r.image)
            for r in read_records(source, fmt=fmt)
            if isinstance(r, Record) and r.image
        ]
    else:
        lines = source.read_text(encoding="utf-8").splitlines()
        items = [
            ImageItem(Path(line.strip()).stem, str(source.parent / Path(line.strip()).expanduser()))
            for line in lines
            if line.strip() and not line.lstrip().startswith("#")
        ]
    unique: dict[str, ImageItem] = {}
    for item in items:
        other = unique.setdefault(item.key, item)
        if other.path != item.path:
            raise InputError(
                f"image id {item.key!r} names two files, {other.path!r} and {item.path!r}; "
                "give them distinct image_id values (or file names)"
            )
    return list(unique.values())


class RegionWriter:
    """Appends (id, (36, 2054)) rows to a qace HDF5 store, creating or resuming it.

    ``detector`` (the detector's identity, `detector_identity`) is kept in the file, and ``source`` (where
    it was loaded from) beside it; resuming with another identity is an error, since one store must not
    mix two detectors' features.
    """

    def __init__(self, path: str | Path, detector: str, dtype: Any = np.float16, source: str = "") -> None:
        import h5py

        self.path = Path(path)
        self.dtype = np.dtype(dtype)
        self._file = h5py.File(self.path, "a")
        f = self._file
        if "features" not in f:
            f.create_dataset(
                "features",
                shape=(0, *REGION_SHAPE),
                maxshape=(None, *REGION_SHAPE),
                dtype=self.dtype,
                chunks=(1, *REGION_SHAPE),
                compression="gzip",
                compression_opts=1,
                shuffle=True,
            )
            f.create_dataset("ids", shape=(0,), maxshape=(None,), dtype=h5py.string_dtype("utf-8"))
            f.attrs["layout"], f.attrs["detector"], f.attrs["detector_source"] = HDF5_LAYOUT, detector, source
        elif (stored := f.attrs.get("detector")) != detector:
            self._file.close()
            raise ConfigError(
                f"{str(self.path)!r} holds features of {stored!r}, not {detector!r}; "
                "write to another file or extract with the same detector settings"
            )
        rows = min(len(f["ids"]), len(f["features"]))  # a run killed between the two writes
        f["ids"].resize(rows, axis=0)
        f["features"].resize(rows, axis=0)
        self.ids: set[str] = set(f["ids"].asstr()[:])
        features = f["features"]
        self._direct = (
            direct_chunks(features, REGION_SHAPE)
            and features.compression_opts == 1
            and features.dtype == self.dtype
        )
        """The dataset is the layout `__init__` creates, so `add` can write its chunks ready-made."""
        self._pool = ThreadPoolExecutor(max_workers=COMPRESS_THREADS, thread_name_prefix="qace-compress")

    def add(self, images: Sequence[tuple[str, np.ndarray]]) -> list[dict[str, str]]:
        """Append the (id, regions) ``images`` that pass `validate` and fit the store's dtype, in one write
        (one resize per dataset: per image, h5py's calls would each wait for the interpreter lock behind
        the thread driving the detector), each image's chunk compressed beforehand in `COMPRESS_THREADS`
        threads (`shuffled_deflate`); returns the errors of the others."""
        keys: list[str] = []
        rows: list[np.ndarray] = []
        errors: list[dict[str, str]] = []
        for key, regions in images:
            try:
                with np.errstate(over="ignore"):  # an overflow is reported just below
                    stored = validate(key, regions, "the detector's output").astype(self.dtype)
                if not np.isfinite(stored).all():
                    raise FeatureError(f"image {key!r}: region features overflow {self.dtype.name}")
            except FeatureError as exc:
                errors.append({"image_id": key, "reason": exc.reason})
                continue
            keys.append(key)
            rows.append(stored)
        if keys:
            row, f = len(self.ids), self._file
            f["features"].resize(row + len(keys), axis=0)
            if self._direct:
                for i, chunk in enumerate(self._pool.map(shuffled_deflate, rows)):
                    f["features"].id.write_direct_chunk((row + i, 0, 0), chunk)
            else:
                f["features"][row:] = np.stack(rows)
            f["ids"].resize(row + len(keys), axis=0)
            f["ids"][row:] = keys
            self.ids.update(keys)
        return errors

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._pool.shutdown()
        self._file.close()


COMPRESS_THREADS = 4
"""Threads `RegionWriter` compresses an image's chunk in: zlib runs without the interpreter lock."""


class _Decoded:
    """What a decode worker hands over: the resized image, or why there is none."""

    def __init__(self, item: ImageItem, config: Any) -> None:
        import torch
        from PIL import Image

        from qace.features.detector import ImageError, resize_for_detector

        self.item = item
        self.pixels: Any = None  # a uint8 tensor: DataLoader workers hand tensors over in shared memory
        self.size = (0, 0)
        self.error: str | None = None
        try:
            with Image.open(item.path) as image:
                image.load()
                pixels, width, height = resize_for_detector(image, config)
                self.pixels, self.size = torch.from_numpy(pixels), (width, height)
        except ImageError as exc:
            self.error = str(exc)
        except Exception as exc:  # noqa: BLE001 (PIL raises many types for a bad file: report them all)
            self.error = f"unreadable image ({type(exc).__name__}: {exc})"


class _Images:
    """A map-style dataset decoding one image per index (runs in the DataLoader's workers)."""

    def __init__(self, items: list[ImageItem], config: Any) -> None:
        self.items, self.config = items, config

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> _Decoded:
        return _Decoded(self.items[index], self.config)


def decode_batches(
    items: list[ImageItem], config: Any, batch_size: int, workers: int
) -> Iterable[list[_Decoded]]:
    """The pipeline's loader: ``items`` decoded and resized for ``config`` in ``workers`` processes (0: in
    this one), ``batch_size`` at a time, in order, with prefetch."""
    from torch.utils.data import DataLoader

    return DataLoader(
        _Images(items, config),  # type: ignore[arg-type]
        batch_size=batch_size,
        num_workers=workers,
        collate_fn=list,
        prefetch_factor=4 if workers else None,
        persistent_workers=False,
    )


T = TypeVar("T")
U = TypeVar("U")


class _Prefetch(Generic[U]):
    """``prepare`` applied to each item of ``source`` in a thread of its own (inside ``context``), up to
    ``depth`` results ahead of the iterating thread, which gets them in order. An exception in the thread
    (from ``source`` or ``prepare``) is raised to the iterating thread once the results before it are
    taken; `close` (always call it) stops the thread after the item in hand and waits for it.
    ``waited`` lists the seconds the iterating thread waited for each entry it took (the end's included)."""

    def __init__(
        self,
        source: Iterable[T],
        prepare: Callable[[T], U],
        *,
        depth: int = 2,
        context: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> None:
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self.waited: list[float] = []
        self.first_at: float | None = None
        """``time.perf_counter()`` when the iterating thread got its first entry."""
        self._thread = threading.Thread(
            target=self._run, args=(source, prepare, context), name="qace-feature-upload", daemon=True
        )
        self._thread.start()

    def _run(
        self,
        source: Iterable[T],
        prepare: Callable[[T], U],
        context: Callable[[], AbstractContextManager[Any]],
    ) -> None:
        try:
            with context():
                for item in source:
                    if not self._put(("item", prepare(item))):
                        return
        except BaseException as exc:  # noqa: BLE001 (handed to the iterating thread, which raises it)
            self._put(("error", exc))
            return
        self._put(("end", None))

    def _put(self, entry: tuple[str, Any]) -> bool:
        """Queue ``entry`` unless `close` was called first (then False)."""
        while not self._stop.is_set():
            try:
                self._queue.put(entry, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Iterator[U]:
        while True:
            start = time.perf_counter()
            kind, value = self._queue.get()
            now = time.perf_counter()
            self.waited.append(now - start)
            if self.first_at is None:
                self.first_at = now
            if kind == "error":
                raise value
            if kind == "end":
                return
            yield value

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def _same_stream(detector: Any) -> Callable[[], AbstractContextManager[Any]]:
    """A context for the upload thread: on a GPU, the calling thread's current stream (the default one
    unless the caller set another), so that each batch's upload is queued before the detector's work on
    it in one stream and needs no other synchronisation; elsewhere nothing."""
    import torch

    device = next(detector.parameters()).device
    if device.type != "cuda":
        return nullcontext
    stream = torch.cuda.current_stream(device)
    return lambda: torch.cuda.stream(stream)


def extract_features(
    images: Iterable[ImageItem],
    out_path: str | Path,
    detector: Any,
    *,
    detector_name: str,
    precision: str = "fp32",
    batch_size: int = 8,
    workers: int = 0,
    progress: bool = True,
) -> ExtractSummary:
    """Extract the images not yet in ``out_path`` into it; see the module docstring."""

    dtype = torch_dtype(precision, what="detector precision")
    if batch_size < 1 or workers < 0:
        raise ConfigError(f"batch size must be at least 1 and workers at least 0 ({batch_size}, {workers})")
    out_path = Path(out_path)
    errors_path = extraction_errors_path(out_path)
    writer = RegionWriter(out_path, detector_identity(detector, precision), source=detector_name)
    items = list(images)
    todo = [item for item in items if item.key not in writer.ids]
    errors: list[dict[str, str]] = []
    pending: queue.Queue[list[tuple[str, np.ndarray]] | None] = queue.Queue(maxsize=8)
    written = 0

    def write() -> None:
        nonlocal written
        while (batch := pending.get()) is not None:
            failed = writer.add(batch)
            errors.extend(failed)
            written += len(batch) - len(failed)
        writer.flush()

    def upload(batch: list[_Decoded]) -> tuple[list[_Decoded], list[_Decoded], Any]:
        """In the upload thread: the batch, its usable images and their upload (None if there are none)."""
        usable = [d for d in batch if d.pixels is not None]
        return batch, usable, detector.upload([d.pixels for d in usable]) if usable else None

    start = time.perf_counter()
    thread = threading.Thread(target=write, name="qace-feature-writer", daemon=True)
    thread.start()
    bar = track("extracting features", total=len(todo), unit="image", enabled=progress)
    ahead: _Prefetch[tuple[list[_Decoded], list[_Decoded], Any]] | None = None
    try:
        # the loader's iterator is made in this thread, so its worker processes start from here as before;
        # the upload thread then holds the only reference, and shuts the workers down when it ends
        loader = iter(decode_batches(todo, detector.config, batch_size, workers))
        ahead = _Prefetch(loader, upload, depth=2, context=_same_stream(detector))
        del loader
        for batch, usable, uploaded in ahead:
            errors.extend(
                {"image_id": d.item.key, "path": d.item.path, "reason": d.error or ""}
                for d in batch
                if d.pixels is None
            )
            if uploaded is not None:
                found = detector.detect_uploaded(
                    *uploaded, [d.pixels for d in usable], [d.size for d in usable], dtype=dtype
                )
                regions = []
                for decoded, result in zip(usable, found, strict=True):
                    if isinstance(result, str):
                        errors.append(
                            {"image_id": decoded.item.key, "path": decoded.item.path, "reason": result}
                        )
                    else:
                        regions.append((decoded.item.key, result.regions()))
                pending.put(regions)
            bar.update(len(batch))
    finally:
        if ahead is not None:
            ahead.close()
        pending.put(None)
        thread.join()
        bar.close()
        writer.close()
    with errors_path.open("w", encoding="utf-8") as f:
        for entry in errors:
            f.write(json.dumps(entry) + "\n")
    waited = ahead.waited  # the first: the loader's start; the last: for the end of the input
    first = ahead.first_at - start if ahead.first_at is not None else 0.0
    return ExtractSummary(
        written,
        len(items) - len(todo),
        len(errors),
        time.perf_counter() - start,
        errors_path,
        batches=len(waited) - 1,
        input_wait_s=sum(waited[1:-1]),
        start_s=first,
    )


def detector_identity(detector: Any, precision: str) -> str:
    """What a store records as its detector: a SHA-256 of the weights (every tensor of the state dict, by
    name, dtype and shape), one of the settings (`qace.features.detector.DetectorConfig`) and the
    precision. Where the weights were loaded from is not part of it."""
    import torch

    weights = hashlib.sha256()
    for name, tensor in sorted(detector.state_dict().items()):
        weights.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}\0".encode())
        weights.update(tensor.detach().reshape(-1).cpu().contiguous().view(torch.uint8).numpy().tobytes())
    settings = hashlib.sha256(json.dumps(asdict(detector.config), sort_keys=True).encode())
    return (
        f"weights:sha256-{weights.hexdigest()[:12]}|settings:sha256-{settings.hexdigest()[:12]}"
        f"|precision:{precision}"
    )


def load_detector(source: str, device: str) -> Any:
    """The detector from a hub id or directory, placed on ``device`` (`BottomUpDetector.placed`)."""
    from qace.features.detector import BottomUpDetector

    return BottomUpDetector.from_pretrained(source).placed(device)


def default_precision(device: str) -> str:
    """bf16 on a GPU (the backbone's convolutions; boxes and NMS stay fp32), fp32 elsewhere."""
    return "bf16" if device.startswith("cuda") else "fp32"
