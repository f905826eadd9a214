"""``--gpus`` workers die with their parent, and a shard is locked while a worker writes it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qace.data.output import ResultWriter
from qace.errors import ResumeError

ROOT = Path(__file__).resolve().parents[2]
SIGNATURE = "Length|unit:words|version:0.1.0"


def _alive(pid: int) -> bool:
    """True while a thread of ``pid`` runs (a zombie waiting for a reaper counts as ended; its files,
    and the locks on them, go when its last thread has ended)."""
    states = []
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            states.append(stat.read_text().rsplit(")", 1)[1].split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue
    return any(state not in ("Z", "X") for state in states)


def _wait(condition, seconds: float) -> bool:  # noqa: ANN001
    """Poll ``condition`` until it holds or ``seconds`` pass (a bound for a stuck run, not a speed)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_die_with_their_parent_and_a_shard_is_locked_while_written(tmp_path: Path) -> None:
    shard_input, shard_output, pid_file = (tmp_path / n for n in ("input-0.jsonl", "shard-0.jsonl", "pid"))
    record = {"id": "a", "caption": "a dog", "image_id": None, "references": None, "image": None, "line": 1}
    shard_input.write_text(json.dumps(record) + "\n")
    job = (
        f"ShardJob(0, 'cpu', {str(shard_input)!r}, {str(shard_output)!r}, "
        f"{{'pid_file': {str(pid_file)!r}}}, False, 1, 'tests.scale.orphan:stalling')"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", f"from qace.scale import shards as s; s._run_workers([s.{job}])"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    worker = None
    try:
        assert _wait(lambda: pid_file.exists() and pid_file.read_text(), 300), "the worker never started"
        worker = int(pid_file.read_text())
        with pytest.raises(ResumeError, match="is being written by another process"):
            ResultWriter(shard_output, signature=SIGNATURE, resume=True, chunk_size=4)
        parent.kill()  # kill -9: the parent gets no chance to stop its workers
        parent.wait(timeout=60)
        assert _wait(lambda: not _alive(worker), 60), "the worker outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
        if worker is not None and _alive(worker):
            os.kill(worker, signal.SIGKILL)
    with ResultWriter(shard_output, signature=SIGNATURE, resume=True, chunk_size=4) as writer:
        assert writer.done_ids() == set()  # the lock went with the worker; its shard resumes


def test_workers_split_the_cores_for_torch_and_one_gpu_worker_keeps_the_default(monkeypatch) -> None:
    from qace.scale import shards

    monkeypatch.setattr(os, "cpu_count", lambda: 32)
    assert shards.torch_threads(["cuda:0"]) is None
    assert shards.torch_threads(["cuda:0", "cuda:1"]) == 16
    assert shards.torch_threads(["cuda:0", "cuda:1", "cuda:2", "cuda:3"]) == 8
    assert shards.torch_threads(["cpu"]) == 32
    assert shards.torch_threads(["cpu"] * 64) == 1
