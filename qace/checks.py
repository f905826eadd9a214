"""Checks of command-line arguments that run before any model loads, so a wrong flag or path answers
at once with a clear message instead of a traceback after the models have loaded. Nothing heavy is
imported here (torch only where a CUDA device is asked for on a host that may have one)."""

from __future__ import annotations

import math
import os
import re
import sys
import tempfile
from pathlib import Path

from qace.errors import BackendUnavailableError, ConfigError

CUDA_DRIVER_PATHS = ("/dev/nvidiactl", "/proc/driver/nvidia", "/dev/kfd")
"""On Linux, a CUDA (or ROCm) device needs one of these; without any, no GPU is visible to torch."""


def check_device(device: str) -> None:
    """``cpu``, or ``cuda`` / ``cuda:N`` with that GPU visible; else a `ConfigError` (no such device
    kind) or `BackendUnavailableError` (no such GPU here) that says what to pass instead."""
    match = re.fullmatch(r"(cpu|cuda)(?::(\d+))?", device.strip())
    if match is None:
        raise ConfigError(f"--device {device!r} is not a device qace runs on: use cpu, cuda or cuda:N")
    kind, index = match.group(1), int(match.group(2) or 0)
    if kind == "cpu":
        return
    visible = _cuda_devices()
    if visible == 0:
        raise BackendUnavailableError(f"--device {device}: no CUDA GPU is visible here; use --device cpu")
    if index >= visible:
        raise BackendUnavailableError(
            f"--device {device}: only {visible} CUDA GPU(s) are visible (cuda:0 to cuda:{visible - 1})"
        )


def check_invalid_reward(value: float) -> float:
    """``value`` as a float, the reward of a caption that cannot be scored; `ConfigError` unless finite
    (a NaN reward poisons a policy's update, and JSON cannot carry one)."""
    value = float(value)
    if not math.isfinite(value):
        raise ConfigError(f"invalid_reward (--invalid-reward) is {value}: give a finite number (default 0.0)")
    return value


def _cuda_devices() -> int:
    """CUDA devices torch can use; on Linux without a GPU driver, 0 without importing torch."""
    if sys.platform == "linux" and "torch" not in sys.modules:
        if not any(os.path.exists(path) for path in CUDA_DRIVER_PATHS):
            return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_output_file(path: str | Path) -> None:
    """`ConfigError` unless ``path`` can become a file: not a folder, and its nearest existing parent
    is a folder this process may write in (missing folders below it are created by the writer), as a
    folder made there and removed at once shows."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise ConfigError(
            f"output {str(path)!r} is a folder; give a file in it, e.g. {str(path / 'scores.jsonl')!r}"
        )
    parent = next(p for p in (path.parent, *path.parent.parents) if p.exists() or p == p.parent)
    if not parent.is_dir():
        raise ConfigError(f"cannot write output {str(path)!r}: {str(parent)!r} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"cannot write output {str(path)!r}: no permission to write in {str(parent)!r}")
    try:  # what permissions do not tell: a file system that takes no new entries (/proc, read-only mounts)
        os.rmdir(tempfile.mkdtemp(prefix=".qace-write-check-", dir=parent))
    except OSError as exc:
        raise ConfigError(
            f"cannot write output {str(path)!r}: {str(parent)!r} takes no new files or folders "
            f"({exc.strerror or exc}); write the output elsewhere"
        ) from None


def check_exists(flag: str, path: str | Path | None) -> None:
    """`ConfigError` when ``flag`` names a ``path`` that does not exist (``None``: not given)."""
    if path is not None and not Path(path).expanduser().exists():
        raise ConfigError(f"{flag} {str(path)!r} does not exist")


def check_img_features(variant: str, features: str | None) -> None:
    """QACE-Img reads region features: `ConfigError` when ``variant`` is ``img`` and none are given."""
    if variant == "img" and not features:
        raise ConfigError(
            "QACE-Img (--variant img / --metric qace-img) needs region features: pass --features with a "
            "directory of per-image .npz files or an .h5 store (`qace features pack` makes one)"
        )
