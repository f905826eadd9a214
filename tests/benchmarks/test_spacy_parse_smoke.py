"""`benchmarks.spacy_parse` on a few captions: each pipeline in a parsing process, and their agreement."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import spacy_parse


def test_a_small_run_times_each_pipeline_and_compares_their_parses(tmp_path: Path) -> None:
    out = tmp_path / "spacy.json"
    argv = ["--captions", "40", "--speed-captions", "32", "--task", "16", "--rounds", "2", "--out", str(out)]
    assert spacy_parse.main(argv) == 0
    record = json.loads(out.read_text())
    assert record["command"].startswith("python -m benchmarks.spacy_parse") and record["commit"]
    assert record["speed_captions"] == 32 and record["versions"]["thinc"]
    assert list(spacy_parse.PIPELINES) == ["spacy", "numpy_blas", "qace"]
    for name in spacy_parse.PIPELINES:
        cell = record["speed"][name]
        assert len(cell["rounds_ms_per_caption"]) == 2 and cell["ms_per_caption"] > 0
        assert 0 < cell["ms_per_caption_inside"] and cell["gemm_gflops"] > 0
    for name in ("numpy_blas", "qace"):
        ratio = record["speed"]["spacy"]["ms_per_caption"] / record["speed"][name]["ms_per_caption"]
        assert record["speed"][f"spacy_over_{name}"] == ratio
    assert record["agreement"]["captions"] == 40
    fields = ("coarse_tags", "tags", "dependency_labels", "heads", "entities", "candidates")
    assert record["agreement"]["differing_from_spacy"] == {
        name: dict.fromkeys(fields, 0) for name in ("numpy_blas", "qace")
    }
