"""Exports made on first use and cached, sentence-transformers style.

Where an export of ``source`` lives: ``<source>/onnx/<variant>/`` when the source is a writable local
directory (so ``qace export MODEL_DIR`` and the backend agree without flags), otherwise
``$QACE_ONNX_CACHE`` (default ``~/.cache/qace/onnx``) ``/<source slug>-<fingerprint>/<variant>/``.
An export is reused only if its manifest names the same weights fingerprint and export format
version; anything else is re-exported and validated again. Concurrent first uses are serialised with
a file lock, so parallel test sessions or workers export once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from qace.engine.onnx_runner import OnnxRunner, check_device
from qace.errors import ConfigError
from qace.export.exporter import export_model
from qace.onnx_format import FORMAT_VERSION, GRAPHS, read_manifest

logger = logging.getLogger(__name__)

DEFAULT_CACHE = "~/.cache/qace/onnx"


def runner_for(
    model: Any,
    source: str,
    *,
    precision: str = "fp32",
    device: str = "cpu",
    fingerprint: str | None = None,
    threads: int | None = None,
    max_batch: tuple[int, int] | None = None,
) -> OnnxRunner:
    """An ONNX Runtime runner for a loaded model, exporting and validating it on first use.

    ``precision``: ``fp32`` (exact), ``fp16`` (meant for CUDA) or ``int8`` (dynamic quantization, CPU);
    ``max_batch``: the scheduler's (rows, tokens) batch limits (`qace.engine.onnx_runner.OnnxRunner`).
    """
    if precision not in ("fp32", "fp16", "int8"):
        raise ConfigError(
            f"the ONNX backend runs fp32, fp16 or int8, not {precision!r}; use --backend torch for bf16"
        )
    check_device(device)
    export_dir = ensure_export(source, model, precision, fingerprint=fingerprint, device=device)
    return OnnxRunner(export_dir, device=device, threads=threads, max_batch=max_batch)


def cache_root() -> Path:
    return Path(os.environ.get("QACE_ONNX_CACHE") or DEFAULT_CACHE).expanduser()


def export_location(source: str, variant: str, fingerprint: str) -> Path:
    """Directory that holds (or will hold) the ``variant`` export of ``source``."""
    path = Path(source).expanduser()
    if path.is_dir() and os.access(path, os.W_OK):
        return path / "onnx" / variant
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", source.strip("/~.")) or "model"
    return cache_root() / f"{slug}-{fingerprint.removeprefix('sha256-')}" / variant


def is_current(export_dir: Path, fingerprint: str) -> bool:
    """True when ``export_dir`` holds a complete, validated export of these weights in this format."""
    try:
        info = read_manifest(export_dir)
    except ConfigError:
        return False
    return (
        info.get("format_version") == FORMAT_VERSION
        and info.get("fingerprint") == fingerprint
        and "validation" in info
        and all((export_dir / f"{name}.onnx").is_file() for name in GRAPHS)
    )


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not POSIX: the export still lands atomically (temp dir, then rename)
        yield
        return
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_export(
    source: str | Path, model: Any, variant: str, *, fingerprint: str | None = None, device: str = "cpu"
) -> Path:
    """The ``variant`` export of ``model`` (loaded from ``source``), exported and validated if missing."""
    from qace.models.loading import checkpoint_fingerprint

    source = str(source)
    fingerprint = fingerprint or checkpoint_fingerprint(source)
    out = export_location(source, variant, fingerprint)
    if is_current(out, fingerprint):
        return out
    with _lock(out.parent / f".{out.name}.lock"):
        if is_current(out, fingerprint):  # another process finished it while we waited
            return out
        logger.info("no current %s ONNX export of %s: exporting to %s (once)", variant, source, out)
        export_model(
            model, out, variant=variant, fingerprint=fingerprint, source=source, validation_device=device
        )
    return out
