"""`benchmarks.decode_step` on a GPU at small shapes: every piece timed, bytes counted, the logits equal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.mark.gpu
def test_decode_step_smoke(tmp_path: Path) -> None:
    from benchmarks import decode_step

    out = tmp_path / "decode_step.json"
    assert decode_step.main(["--rows", "64", "--calls", "2", "--replays", "2", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["commit"] and result["gpu"]
    for piece in ("fused", "pytorch", "read_bound"):
        assert result["cross"][piece]["us"] > 0 and result["cross"][piece]["bytes"] > 0
    assert result["cross_ended"]["fused"]["bytes"] < result["cross"]["fused"]["bytes"]
    assert set(result["self"]) >= {"fused_write", "index_copies_then_fused", "index_copies_then_pytorch"}
    assert result["lm_head"]["bit_equal"] is True
