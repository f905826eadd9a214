"""benchmarks.encoder_attention end to end on the CPU: tiny T5, both layouts of batch, a record written."""

from __future__ import annotations

import json

import pytest

from benchmarks import encoder_attention


def test_encoder_attention_smoke(tmp_path) -> None:
    out = tmp_path / "e.json"
    assert (
        encoder_attention.main(
            ["--device", "cpu", "--tiny", "--shapes", "4x12", "3x20:9", "--rounds", "2", "--out", str(out)]
        )
        == 0
    )
    result = json.loads(out.read_text())
    assert result["kernel_available"] is False  # the kernel runs on CUDA only
    for shape, real in (("4x12", None), ("3x20:9", 27)):
        entry = result["shapes"][shape]
        assert entry["pytorch"]["ms"] > 0
        assert entry["pytorch"]["max_abs_vs_fp32"] < 1e-4  # the fused fp32 forward is Hugging Face's
        if real is not None:
            assert entry["real_tokens"] == real


def test_sweep_needs_a_cuda_device(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit):
        encoder_attention.main(["--device", "cpu", "--tiny", "--sweep", "--out", str(tmp_path / "e.json")])
    assert "needs a CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "e.json").exists()
