"""``benchmarks/run_info.py``: the commit (``QACE_COMMIT`` first), device name and versions of a record."""

from __future__ import annotations

import platform

import pytest
import torch

from benchmarks.run_info import commit, gpu_name, versions
from qace import __version__


def test_commit_honours_qace_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QACE_COMMIT", "abc1234")
    assert commit() == {"commit": "abc1234", "dirty": None}


def test_commit_reads_git_without_qace_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QACE_COMMIT", raising=False)
    info = commit()
    assert set(info) == {"commit", "dirty"}
    if info["commit"] is not None:  # a checkout: HEAD's hash and whether tracked files differ
        assert isinstance(info["commit"], str) and len(info["commit"]) == 40
        assert isinstance(info["dirty"], bool)


def test_versions_gives_the_names_asked_in_order() -> None:
    info = versions("qace", "torch", "cuda", "python", "no_such_package_qace")
    assert list(info) == ["qace", "torch", "cuda", "python", "no_such_package_qace"]
    assert info["qace"] == __version__ and info["torch"] == torch.__version__
    assert info["cuda"] == torch.version.cuda and info["python"] == platform.python_version()
    assert info["no_such_package_qace"] is None
    assert versions() == {}


def test_gpu_name_is_none_off_cuda() -> None:
    assert gpu_name("cpu") is None
    if not torch.cuda.is_available():
        assert gpu_name() is None and gpu_name("cuda") is None
