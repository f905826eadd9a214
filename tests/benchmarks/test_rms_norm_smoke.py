"""benchmarks.rms_norm end to end on the CPU: F.rms_norm and the copy bound timed, a record written."""

from __future__ import annotations

import json

from benchmarks import rms_norm


def test_rms_norm_smoke(tmp_path) -> None:
    out = tmp_path / "n.json"
    argv = ["--device", "cpu", "--rows", "16", "300", "--calls", "3", "--rounds", "2", "--out", str(out)]
    assert rms_norm.main(argv) == 0
    result = json.loads(out.read_text())
    assert result["kernel_available"] is False  # the kernel runs on CUDA only
    assert result["command"] == "python -m benchmarks.rms_norm " + " ".join(argv)
    assert set(result["shapes"]) == {"16", "300"}
    for rows, entry in result["shapes"].items():
        assert entry["bytes_moved"] == 2 * int(rows) * rms_norm.WIDTH * 4  # fp32 on the CPU
        assert set(entry) == {"bytes_moved", "torch", "copy"}
        assert entry["torch"]["eager_us"] > 0 and entry["copy"]["eager_us"] > 0
