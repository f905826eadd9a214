"""Builders of damaged feature files, as disks and copies damage them: a flipped chunk, a cut-off or
bad-CRC archive, a damaged compressed stream, a file that is no archive at all."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from qace.data.features import RandomFeatureStore, pack_features


def features(image_id: str) -> dict[str, np.ndarray]:
    """The release's two arrays for ``image_id`` (fp16, deterministic)."""
    region = RandomFeatureStore(0).get(image_id).astype(np.float16)
    return {"features": region[:, :2048], "norm_bb": region[:, 2048:]}


def flip_bytes(path: Path, start: int, count: int = 64) -> None:
    """Invert ``count`` bytes of ``path`` from ``start`` on."""
    data = bytearray(path.read_bytes())
    data[start : start + count] = bytes(b ^ 0xFF for b in data[start : start + count])
    path.write_bytes(bytes(data))


def hdf5_with_damaged_row(path: Path, image_ids: list[str], damaged: str) -> Path:
    """A packed store of ``image_ids`` whose chunk of ``damaged`` no longer decompresses."""
    store = RandomFeatureStore(0)
    pack_features(((i, store.get(i)) for i in image_ids), path, progress=False)
    with h5py.File(path) as f:
        chunk = f["features"].id.get_chunk_info(image_ids.index(damaged))
    flip_bytes(path, chunk.byte_offset + chunk.size // 2)
    return path


def truncated_npz(path: Path, image_id: str) -> Path:
    """An archive cut off halfway, as an interrupted copy leaves it (``zipfile.BadZipFile``)."""
    np.savez(path, **features(image_id))
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path


def bad_crc_npz(path: Path, image_id: str) -> Path:
    """An uncompressed archive with one damaged byte inside an array (a CRC mismatch)."""
    np.savez(path, **features(image_id))
    flip_bytes(path, 1000, 1)
    return path


def damaged_compressed_npz(path: Path, image_id: str) -> Path:
    """A compressed archive whose deflate stream is damaged (``zlib.error``)."""
    np.savez_compressed(path, **features(image_id))
    flip_bytes(path, 200)
    return path
