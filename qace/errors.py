"""One base exception with specific subclasses, so callers can catch exactly what they handle.

Messages always name the record (or file/model) and say how to fix the problem.
"""

from __future__ import annotations


class QACEError(Exception):
    """Base class of every error raised on purpose by qace."""


class InputError(QACEError):
    """A record, file or argument supplied by the user is invalid."""

    def __init__(self, message: str, record_id: str | None = None) -> None:
        super().__init__(message if record_id is None else f"record {record_id!r}: {message}")
        self.record_id = record_id
        self.reason = message


class FeatureError(InputError):
    """Region features for an image are missing or malformed (NaN/Inf, wrong shape)."""


class ConfigError(QACEError):
    """Settings are inconsistent or name something that does not exist."""


class ModelNotFoundError(ConfigError):
    """A model directory or hub id could not be loaded (missing, offline, or of the wrong type)."""


class BackendUnavailableError(QACEError):
    """An optional backend (ONNX Runtime, CUDA, Ray, ...) is not installed or not usable here."""


class HostWorkerError(QACEError):
    """A host process of the engine (`qace.engine.host_pool`) died or failed to start: the run stopped,
    and the message says how to continue it."""


class ExportValidationError(QACEError):
    """An exported graph disagrees with the PyTorch model beyond the tolerance."""

    def __init__(self, message: str, max_abs_diff: float | None = None) -> None:
        super().__init__(message)
        self.max_abs_diff = max_abs_diff


class ResumeError(QACEError):
    """Existing output cannot be resumed (different signature, foreign or corrupt files)."""


class OutputError(QACEError):
    """An output cannot be written: its disk is full or a file size limit (``ulimit -f``) was reached.
    The message names the file and the bytes it needed; what was committed before is kept."""
