"""Ctrl-C that always stops a command-line run.

Python turns SIGINT into `KeyboardInterrupt` in the main thread, between bytecodes. Code that catches
every exception around a call (a library running Python callbacks from native code, a ``__del__``)
can swallow it, and a run then finishes as if no one had pressed Ctrl-C. `install` replaces Python's
SIGINT handler with one that also records the interrupt, and `check` raises `KeyboardInterrupt` again
if one was recorded and not yet raised by it: the output writer calls it before it commits a chunk, so
a run stops at the latest there, with that chunk uncommitted (``--resume`` redoes it). A process that
ignores SIGINT (started under ``nohup``, or in the background by a non-interactive shell) keeps
ignoring it: `install` only replaces Python's own handler.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

_pending = False


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    global _pending
    _pending = True
    raise KeyboardInterrupt


def install() -> None:
    """Record every SIGINT for `check` (main thread only; a no-op where SIGINT is not Python's)."""
    if threading.current_thread() is threading.main_thread() and (
        signal.getsignal(signal.SIGINT) is signal.default_int_handler
    ):
        signal.signal(signal.SIGINT, _on_sigint)


def check() -> None:
    """Raise `KeyboardInterrupt` if a SIGINT came since the last check (whether or not its first
    `KeyboardInterrupt` was swallowed)."""
    global _pending
    if _pending:
        _pending = False
        raise KeyboardInterrupt
