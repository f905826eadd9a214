"""``qace score-ray`` checks the cluster before it submits: against a real ``ray start --head`` cluster (token
authentication on, 2 CPUs, no GPU) the default ``--gpus-per-actor 1`` fails at once naming the flag,
instead of waiting forever; the check's arithmetic; the hint when a connection fails."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("ray")

from qace.errors import ConfigError  # noqa: E402
from qace.scale.ray_data import check_resources  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "qace" / "examples" / "captions.jsonl"
START_TIMEOUT_S = 90


def _node(gpus: float, cpus: float, alive: bool = True) -> dict:
    return {"Alive": alive, "Resources": {"GPU": gpus, "CPU": cpus} if gpus else {"CPU": cpus}}


def test_check_resources_names_the_flag_to_change() -> None:
    with pytest.raises(ConfigError, match=r"0 GPU\(s\).*--gpus-per-actor 1 .*pass --gpus-per-actor 0"):
        check_resources([_node(0, 16)], 1, 1.0, 1.0)
    with pytest.raises(ConfigError, match="3 actor"):  # a dead node's GPUs do not count
        check_resources([_node(2, 16), _node(8, 16, alive=False)], (3, 8), 1.0, 1.0)
    with pytest.raises(ConfigError, match=r"4 actor\(s\) of 1 CPU\(s\) each.*pass --actors 3 "):
        check_resources([_node(0, 2), _node(0, 1)], 4, 0.0, 1.0)
    with pytest.raises(ConfigError, match="--gpus-per-actor 1.5"):  # an actor's GPUs come from one node
        check_resources([_node(1, 8), _node(1, 8)], 1, 1.5, 1.0)
    check_resources([_node(2, 8), _node(1, 8)], 6, 0.5, 1.0)
    check_resources([_node(0, 4)], (2, 8), 0.0, 1.0)


@pytest.mark.parametrize(
    ("nodes", "actors", "gpus", "fit"),
    [
        ([_node(0, 16)], 1, 1.0, "0 fit"),
        ([_node(2, 16)], (3, 8), 1.0, "2 fit"),
        ([_node(0, 2)], 4, 0.0, "2 fit"),
    ],
)
def test_check_resources_says_how_many_fit_and_prints_no_empty_placeholder(nodes, actors, gpus, fit) -> None:
    """The messages once read ``(gpus_per_actor=)`` and ``(actors=)``: placeholders with nothing in them."""
    with pytest.raises(ConfigError) as err:
        check_resources(nodes, actors, gpus, 1.0)
    message = str(err.value)
    assert f"({fit})" in message and "=)" not in message and "()" not in message


def test_a_failed_connection_says_how_token_authentication_is_set(monkeypatch, capsys) -> None:
    import ray

    from qace.cli import main

    def refuse(**kwargs: object) -> None:
        raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379")

    monkeypatch.setattr(ray, "init", refuse)
    assert main(["score-ray", str(EXAMPLES), "-o", "out", "--address", "10.0.0.1:6379"]) == 2
    assert "RAY_AUTH_MODE=token" in capsys.readouterr().err


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[str, dict[str, str]]]:
    """A ``ray start --head --block`` cluster of this host (2 CPUs, no GPU, token authentication on):
    its address over loopback and the environment a client needs; stopped (its process group) after."""
    ray_cli = Path(sys.executable).parent / "ray"
    if not ray_cli.is_file():
        pytest.skip(f"no `ray` command next to {sys.executable}")
    temp = Path(tempfile.mkdtemp(prefix="qr", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    argv = [str(ray_cli), "start", "--head", "--block", "--port", "0", "--node-ip-address", "127.0.0.1",
            "--num-cpus", "2", "--num-gpus", "0", "--include-dashboard", "false", "--disable-usage-stats",
            "--temp-dir", str(temp)]  # fmt: skip
    log = open(temp / "ray-start.log", "w")  # noqa: SIM115 - closed below
    head = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        address_file = temp / "ray_current_cluster"
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (address_file.is_file() and address_file.read_text().strip()):
            if head.poll() is not None or time.monotonic() > deadline:
                pytest.skip(
                    f"`ray start --head` did not start here: {(temp / 'ray-start.log').read_text()[-500:]}"
                )
            time.sleep(0.5)
        port = address_file.read_text().strip().rsplit(":", 1)[1]
        yield f"127.0.0.1:{port}", env
    finally:
        try:
            os.killpg(head.pid, signal.SIGKILL)  # the head and every Ray process it started
        except ProcessLookupError:
            pass
        head.wait(30)
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def test_score_ray_on_a_cluster_without_gpus_fails_naming_the_flag(
    cluster, test_models_dir, tmp_path
) -> None:
    """The default --gpus-per-actor 1 used to wait forever on a cluster without GPUs."""
    address, env = cluster
    argv = [sys.executable, "-m", "qace.cli", "score-ray", str(EXAMPLES), "-o", str(tmp_path / "out"),
            "--models", str(test_models_dir), "--address", address]  # fmt: skip
    done = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "0 GPU(s) and 2 CPU(s) on 1 live node(s)" in done.stderr
    assert "pass --gpus-per-actor 0" in done.stderr and not (tmp_path / "out").exists()
