"""Progress and log output of long work: a bar on a terminal, structured log lines otherwise.

Work loops report through `track` (``with track("scoring", total=n, unit="caption") as bar: bar.update(k)``);
the command line calls `configure` once, from ``--quiet`` and ``--log-format``. Output modes:

- ``bar``: a tqdm bar on stderr (count, rate, ETA). The library's default, through ``tqdm.auto`` so that
  notebooks get their widget; the command line picks it when stderr is a terminal.
- ``lines``: when stderr is not a terminal (a log file, a batch job), a log record from the ``qace.progress``
  logger every ``interval_s`` seconds and at the end, with the done count, total, rate and ETA: one line of
  text (``progress scoring: 1200/5000 captions (24%), 85.2 captions/s, ETA 45 s``) or, with
  ``--log-format json``, one JSON object per line like every other log record (`JsonFormatter`).
- ``off`` (``--quiet``): no progress, no log records below WARNING, and no summary (`summary`).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import IO, Any

log = logging.getLogger("qace.progress")

MODES = ("bar", "lines", "off")
LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(levelname)s %(name)s: %(message)s"


@dataclass
class _Settings:
    mode: str = "bar"
    log_format: str = "text"
    interval_s: float = 10.0
    handler: logging.Handler | None = None


_settings = _Settings()


def configure(
    *,
    quiet: bool = False,
    verbose: bool = False,
    log_format: str = "text",
    interval_s: float = 10.0,
    stream: IO[str] | None = None,
) -> None:
    """Set the process's progress mode and its log handler on the root logger (replacing the one an earlier
    call added; other handlers stay).

    The mode is ``off`` when ``quiet``, else ``bar`` when ``stream`` (default: stderr) is a terminal and
    ``lines`` otherwise. Records go to ``stream`` at INFO (DEBUG with ``verbose``, WARNING with ``quiet``),
    as text or as one JSON object per line.
    """
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS}, got {log_format!r}")
    stream = stream or sys.stderr
    isatty = getattr(stream, "isatty", None)
    mode = "off" if quiet else "bar" if isatty is not None and isatty() else "lines"
    _settings.mode, _settings.log_format, _settings.interval_s = mode, log_format, interval_s
    if mode != "bar":
        _hide_hub_bars()
    root = logging.getLogger()
    if _settings.handler is not None:
        root.removeHandler(_settings.handler)
    _settings.handler = logging.StreamHandler(stream)
    _settings.handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    root.addHandler(_settings.handler)
    root.setLevel(logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO)


def _hide_hub_bars() -> None:
    """Turn off the Hugging Face libraries' own bars ("Loading weights"): noise without a terminal."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # read when huggingface_hub is first imported
    if "transformers" in sys.modules:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()


def add_output_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--quiet`` and ``--log-format`` to ``parser`` and to every subcommand under it, so they work
    before or after the command name (``qace --quiet score ...`` and ``qace score ... --quiet``)."""
    for p, default in _parsers(parser):
        p.add_argument("-q", "--quiet", action="store_true", default=default(False),
                       help="no progress, no info logs, no summary: only warnings and errors")  # fmt: skip
        p.add_argument("--log-format", choices=LOG_FORMATS, default=default("text"),
                       help="text, or one JSON object per line (logs, progress, summary)")  # fmt: skip


def _parsers(parser: argparse.ArgumentParser) -> Any:
    """``parser`` (with real defaults) then every subparser below it (defaults suppressed, so a value given
    before the command name is not reset by the subcommand's own default)."""
    yield parser, lambda value: value
    stack = [parser]
    while stack:
        for action in stack.pop()._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in dict.fromkeys(action.choices.values()):  # aliases map to the same parser
                    yield sub, lambda value: argparse.SUPPRESS
                    stack.append(sub)


def mode() -> str:
    """The current output mode: ``bar``, ``lines`` or ``off``."""
    return _settings.mode


def bars_shown() -> bool:
    """Whether nested progress bars (a model stage inside a file run) may draw: only in ``bar`` mode."""
    return _settings.mode == "bar"


class Tracker:
    """Progress of one task; `update` as work is done, closed by its ``with`` block."""

    def __init__(self, desc: str, total: int | None, unit: str, enabled: bool) -> None:
        self.desc, self.total, self.unit = desc, total, unit
        self.done = 0
        self.mode = _settings.mode if enabled else "off"
        self._start = self._last = time.monotonic()
        self._bar: Any = None
        if self.mode == "bar":
            from tqdm.auto import tqdm

            self._bar = tqdm(desc=desc, total=total, unit=f" {unit}s" if unit else "it")

    def update(self, n: int = 1) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
        elif self.mode == "lines":
            now = time.monotonic()
            if now - self._last >= _settings.interval_s:
                self._last = now
                self._emit(final=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.mode == "lines":
            self._emit(final=True)
        self.mode = "off"

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fields(self) -> dict[str, Any]:
        """The numbers of a progress line: task, done, total, unit, elapsed_s, rate (per second), eta_s."""
        elapsed = max(time.monotonic() - self._start, 1e-9)
        rate = self.done / elapsed
        left = None if self.total is None else max(self.total - self.done, 0)
        eta = None if left is None or rate == 0 else left / rate
        return {"task": self.desc, "done": self.done, "total": self.total, "unit": self.unit,
                "elapsed_s": round(elapsed, 3), "rate": round(rate, 3),
                "eta_s": None if eta is None else round(eta, 1)}  # fmt: skip

    def _emit(self, *, final: bool) -> None:
        f = self.fields()
        event = "done" if final else "progress"
        count = f"{f['done']}" if f["total"] is None else f"{f['done']}/{f['total']}"
        count += f" {self.unit}s"
        if f["total"]:
            count += f" ({f['done'] / f['total']:.0%})"
        text = f"{event} {self.desc}: {count}, {f['rate']:.1f} {self.unit}s/s"
        if final:
            text += f" in {_duration(f['elapsed_s'])}"
        elif f["eta_s"] is not None:
            text += f", ETA {_duration(f['eta_s'])}"
        log.info(text, extra={"qace": {"event": event, **f}})


def track(desc: str, *, total: int | None = None, unit: str = "caption", enabled: bool = True) -> Tracker:
    """A `Tracker` in the current mode (none at all when not ``enabled``, e.g. ``progress=False``)."""
    return Tracker(desc, total, unit, enabled)


def summary(message: str, **fields: Any) -> None:
    """Print a command's closing summary on stdout: the text, or with ``--log-format json`` a JSON object
    ``{"event": "summary", "message", **fields}``; nothing with ``--quiet``."""
    if _settings.mode == "off":
        return
    if _settings.log_format == "json":
        print(json.dumps({"event": "summary", "message": message, **fields}))
    else:
        print(message)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, and the record's ``qace``
    fields (progress numbers) at the top level."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        payload.update(getattr(record, "qace", {}))
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str)


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(math.ceil(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s"
