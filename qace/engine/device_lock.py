"""One lock per device, held while a thread runs model work there.

The decoders replay CUDA graphs from static buffers, a graph capture fails if another thread launches
work on the device meanwhile, and hot region features share one slab. So every model and the BERTScore
encoder on the same device, of every scorer in the process, take turns under this lock: callers in
several threads (a reward service beside an evaluation, say) run their model stages one at a time while
their host work (tokenising, decoding, comparing) overlaps.
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager, nullcontext

import torch

_LOCKS: dict[str, threading.RLock] = {}
_GUARD = threading.Lock()


def bound_device(device: str | torch.device) -> torch.device:
    """``device`` with its index: ``cuda`` is the CUDA device current now. A model keeps the device it
    was built on, whichever device is current in the thread that later runs it (a new thread starts on
    device 0, whatever `torch.cuda.set_device` chose where the model was built)."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0)
    return dev


def current(device: torch.device) -> AbstractContextManager[object]:
    """A context in which ``device`` is CUDA's current device (nothing for the CPU): kernels launched on
    the current device (Triton's) then run where the model's weights are, whichever thread runs it."""
    return torch.cuda.device(device) if device.type == "cuda" else nullcontext()


def device_lock(device: str | torch.device) -> threading.RLock:
    """The process-wide lock of ``device`` (``cuda`` means the current CUDA device; re-entrant)."""
    with _GUARD:
        return _LOCKS.setdefault(str(bound_device(device)), threading.RLock())
