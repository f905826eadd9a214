"""``benchmarks/run_info.py``: the commit (``QACE_COMMIT`` first), device name and versions of a record."""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

import pytest
import torch

from benchmarks import run_info
from benchmarks.run_info import commit, cpu_name, gpu_name, record, versions
from qace import __version__

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


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


def test_a_package_without_a_version_attribute_reads_its_distributions() -> None:
    import importlib.metadata

    import blis

    assert not hasattr(blis, "__version__")
    assert versions("blis") == {"blis": importlib.metadata.version("blis")}


def test_gpu_name_is_none_off_cuda() -> None:
    assert gpu_name("cpu") is None
    if not torch.cuda.is_available():
        assert gpu_name() is None and gpu_name("cuda") is None


def test_cpu_name_is_the_kernels_model_name_else_the_platforms(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nvendor_id\t: Vendor\nmodel name\t: Some CPU 9000 @ 3.0GHz\n\n"
        "processor\t: 1\nmodel name\t: Some CPU 9000 @ 3.0GHz\n"
    )
    assert cpu_name(info) == "Some CPU 9000 @ 3.0GHz"
    info.write_text("processor\t: 0\nmodel name\t:\n")  # no model named (some ARM hosts)
    assert cpu_name(info) == (platform.processor() or platform.machine())
    assert cpu_name(tmp_path / "absent") == (platform.processor() or platform.machine())


def test_record_opens_a_benchmark_record(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QACE_COMMIT", "abc1234")
    info = record("benchmarks.x", ["--out", "a b.json"], device="cpu", packages=("numpy", "torch"))
    assert list(info) == ["command", "commit", "dirty", "gpu", "cpu", "versions"]
    assert info["command"] == "python -m benchmarks.x --out 'a b.json'"
    assert (info["commit"], info["dirty"], info["gpu"]) == ("abc1234", None, None)
    assert info["cpu"] == {"name": cpu_name(), "count": os.cpu_count()} and info["cpu"]["name"]
    assert list(info["versions"]) == ["python", "torch", "cuda", "qace", "numpy"]  # torch named once


def test_every_benchmark_takes_its_run_metadata_from_record() -> None:
    """One helper: no benchmark reads the commit or versions itself or writes its own command line."""
    own = {
        f"{path.name}: {needle}"
        for path in sorted(BENCHMARKS.glob("*.py"))
        if path.name != "run_info.py"
        for needle in (
            r"commit\(\)",
            r"versions\(",
            r'"python -m benchmarks\.\w+ "\s*\+',
            r"platform\.processor",
        )
        if re.search(needle, path.read_text(encoding="utf-8"))
    }
    assert own == set()
    writers = [p.name for p in BENCHMARKS.glob("*.py") if "--out" in p.read_text(encoding="utf-8")]
    assert writers and all("record(" in (BENCHMARKS / name).read_text() for name in writers), writers


def test_default_result_is_the_results_folders_record_for_the_device() -> None:
    assert run_info.default_result("kernels", "NVIDIA H200") == run_info.RESULTS / "kernels_h200.json"
    assert run_info.default_result("precision", None).name == "precision_cpu.json"
    assert run_info.RESULTS == Path(run_info.__file__).resolve().parent / "results"
    assert run_info.RESULTS.is_dir()
