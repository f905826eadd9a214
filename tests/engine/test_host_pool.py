"""Host pools and their children (`qace.engine.launch`): start-up faults fail at once, never wait."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from qace.engine.host_pool import HostPool
from qace.engine.launch import start_child
from qace.errors import HostWorkerError


def exit_at_setup(status: int, _core: Any) -> None:
    """A setup that ends its process (as an import-time crash or the out-of-memory killer would)."""
    os._exit(status)


def raise_at_setup(message: str, _core: Any) -> None:
    raise ValueError(message)


def echo(prefix: str, _core: Any) -> Any:
    return lambda task: f"{prefix}{task} in {os.getpid()}"


def test_a_pool_whose_processes_die_at_start_fails_at_once() -> None:
    pool = HostPool(2, "tests.engine.test_host_pool:exit_at_setup", 3)
    try:
        with pytest.raises(HostWorkerError, match=r"host process \d \(pid \d+\) exited \(3\)"):
            pool.wait_ready(timeout=120)
        with pytest.raises(HostWorkerError, match="exited"):
            pool.submit("a task").result(timeout=120)
    finally:
        pool.close()


def test_a_setup_that_raises_names_its_error() -> None:
    pool = HostPool(1, "tests.engine.test_host_pool:raise_at_setup", "no parser here", label="spaCy")
    try:
        with pytest.raises(HostWorkerError, match=r"(?s)spaCy process 0 .* failed to start.*no parser here"):
            pool.wait_ready(timeout=120)
    finally:
        pool.close()


def spans(_argument: Any, _core: Any) -> Any:
    """A task function that holds its process a while and says when it ran (the host's clock)."""

    def run(task: Any) -> tuple[float, float]:
        start = time.time()
        time.sleep(0.2)
        return start, time.time()

    return run


def test_a_limited_pool_runs_no_more_tasks_at_once_than_its_limit() -> None:
    pool = HostPool(3, "tests.engine.test_host_pool:spans", None)
    try:
        pool.wait_ready(timeout=120)
        pool.limit(1)
        ran = sorted(f.result(timeout=120) for f in [pool.submit(i) for i in range(3)])
        assert all(ran[i][0] >= ran[i - 1][1] for i in range(1, 3))  # one after another
        pool.limit(2)
        ran = sorted(f.result(timeout=120) for f in [pool.submit(i) for i in range(4)])
        # never three at once: each task starts after all but one of those before it ended
        assert all(ran[i][0] >= min(ran[i - 2][1], ran[i - 1][1]) for i in range(2, 4))
        with pytest.raises(ValueError, match="at least 1"):
            pool.limit(0)
    finally:
        pool.close()


def test_tasks_run_in_the_pool_processes_without_a_gpu() -> None:
    pool = HostPool(2, "tests.engine.test_host_pool:echo", "did ")
    try:
        results = [pool.submit(i).result(timeout=120) for i in range(4)]
        assert [r.split(" in ")[0] for r in results] == [f"did {i}" for i in range(4)]
        assert {int(r.split(" in ")[1]) for r in results} <= set(pool.pids)
        assert os.getpid() not in {int(r.split(" in ")[1]) for r in results}
    finally:
        pool.close()
    assert all(not w.process.is_alive() for w in pool._workers)


def environment(names: list[str], _core: Any) -> Any:
    return lambda _task: {name: os.environ.get(name) for name in names}


def test_host_processes_run_without_a_gpu_and_on_one_blas_thread() -> None:
    pool = HostPool(
        1, "tests.engine.test_host_pool:environment", ["CUDA_VISIBLE_DEVICES", "OPENBLAS_NUM_THREADS"]
    )
    try:
        assert pool.submit("env").result(timeout=120) == {
            "CUDA_VISIBLE_DEVICES": "",
            "OPENBLAS_NUM_THREADS": "1",
        }
    finally:
        pool.close()


def test_a_child_that_dies_before_reading_its_argument_does_not_block_the_parent(tmp_path: Path) -> None:
    """An argument far larger than a pipe holds, for a child that dies before it reads anything: the
    start returns and the child's exit is seen (multiprocessing's spawn blocked here for good)."""
    (tmp_path / "sitecustomize.py").write_text("import os\nos._exit(7)\n")
    child = start_child(
        "qace.engine.launch:resolve", b"x" * (64 << 20), name="qace-test", env={"PYTHONPATH": str(tmp_path)}
    )
    child.join(timeout=120)
    assert child.exitcode == 7


def frozen_count(_argument: Any, _core: Any) -> Any:
    import gc

    return lambda task: gc.get_freeze_count()


def test_a_host_process_freezes_what_its_setup_loaded() -> None:
    """Its tasks meet no collection that walks the imports and models its setup loaded."""
    pool = HostPool(1, "tests.engine.test_host_pool:frozen_count", None)
    try:
        assert pool.submit("how many").result(timeout=120) > 1000
    finally:
        pool.close()
