"""Durable file writes for the result writer: whole or absent (an fsynced ``.tmp`` sibling, then
``os.replace`` and a directory fsync), a clear error when the disk or file-size limit runs out, and the
writer's lock."""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from qace.errors import OutputError, ResumeError

NO_SPACE = {errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)}
"""The errors of a write that ran out of room (disk full, ``ulimit -f``, a quota)."""


def lock(path: Path, output: Path) -> BinaryIO | None:
    """``path`` opened and holding an exclusive POSIX lock (``lockf``; None where there is none), or
    `ResumeError` when another process holds it. The lock belongs to this process (a writer of this
    process reopening the output, as a test of a killed run does, is not refused) and goes with the
    file: closed, or at the process's end, however it ends."""
    try:
        import fcntl
    except ImportError:  # Windows: no advisory locks here
        return None
    f = path.open("ab")
    try:
        fcntl.lockf(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        raise ResumeError(
            f"{output} is being written by another process (it holds {path}); wait for it to finish or "
            "stop it, then rerun with --resume"
        ) from None
    return f


@contextmanager
def space_for(tmp: Path, target: Path, needed: Callable[[], int]) -> Iterator[None]:
    """Turn a write into ``tmp`` that fails for want of space (disk full, ``ulimit -f``, quota) into
    one `OutputError` naming ``target`` and the bytes it needed (``needed()``); ``tmp`` is removed."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in NO_SPACE:
            raise
        tmp.unlink(missing_ok=True)
        size = needed()
        if exc.errno == errno.EFBIG:
            why = f"the file size limit (ulimit -f, or the file system's) is below its {size:,} bytes"
        else:
            free = shutil.disk_usage(tmp.parent).free
            why = f"no space left on its disk: {size:,} bytes needed, {free:,} free"
        raise OutputError(
            f"cannot write {target}: {why}; what was committed is kept, so make room and rerun with --resume"
        ) from None


def atomic_write(path: Path, lines: list[str]) -> None:
    """Write `path` via an fsynced `.tmp` sibling and os.replace, so it is whole or absent."""
    tmp = path.with_name(path.name + ".tmp")
    data = "".join(lines).encode("utf-8")
    with space_for(tmp, path, lambda: len(data)), tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def concatenate(sources: list[Path], target: Path) -> None:
    """Concatenate `sources` byte for byte into `target` through an fsynced `.tmp`."""
    tmp = target.with_name(target.name + ".tmp")
    with space_for(tmp, target, lambda: sum(s.stat().st_size for s in sources)), tmp.open("wb") as out:
        for source in sources:
            with source.open("rb") as f:
                shutil.copyfileobj(f, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, target)
    fsync_dir(target.parent)


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make a rename durable; a no-op where directories cannot be opened (Windows)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
