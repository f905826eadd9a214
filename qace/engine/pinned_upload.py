"""Small host arrays to the device without stopping the host.

A copy from ordinary (pageable) host memory to a GPU that is not asynchronous
(``torch.tensor(..., device="cuda")``, ``torch.as_tensor(array, device="cuda")``, ``.to("cuda")``) waits
until the GPU has run everything queued before it. The engine uploads indices, masks and forced lengths
between kernels, and each such wait stopped the host from queueing ahead. Through pinned memory the copy is
queued like a kernel instead; PyTorch's caching host allocator keeps
the pinned block until the copy has run.
"""

from __future__ import annotations

import numpy as np
import torch


def to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """``array`` as a tensor on ``device``, queued after the device's work instead of waiting for it."""
    host = torch.from_numpy(np.ascontiguousarray(array))
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
