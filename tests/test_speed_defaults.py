"""Speed settings follow the device when not given: CPU defaults on the CPU, sized batches and a spaCy
pool on a GPU; whatever the caller gives wins, and sharded GPU engines share the host's cores."""

from __future__ import annotations

import argparse
import types

import pytest
import torch

from qace import api, config
from qace.api import QACE
from qace.config import (
    QACEConfig,
    auto_host_workers,
    auto_spacy_workers,
    given_speed_settings,
    parsing_beside_hosts,
    speed_defaults,
)
from qace.scale.shards import shard_settings


@pytest.fixture
def cores(monkeypatch):
    """Pretend this host has ``n`` usable cores."""

    def set_cores(n: int) -> None:
        monkeypatch.setattr(config.os, "sched_getaffinity", lambda pid: set(range(n)), raising=False)

    return set_cores


@pytest.fixture
def gpu_memory(monkeypatch):
    """Pretend every CUDA device has ``gb`` GB of memory."""

    def set_memory(gb: float) -> None:
        props = types.SimpleNamespace(total_memory=int(gb * 1e9))
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)

    return set_memory


def test_the_cpu_keeps_the_dataclass_defaults() -> None:
    assert speed_defaults("cpu") == {}


@pytest.mark.parametrize(("gb", "rows"), [(80, 2048), (141, 2048), (40, 1024), (24, 512), (16, None)])
def test_gpu_batches_follow_the_cards_memory(gb: float, rows: int | None, gpu_memory, cores) -> None:
    gpu_memory(gb)
    cores(16)
    # 16 cores: 4 host processes for long input; 14 spaCy processes, all a one-chunk call's parse may use
    want = {"chunk_size": 2048, "spacy_workers": 14, "host_workers": 4}
    if rows is not None:
        want |= {"max_batch_rows": rows, "max_batch_tokens": 64 * rows}
    assert speed_defaults("cuda:1") == want


@pytest.mark.parametrize(("gb", "rows"), [(80, 1024), (40, 512), (24, 256), (16, None)])
def test_onnx_runtime_gets_half_the_rows_for_qace_img(gb: float, rows: int | None, gpu_memory, cores) -> None:
    gpu_memory(gb)
    cores(16)
    chosen = speed_defaults("cuda", "onnx", "img")
    assert (chosen.get("max_batch_rows"), chosen.get("max_batch_tokens")) == (rows, rows and 64 * rows)
    batches = ("max_batch_rows", "max_batch_tokens")
    onnx_ref, torch_img = speed_defaults("cuda", "onnx", "ref"), speed_defaults("cuda", "torch", "img")
    assert [onnx_ref.get(k) for k in batches] == [torch_img.get(k) for k in batches]  # all the rows
    # the engine core feeds the PyTorch runner; ONNX Runtime keeps one process (its cores to spaCy)
    assert (onnx_ref["host_workers"], onnx_ref["spacy_workers"]) == (0, 14)


def test_a_device_that_cannot_be_asked_gets_no_gpu_defaults(monkeypatch) -> None:
    def missing(device):
        raise AssertionError("Torch not compiled with CUDA enabled")

    monkeypatch.setattr(torch.cuda, "get_device_properties", missing)
    assert speed_defaults("cuda") == {}  # loading the models then says why


@pytest.mark.parametrize(
    ("n", "engines", "workers"), [(16, 1, 14), (64, 1, 14), (16, 2, 6), (2, 1, 0), (4, 8, 0)]
)
def test_spacy_workers_share_the_cores(n: int, engines: int, workers: int, cores) -> None:
    cores(n)
    assert auto_spacy_workers(engines) == workers


@pytest.mark.parametrize(
    ("n", "spacy", "hosts", "parsing"), [(16, 14, 4, 10), (16, 14, 0, 14), (16, 6, 4, 6), (2, 2, 2, 1)]
)
def test_beside_host_processes_the_parse_takes_the_cores_they_leave(
    n: int, spacy: int, hosts: int, parsing: int, cores
) -> None:
    cores(n)
    assert parsing_beside_hosts(spacy, hosts) == parsing


@pytest.mark.parametrize(
    ("n", "engines", "hosts"), [(16, 1, 4), (32, 1, 4), (8, 1, 2), (2, 1, 1), (16, 2, 2)]
)
def test_host_processes_take_a_quarter_of_an_engines_cores(n: int, engines: int, hosts: int, cores) -> None:
    cores(n)
    assert auto_host_workers(engines) == hosts


def test_given_settings_win_and_a_config_is_taken_as_it_is(test_models_dir, monkeypatch) -> None:
    asked = []

    def chosen_for(device: str, backend: str, variant: str) -> dict[str, int]:
        asked.append((device, backend, variant))
        return {"max_batch_rows": 7, "chunk_size": 9}

    monkeypatch.setattr(api, "speed_defaults", chosen_for)
    scorer = QACE(models=test_models_dir, max_batch_rows=5, progress=False)
    assert (scorer.config.max_batch_rows, scorer.config.chunk_size) == (5, 9)
    QACE(models=test_models_dir, backend="onnx", variant="img", progress=False)
    assert asked == [("cpu", "torch", "ref"), ("cpu", "onnx", "img")]
    chosen = QACEConfig(progress=False)
    assert QACE(chosen, models=test_models_dir).config == chosen


def test_command_line_passes_only_what_was_given() -> None:
    args = argparse.Namespace(batch_tokens=None, batch_rows=64, chunk_size=None, spacy_workers=0)
    assert given_speed_settings(args) == {"max_batch_rows": 64, "spacy_workers": 0}
    assert given_speed_settings(args, ("max_batch_rows", "chunk_size")) == {"max_batch_rows": 64}
    assert given_speed_settings(argparse.Namespace()) == {}  # judges' namespaces lack the options


def test_sharded_gpu_engines_share_the_hosts_cores(cores) -> None:
    cores(16)
    assert shard_settings({}, ["cuda:0", "cuda:1"]) == {
        "progress": False,
        "host_workers": 2,
        "spacy_workers": 4,
    }
    assert shard_settings({"spacy_workers": 3}, ["cuda:0", "cuda:1"])["spacy_workers"] == 3
    assert "spacy_workers" not in shard_settings({}, ["cpu", "cpu"])
    assert "spacy_workers" not in shard_settings({}, ["cuda:0"], "qace.judges.visce2:VisCE2")
