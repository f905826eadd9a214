"""HDF5 chunks of qace's feature layout, written and read outside h5py.

A packed store (`qace.data.features.pack_features`, `qace features extract`) keeps one image a chunk
through HDF5's shuffle and deflate filters. h5py runs those filters one call at a time (under its own
lock; compressing, under the interpreter's too), about a millisecond an image to inflate and several to
deflate; zlib and numpy run in several threads at once. So the writer compresses chunks in threads and
writes them ready-made (`write_direct_chunk`), and the reader reads them raw (`read_direct_chunk`) and
decodes them in threads: the same bytes and arrays as h5py's filters.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np


def direct_chunks(data: Any, shape: tuple[int, ...]) -> bool:
    """Whether an HDF5 dataset keeps one item of ``shape`` a chunk through exactly HDF5's shuffle and
    deflate filters, in that order (the layout `pack_features` and `qace features extract` write), so
    that its chunks can be written and read ready-made outside h5py (`shuffled_deflate`,
    `inflated_unshuffled`)."""
    import h5py

    if data.chunks != (1, *shape):
        return False
    plist = data.id.get_create_plist()
    codes = [plist.get_filter(i)[0] for i in range(plist.get_nfilters())]
    return codes == [h5py.h5z.FILTER_SHUFFLE, h5py.h5z.FILTER_DEFLATE]


def shuffled_deflate(regions: np.ndarray) -> bytes:
    """One image's chunk as HDF5's shuffle and deflate (level 1) filters store it: the bytes
    of every element regrouped by position (all first bytes, then all second bytes, ...), then a zlib
    stream. HDF5 writes the same through h5py, but compresses holding the interpreter lock (4.5-5.7 ms
    an image on the H100 host); zlib releases it."""
    grouped = np.ascontiguousarray(regions).view(np.uint8).reshape(-1, regions.dtype.itemsize).T
    return zlib.compress(np.ascontiguousarray(grouped).data, 1)


def inflated_unshuffled(raw: bytes, mask: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """A `direct_chunks` chunk as its array of ``shape``: inflated, then its bytes put back in element
    order, each step skipped where the writer skipped its filter (``mask``'s bit 1: deflate, bit 0:
    shuffle), as HDF5 reads it through h5py."""
    data = raw if mask & 2 else zlib.decompress(raw)
    flat = np.frombuffer(data, dtype=np.uint8)
    if mask & 1:
        return flat.view(dtype).reshape(shape).copy()  # writable, as h5py's arrays are
    width, n = dtype.itemsize, len(flat) // dtype.itemsize
    out = np.empty((n, width), dtype=np.uint8)
    for k in range(width):  # a strided copy a byte lane: a fifth of a transposed copy's time
        out[:, k] = flat[k * n : (k + 1) * n]
    return out.view(dtype).reshape(shape)
