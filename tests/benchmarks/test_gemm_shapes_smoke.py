"""`benchmarks.gemm_shapes` on the CPU: every product at every padded row count, timed first and again."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import gemm_shapes
from qace.engine.gemm_rows import row_counts


def test_cpu_run_records_each_product_shape(tmp_path: Path) -> None:
    out = tmp_path / "gemm.json"
    assert gemm_shapes.main(["--device", "cpu", "--up-to", "150", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["command"].startswith("python -m benchmarks.gemm_shapes") and record["commit"]
    assert record["row_counts"] == len(row_counts(150)) and record["largest"] == row_counts(150)[-1]
    for name in gemm_shapes.SHAPES:
        cell = record[name]
        assert cell["first_sum_ms"] > 0 and 0 < cell["first_p50_us"] <= cell["first_max_us"]
        assert 0 < cell["again_p50_us"] <= cell["again_max_us"]
