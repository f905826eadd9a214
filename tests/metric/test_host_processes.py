"""The engine core with host processes (`host_workers`): the same rows as one process, and no run lost
or process left behind when a process dies or the user stops it.

The tests force host processes on the CPU (the default there is 0, the single-process design), with
small chunks so that several are in flight at once.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qace.api import HOST_MIN_CHUNKS, QACE
from qace.data.features import RandomFeatureStore
from qace.data.records import Record
from qace.engine.core import CoreError
from qace.errors import HostWorkerError

CAPTIONS = [
    "a dog runs on the grass with a red ball",
    "two men are riding horses on the ground",
    "a woman holds an umbrella in the rain",
    "a cat sleeps on a wooden bench near the window",
    "three children play football in a park",
    "a red bus drives down a busy street",
]
REFERENCES = [["a brown dog running in a field", "people riding horses on a beach"]]


def _records(n: int) -> list[dict]:
    return [
        {
            "id": f"r{i}",
            "image_id": f"img{i % 7}",
            "caption": f"{CAPTIONS[i % len(CAPTIONS)]} number {i}",
            "references": REFERENCES[0],
        }
        for i in range(n)
    ]


@pytest.mark.parametrize("variant", ["ref", "img"])
def test_rows_equal_the_single_process_design(
    test_models_dir: Path, variant: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lists are cut alike by both designs (`qace.chunks.Tapered`), so their rows are equal, also while
    host processes start (the first chunks run in this process) and once they are ready; input of at
    most `HOST_MIN_CHUNKS` chunks starts no process, longer input starts them and says so, and input of
    one chunk is scored in this process even once they are ready. Beside the host processes the parse
    takes only the cores they leave (`parsing_beside_hosts`: on 4 cores, 2 host processes leave one)."""
    monkeypatch.setattr("qace.config._cores", lambda: 4)
    features = RandomFeatureStore() if variant == "img" else None
    kw = dict(models=test_models_dir, variant=variant, features=features, progress=False, explain=True)
    captions = [r["caption"] for r in _records(30)] + ["", "  "]  # two bad records among them
    refs = [REFERENCES[0]] * len(captions)
    images = [f"img{i % 7}" for i in range(len(captions))]
    inputs = dict(references=refs) if variant == "ref" else dict(image_ids=images)
    head = {k: v[: HOST_MIN_CHUNKS * 4] for k, v in inputs.items()}
    single = QACE(host_workers=0, chunk_size=4, **kw)
    alone = single.score(captions, **inputs)
    split = QACE(host_workers=2, spacy_workers=2, chunk_size=4, **kw)
    try:
        with caplog.at_level(logging.INFO, logger="qace.api"):
            short = captions[: HOST_MIN_CHUNKS * 4]
            assert split.score(short, **head) == single.score(short, **head)
            assert split.host is None
            assert "scored by this process" in caplog.text
            starting = split.score(captions, **inputs)  # starts the processes: chunks here until ready
        assert split.host is not None and split.host.size == 2
        assert starting == alone
        assert sum("error" in r for r in starting) == 2
        split.start_host_processes(wait=True)
        assert split.candidates.processes == 1  # of 2 spaCy processes
        with caplog.at_level(logging.DEBUG, logger="qace.api"):
            assert split.score(captions, **inputs) == alone
        assert "scored by 2 host processes and 2 spaCy processes" in caplog.text
        # one chunk (a reward call) is scored here even with the host processes ready
        one = {k: v[:4] for k, v in inputs.items()}
        dispatch, split._dispatch = split._dispatch, None  # calling it would raise
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="qace.api"):
            assert split.score(captions[:4], **one) == single.score(captions[:4], **one)
        assert "input of one chunk: scored by this process" in caplog.text
        split._dispatch = dispatch
        # a failing batch in the core fails its call with the core's message; the next call is served
        tqa = split.core.runners["tqa"]

        class Broken:
            def generate(self, *args: object, **kwargs: object) -> None:
                raise RuntimeError("device fault for the test")

        split.core.runners["tqa"] = Broken()
        with pytest.raises(CoreError, match="device fault for the test"):
            split.score(captions, **inputs)
        split.core.runners["tqa"] = tqa
        assert split.score(captions, **inputs) == alone
    finally:
        split.close()


# -- processes that die, and Ctrl-C (the command line, in a process of its own) ------------------------


def _children(pid: int) -> list[int]:
    """The pids of ``pid``'s host processes (`qace.engine.launch` children)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid and "qace.engine.launch" in cmdline:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_gone(pids: list[int], seconds: float = 20.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def _command(inp: Path, out: Path, models: Path, *extra: str) -> list[str]:
    """``qace score`` with host processes ready before its first chunk (`eager_hosts_cli`)."""
    return [
        sys.executable, "-m", "tests.metric.eager_hosts_cli", "score", str(inp), "-o", str(out),
        "--models", str(models),
        "--device", "cpu", "--chunk-size", "4", "--host-workers", "2", "--no-progress", *extra,
    ]  # fmt: skip


def _start(command: list[str]) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _after_first_commit(proc: subprocess.Popen[str], out: Path, seconds: float = 240.0) -> list[int]:
    """Wait until the run has committed a chunk and its host processes are up; their pids."""
    deadline = time.monotonic() + seconds
    partial = out.parent / (out.name + ".partial")
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        hosts = _children(proc.pid)
        manifest = partial / "manifest.json"
        committed = manifest.exists() and json.loads(manifest.read_text()).get("chunks")
        if committed and len(hosts) == 2:
            return hosts
        time.sleep(0.05)
    raise AssertionError("the run committed no chunk in time")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, test_models_dir: Path) -> dict[str, Path]:
    """An input of 96 records and its uninterrupted output by the single-process design (a command
    line of its own, as the runs it is compared with: torch's thread count moves fp32 rounding)."""
    work = tmp_path_factory.mktemp("host-runs")
    inp = work / "in.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in _records(96)))
    whole = work / "whole.jsonl"
    command = _command(inp, whole, test_models_dir)
    command[command.index("--host-workers") + 1] = "0"
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return {"input": inp, "whole": whole, "models": test_models_dir}


def test_a_killed_host_process_stops_the_run_clearly_and_resume_is_byte_identical(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "out.jsonl"
    proc = _start(_command(runs["input"], out, runs["models"]))
    hosts = _after_first_commit(proc, out)
    os.kill(hosts[0], signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    assert f"host process 0 (pid {hosts[0]}) was killed by signal 9" in err
    assert "--resume" in err and "Traceback" not in err
    assert not out.exists()
    assert _wait_gone(hosts) == []
    done = subprocess.run(
        _command(runs["input"], out, runs["models"], "--resume"), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == runs["whole"].read_bytes()


def test_a_killed_device_process_leaves_no_host_process_and_resume_is_byte_identical(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "out.jsonl"
    proc = _start(_command(runs["input"], out, runs["models"]))
    hosts = _after_first_commit(proc, out)
    proc.kill()
    proc.communicate(timeout=60)
    assert _wait_gone(hosts) == []
    done = subprocess.run(
        _command(runs["input"], out, runs["models"], "--resume"), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == runs["whole"].read_bytes()


def test_ctrl_c_stops_the_run_and_every_host_process(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    proc = _start(_command(runs["input"], out, runs["models"]))
    hosts = _after_first_commit(proc, out)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0, err
    assert not out.exists()
    assert _wait_gone(hosts) == [], err
    assert _children(proc.pid) == []


def test_a_script_without_a_main_guard_scores_with_host_and_spacy_processes(
    test_models_dir: Path, tmp_path: Path
) -> None:
    """The README's Python example saved as a plain script, without ``if __name__ == "__main__":``:
    host processes and spaCy's processes start without running the script again, and it scores and
    exits (with multiprocessing's spawn, each child ran the script, died at start, and the parent
    waited forever)."""
    script = tmp_path / "score.py"
    script.write_text(
        "from qace import QACE\n"
        f"scorer = QACE(models={str(test_models_dir)!r}, variant='ref', host_workers=2, spacy_workers=1,"
        " progress=False)\n"
        "rows = scorer.score(['a dog runs on the grass'], references=[['a brown dog running in a field']])\n"
        "print('qace', rows[0]['qace'], rows[0]['n_questions'])\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    words = done.stdout.split()
    assert words[0] == "qace" and 0.0 <= float(words[1]) <= 1.0 and int(words[2]) > 0, done.stdout


def test_host_pool_refuses_after_close(test_models_dir: Path) -> None:
    scorer = QACE(models=test_models_dir, variant="ref", progress=False, host_workers=1)
    scorer.close()
    with pytest.raises(HostWorkerError, match="closed"):
        scorer.score(["a dog runs"], references=[["a dog"]])


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_on_a_gpu_the_engine_core_gives_the_single_process_rows(
    test_models_dir: Path, precision: str
) -> None:
    """The engine core on CUDA (CUDA graphs, the device feature slab, BERTScore's device half): whole
    chunks (files) and tapered lists give exactly the single-process design's rows, in fp32 and bf16."""
    features = RandomFeatureStore()
    kw = dict(models=test_models_dir, variant="img", features=features, progress=False, explain=True)
    kw |= dict(device="cuda", precision=precision, chunk_size=8, spacy_workers=0)
    records = [Record(r["id"], r["caption"], r["image_id"], tuple(r["references"])) for r in _records(40)]
    captions = [r.caption for r in records]
    images = [r.image_id for r in records]
    single = QACE(host_workers=0, **kw)
    alone = list(single.score_committed(records))
    alone_list = single.score(captions, image_ids=images)
    split = QACE(host_workers=2, **kw)
    try:
        split.start_host_processes(wait=True)
        assert list(split.score_committed(records)) == alone
        assert split.score(captions, image_ids=images) == alone_list
    finally:
        split.close()
