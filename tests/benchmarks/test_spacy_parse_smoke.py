"""`benchmarks.spacy_parse` on a few captions: both BLAS in parsing processes, and their agreement."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import spacy_parse


def test_a_small_run_times_both_blas_and_compares_their_parses(tmp_path: Path) -> None:
    out = tmp_path / "spacy.json"
    argv = ["--captions", "40", "--speed-captions", "32", "--task", "16", "--rounds", "2", "--out", str(out)]
    assert spacy_parse.main(argv) == 0
    record = json.loads(out.read_text())
    assert record["command"].startswith("python -m benchmarks.spacy_parse") and record["commit"]
    assert record["speed_captions"] == 32 and record["versions"]["thinc"]
    for name in spacy_parse.BLAS:
        cell = record["speed"][name]
        assert len(cell["rounds_ms_per_caption"]) == 2 and cell["ms_per_caption"] > 0
        assert 0 < cell["ms_per_caption_inside"] and cell["gemm_gflops"] > 0
    ratio = record["speed"]["blis"]["ms_per_caption"] / record["speed"]["numpy"]["ms_per_caption"]
    assert record["speed"]["blis_over_numpy"] == ratio
    assert record["agreement"]["captions"] == 40
    assert record["agreement"]["differing"] == dict.fromkeys(
        ("tags", "dependency_labels", "heads", "entities", "candidates"), 0
    )
