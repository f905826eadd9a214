"""Argument checks that run before any model loads (`qace.checks`); the CLI's use is in test_cli.py."""

from __future__ import annotations

import pytest

from qace import checks
from qace.errors import BackendUnavailableError, ConfigError


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "gpu", "cuda:-1", ""])
def test_unknown_devices_are_refused(device) -> None:
    with pytest.raises(ConfigError, match="use cpu, cuda or cuda:N"):
        checks.check_device(device)


def test_cuda_devices_are_checked_against_the_visible_ones(monkeypatch) -> None:
    checks.check_device("cpu")
    monkeypatch.setattr(checks, "_cuda_devices", lambda: 2)
    checks.check_device("cuda")
    checks.check_device("cuda:1")
    with pytest.raises(
        BackendUnavailableError, match=r"only 2 CUDA GPU\(s\) are visible \(cuda:0 to cuda:1\)"
    ):
        checks.check_device("cuda:2")
    monkeypatch.setattr(checks, "_cuda_devices", lambda: 0)
    with pytest.raises(BackendUnavailableError, match="no CUDA GPU is visible here; use --device cpu"):
        checks.check_device("cuda:0")


def test_output_file_checks(tmp_path, monkeypatch) -> None:
    checks.check_output_file(tmp_path / "new" / "deeper" / "out.jsonl")  # folders are made later
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        checks.check_output_file(tmp_path / "file" / "deeper" / "out.jsonl")
    with pytest.raises(ConfigError, match="is a folder"):
        checks.check_output_file(tmp_path)
    monkeypatch.setattr(checks.os, "access", lambda path, mode: False)  # as for a read-only folder
    with pytest.raises(ConfigError, match=f"no permission to write in '{tmp_path}'"):
        checks.check_output_file(tmp_path / "out.jsonl")
