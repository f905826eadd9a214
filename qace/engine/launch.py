"""Child processes that import qace's code and never the caller's script.

multiprocessing's ``spawn`` and ``forkserver`` start methods run the parent's main script again in
every child before its target: a script without an ``if __name__ == "__main__":`` guard then builds
the scorer again in each child, which dies at start with multiprocessing's bootstrapping error (and
CPython can leave the parent blocked for good, writing a large start-up payload into a pipe that no
one reads). `start_child` starts a fresh interpreter instead (``sys.executable -c``) that imports only
the target's module, whatever the caller's main module is: a guarded or unguarded script, a notebook,
``python -c``. The child gets the parent's ``sys.path`` and multiprocessing authentication key, so
what the parent can import and send over a `Connection` the child can too.

Contract of a child: ``target`` (``"module:function"``) is called as ``target(argument, control,
*pipes)``, where ``control`` and ``pipes`` are the child's ends of the `Child`'s connections; the child
ends within a fraction of a second of its parent's death (`die_with_parent`), ``kill -9`` included, and
ignores Ctrl-C (its parent stops it).
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection, Pipe
from typing import Any

_BOOT = (
    "import sys\n"
    "from multiprocessing.connection import Connection\n"
    "control = Connection(int(sys.argv[2]))\n"
    "sys.path[:] = control.recv()\n"
    "from qace.engine.launch import child_main\n"
    "child_main(control, sys.argv[1], [int(fd) for fd in sys.argv[3:]])\n"
)
"""The child's first lines: take the parent's import path from the control pipe, then `child_main`
(argv: the child's name, the control pipe's descriptor, the parent watch's, the other pipes')."""


def resolve(ref: str) -> Callable[..., Any]:
    """The function a ``"module:function"`` reference names."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]


def die_with_parent(sentinel: int | None = None) -> None:
    """End this process as soon as the process that started it dies, however it dies (``kill -9``
    included): a daemon thread waits for end-of-file on ``sentinel`` (a pipe whose other end only the
    parent holds), or on multiprocessing's parent sentinel when ``sentinel`` is None; a no-op then
    outside a multiprocessing child. (The kernel's parent-death signal would follow the thread that
    started the child, not the process.)"""
    if sentinel is None:
        parent = multiprocessing.parent_process()
        if parent is None:
            return
        wait: Callable[[], object] = parent.join
    else:

        def wait() -> None:
            while os.read(sentinel, 1):
                pass

    def watch() -> None:
        wait()
        os._exit(1)

    threading.Thread(target=watch, name="qace-parent-watch", daemon=True).start()


def child_main(control: Connection, name: str, fds: list[int]) -> None:
    """A child's life after `_BOOT`: watch the parent, take the target and its argument, run it."""
    watch, *pipes = fds
    die_with_parent(watch)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    authkey, target, payload = control.recv()
    process = multiprocessing.current_process()
    process.authkey, process.name = authkey, name
    resolve(target)(pickle.loads(payload), control, *(Connection(fd) for fd in pipes))


@dataclass(eq=False)
class Child:
    """A started child process. ``control`` and ``pipes`` are the parent's ends of its connections."""

    name: str
    process: subprocess.Popen[bytes]
    control: Connection
    pipes: list[Connection]
    _watch: int
    """The parent's end of the pipe the child watches: closed once the child is reaped."""

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def exitcode(self) -> int | None:
        """As `multiprocessing.Process.exitcode`: None while running, ``-N`` if killed by signal N."""
        return self.process.poll()

    def is_alive(self) -> bool:
        return self.process.poll() is None

    def join(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` seconds for the child to end."""
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return
        self._release()

    def kill(self) -> None:
        self.process.kill()

    def _release(self) -> None:
        if self._watch >= 0:
            os.close(self._watch)
            self._watch = -1


def start_child(
    target: str, argument: Any, *, name: str, pipes: int = 0, env: Mapping[str, str] | None = None
) -> Child:
    """Start a child running ``target(argument, control, *pipes)`` (see the module's contract) with
    ``pipes`` duplex connections beside its control connection, and ``env`` added to this process's
    environment. ``argument`` is pickled here, so a fault in it raises here. Returns at once: the child
    imports and sets up on its own time. A child that dies before reading its argument is seen as its
    ended connections (end-of-file) and its exit code, never as a wait."""
    payload = pickle.dumps(argument, protocol=pickle.HIGHEST_PROTOCOL)
    control, child_control = Pipe()
    pairs = [Pipe() for _ in range(pipes)]
    watch_read, watch_write = os.pipe()
    fds = [child_control.fileno(), watch_read, *(child.fileno() for _, child in pairs)]
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", _BOOT, name, *map(str, fds)],
            pass_fds=fds,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )
    except BaseException:
        control.close()
        for parent, _ in pairs:
            parent.close()
        os.close(watch_write)
        raise
    finally:  # the child holds its own copies: once the child ends, reading its connections ends too
        child_control.close()
        for _, end in pairs:
            end.close()
        os.close(watch_read)
    try:
        control.send(sys.path)
        control.send((bytes(multiprocessing.current_process().authkey), target, payload))
    except (BrokenPipeError, ConnectionResetError):
        pass  # it died at start: its owner sees the connection end and the exit code
    return Child(name, process, control, [parent for parent, _ in pairs], watch_write)
