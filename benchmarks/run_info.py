"""Run metadata that every benchmark record carries: the command, the commit, the GPU and CPU, and the
library versions. Every benchmark opens its JSON record with `record` (no benchmark builds these fields
itself; ``tests/benchmarks/test_run_info.py`` checks that).

Contract:

- ``record(module, argv, device=..., packages=...)`` gives ``{"command", "commit", "dirty", "gpu",
  "cpu", "versions"}``: the command that reruns the benchmark (``python -m <module> <argv>``), `commit`,
  `gpu_name` of ``device`` (None on the CPU), the CPU (``name``: `cpu_name`, and ``count``), and
  `versions` of python, torch, cuda and qace followed by ``packages``.
- ``cpu_name()`` gives the CPU's model as the kernel names it (``/proc/cpuinfo``'s first ``model name``),
  else ``platform.processor()``, else ``platform.machine()``: leases of one GPU kind come on hosts of
  different CPUs, and a host-bound number (a small reward call, a parse) moves with them.
- ``commit()`` gives ``{"commit": ..., "dirty": ...}``: the checkout's HEAD and whether tracked files
  differ from it, each None outside git. A copy of the tree whose git metadata is not its own (a GPU
  host's copy) names its commit in the ``QACE_COMMIT`` environment variable; then that is the commit and
  ``dirty`` is None (unknown).
- ``gpu_name(device)`` gives the CUDA device's name (``torch.cuda.get_device_name``), or None where
  ``device`` names no CUDA device or CUDA is not available.
- ``versions(*names)`` gives ``{name: version}`` for the names asked, in that order: ``python``,
  ``cuda`` (the CUDA torch was built with), ``providers`` (onnxruntime's available execution providers,
  comma-joined), or any importable package (its ``__version__``, else its installed distribution's
  version: ``torch``, ``transformers``, ``qace``, ``blis``). A package that is absent or fails to import
  reads None.

Nothing here imports torch or another heavy library until a function asks for it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BASE_VERSIONS = ("python", "torch", "cuda", "qace")
"""The versions every record names; a benchmark adds the packages that decide its numbers."""


def record(
    module: str, argv: Sequence[str] | None, *, device: str | None = None, packages: Sequence[str] = ()
) -> dict[str, Any]:
    """The run-metadata block a benchmark's JSON record opens with (see the module docstring); ``argv``
    None reads ``sys.argv[1:]``."""
    args = list(sys.argv[1:] if argv is None else argv)
    return {
        "command": shlex.join(["python", "-m", module, *args]),
        **commit(),
        "gpu": gpu_name(device),
        "cpu": {"name": cpu_name(), "count": os.cpu_count()},
        "versions": versions(*BASE_VERSIONS, *(name for name in packages if name not in BASE_VERSIONS)),
    }


def commit() -> dict[str, str | bool | None]:
    """The checkout's commit and whether tracked files differ from it (None outside git). A copy of the
    tree whose git metadata is not its own (a GPU host's copy) names its commit in ``QACE_COMMIT``."""
    if os.environ.get("QACE_COMMIT"):
        return {"commit": os.environ["QACE_COMMIT"], "dirty": None}

    def git(*args: str) -> str | None:
        try:
            return subprocess.run(
                ["git", *args], cwd=REPO, capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None

    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(status) if status is not None else None}


def cpu_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model (see the module docstring); ``cpuinfo`` is the kernel's file, a parameter to test."""
    try:
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_name(device: str | None = None) -> str | None:
    """The name of the CUDA device ``device`` names (``cuda``, ``cuda:1``; None: the current one), or
    None where it names no CUDA device or CUDA is not available."""
    if device is not None and not device.startswith("cuda"):
        return None
    import torch

    return torch.cuda.get_device_name(device) if torch.cuda.is_available() else None


def gpu_tag(name: str | None) -> str:
    """A short file-name tag for a device name: ``NVIDIA H100 80GB HBM3`` -> ``h100``; ``cpu`` without one."""
    if not name:
        return "cpu"
    for word in name.replace("-", " ").split():
        if word[:1].isalpha() and any(ch.isdigit() for ch in word):
            return word.lower()
    return name.split()[-1].lower()


RESULTS = Path(__file__).resolve().parent / "results"
"""Where the committed records live."""


def default_result(stem: str, gpu: str | None) -> Path:
    """A benchmark's default record for the device named ``gpu`` (`gpu_name`'s; None: the CPU):
    ``results/<stem>_<gpu_tag>.json``."""
    return RESULTS / f"{stem}_{gpu_tag(gpu)}.json"


def write_result(result: dict[str, Any], out: Path | None, stem: str, device: str | None = "cuda") -> Path:
    """Write a benchmark's record, indented JSON, to ``out`` or by default to `default_result` for the
    device ``device`` names (`gpu_name`'s); returns the path written."""
    path = out or default_result(stem, gpu_name(device))
    path.write_text(json.dumps(result, indent=1) + "\n")
    return path


def _version(name: str) -> str | None:
    """One entry of `versions`: ``python``, ``cuda``, ``providers`` or a package's version."""
    if name == "python":
        return platform.python_version()
    try:
        if name == "cuda":
            import torch

            return torch.version.cuda
        if name == "providers":
            import onnxruntime

            return ",".join(onnxruntime.get_available_providers())
        module = importlib.import_module(name)
        found = getattr(module, "__version__", None)
        return str(found) if found is not None else importlib.metadata.version(name)
    except Exception:  # noqa: BLE001 (absent, or built for another torch: recorded as unknown)
        return None


def versions(*names: str) -> dict[str, str | None]:
    """``{name: _version(name)}`` for ``names``, in that order."""
    return {name: _version(name) for name in names}
