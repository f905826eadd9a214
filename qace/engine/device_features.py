"""Region features of hot images kept on the model's device, so an image is uploaded once, not per chunk.

QACE-Img reads 36 x 2054 floats per image. A data set has about five captions per image spread over
chunks, and an RL reward scores new captions of the same images at every step; uploading each image's
features once and gathering batch rows from a device-resident slab turns those repeats into no copies.
The slab is an LRU over images: it grows (doubling) up to ``capacity`` images, and evicts the least
recently used images that the current request does not need.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Sequence

import numpy as np
import torch

from qace.engine.pinned_upload import stack_to_device, to_device

NUM_REGIONS, REGION_DIM = 36, 2054


class DeviceFeatureCache:
    """An LRU of image features on ``device`` in ``dtype``; see the module docstring."""

    def __init__(self, device: torch.device, dtype: torch.dtype, capacity: int = 8192) -> None:
        self.device, self.dtype, self.capacity = device, dtype, capacity
        self._slab = torch.empty((0, NUM_REGIONS, REGION_DIM), device=device, dtype=dtype)
        self._slots: OrderedDict[str, int] = OrderedDict()
        self._unused: list[int] = []  # a min-heap of the slab's slots that hold no image
        self.uploads = 0
        """Images uploaded so far (each resident image once)."""

    def rows(
        self, image_ids: Sequence[str], load: Callable[[str], np.ndarray]
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(slab, slots)`` with ``slab[slots[i]]`` the features of ``image_ids[i]`` (distinct ids).

        Images not resident are read with ``load`` and uploaded in one copy. None when the request holds
        more images than the cache can: the caller then uploads that chunk's features itself.
        """
        if len(image_ids) > self.capacity:
            return None
        for image_id in image_ids:  # requested images become the most recent: they are not evicted
            if image_id in self._slots:
                self._slots.move_to_end(image_id)
        missing = [image_id for image_id in image_ids if image_id not in self._slots]
        if missing:
            uploaded = stack_to_device([load(image_id) for image_id in missing], self.device)
            free = self._free_slots(len(missing))  # after the loads: one that raises takes no slot
            index = to_device(np.asarray(free, dtype=np.int64), self.device)
            self._slab.index_copy_(0, index, uploaded.to(self.dtype))
            self._slots.update(zip(missing, free, strict=True))
            self.uploads += len(missing)
        slots = to_device(np.array([self._slots[i] for i in image_ids], dtype=np.int64), self.device)
        return self._slab, slots

    def discard(self, image_ids: Sequence[str]) -> None:
        """Forget ``image_ids`` (those resident); their slots take the next images loaded."""
        for image_id in image_ids:
            slot = self._slots.pop(image_id, None)
            if slot is not None:
                heapq.heappush(self._unused, slot)

    def _free_slots(self, needed: int) -> list[int]:
        """``needed`` slots: unused ones first, lowest first (growing the slab), then the least recently
        used images'. O(needed log slots): the unused slots are kept in a heap, not searched for."""
        used, old = len(self._slots), len(self._slab)
        if used + needed > old and old < self.capacity:
            size = min(self.capacity, max(used + needed, 2 * old))
            grown = torch.empty((size, NUM_REGIONS, REGION_DIM), device=self.device, dtype=self.dtype)
            grown[:old] = self._slab
            self._slab = grown
            self._unused.extend(range(old, size))  # each larger than every slot there: still a heap
        unused = [heapq.heappop(self._unused) for _ in range(min(needed, len(self._unused)))]
        evicted = [self._slots.popitem(last=False)[1] for _ in range(needed - len(unused))]
        return unused + evicted
