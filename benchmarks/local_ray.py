"""A real local Ray cluster for the benchmarks: ``ray start --head --block`` in a subprocess, a driver
connected to it, and the cluster stopped afterwards.

`local_cluster(gpus=..., cpus=..., object_store_bytes=...)` starts the head node as its own process group
(``python -m ray.scripts.scripts start --head --block``, so no ``ray`` command on the PATH is needed) in a
private temporary directory, connects this process (``ray.init(address=...)``) and yields a `Cluster`.
On exit it disconnects and kills the head's process group (SIGKILL: ``ray start --block`` and the GCS
outlive a SIGTERM), waiting until none of it runs; unlike ``ray stop``, this never stops another Ray of
the host.

The head runs with token authentication off (``RAY_AUTH_MODE=disabled``, for the head only: Ray 2.60
turns it on where ``~/.ray/auth_token`` exists, and a driver reads its mode when it imports Ray, so this
process and the drivers it starts connect as they are) and with this checkout first on its workers'
``PYTHONPATH``, as an absolute path: actors import this ``qace`` and ``benchmarks`` whatever their working
directory.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class Cluster:
    """A running local cluster: its address (``127.0.0.1:PORT``), the resources it was started with,
    and how long ``ray start`` took until the address was known."""

    address: str
    gpus: int
    cpus: int
    object_store_bytes: int
    start_seconds: float
    temp_dir: Path

    def settings(self) -> dict[str, Any]:
        """How the cluster was started, for a benchmark record."""
        return {
            "start": "ray start --head --block (one node, this host)",
            "num_gpus": self.gpus,
            "num_cpus": self.cpus,
            "object_store_memory_bytes": self.object_store_bytes,
            "start_seconds": self.start_seconds,
        }


@contextmanager
def local_cluster(*, gpus: int, cpus: int, object_store_bytes: int) -> Iterator[Cluster]:
    """Start a one-node cluster with ``gpus`` GPUs, ``cpus`` logical CPUs and an object store of
    ``object_store_bytes``, connect this process to it, and stop it on exit (see the module docstring).
    Raises `RuntimeError` with the end of ``ray start``'s log if the head does not come up."""
    import ray

    temp = Path(tempfile.mkdtemp(prefix="qr", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": path}
    argv = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", "--port", "0",
            "--node-ip-address", "127.0.0.1", "--num-gpus", str(gpus), "--num-cpus", str(cpus),
            "--object-store-memory", str(object_store_bytes), "--include-dashboard", "false",
            "--disable-usage-stats", "--temp-dir", str(temp)]  # fmt: skip
    log_path = temp / "ray-start.log"
    started = time.perf_counter()
    with log_path.open("w") as log:
        head = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        address_file = temp / "ray_current_cluster"
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (address_file.is_file() and address_file.read_text().strip()):
            if head.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"`ray start --head` did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.2)
        port = address_file.read_text().strip().rsplit(":", 1)[1]
        address = f"127.0.0.1:{port}"
        ray.init(address=address)
        ray.data.DataContext.get_current().enable_progress_bars = False
        yield Cluster(address, gpus, cpus, object_store_bytes, time.perf_counter() - started, temp)
    finally:
        ray.shutdown()
        _stop(head)
        shutil.rmtree(temp, ignore_errors=True)


def _stop(head: subprocess.Popen[bytes]) -> None:
    """SIGKILL the head's process group (Ray's head, GCS, raylet, workers), reap the head and wait until
    no process of the group runs (zombies left to another reaper do not count); `RuntimeError` naming
    the processes still running after `STOP_TIMEOUT_S`."""
    try:
        os.killpg(head.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    head.wait(STOP_TIMEOUT_S)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while (left := group_running(head.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if left:
        raise RuntimeError(
            f"processes {left} of the Ray cluster still run {STOP_TIMEOUT_S:.0f} s after SIGKILL"
        )


def group_running(pgid: int) -> list[int]:
    """The processes of group ``pgid`` that still run (not zombies), from ``/proc``."""
    running = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            running.append(int(stat.parent.name))
    return running


def wait_idle(timeout: float = 120.0) -> float:
    """Wait until every CPU and GPU of the connected cluster is free again (the actors and tasks of an
    earlier job, e.g. of a killed driver, are gone); returns the seconds waited. `TimeoutError` after
    ``timeout`` seconds."""
    import ray

    start = time.monotonic()
    while True:
        total, free = ray.cluster_resources(), ray.available_resources()
        if all(free.get(kind, 0.0) >= total.get(kind, 0.0) for kind in ("CPU", "GPU")):
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"the cluster is still busy after {timeout:.0f} s: {free} free of {total}")
        time.sleep(0.2)
