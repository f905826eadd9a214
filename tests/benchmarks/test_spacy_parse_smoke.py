"""`benchmarks.spacy_parse` on a few captions: each pipeline in a parsing process, and their agreement."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from benchmarks import spacy_parse


def test_a_small_run_times_each_pipeline_and_compares_their_parses(tmp_path: Path) -> None:
    out = tmp_path / "spacy.json"
    argv = ["--captions", "40", "--speed-captions", "32", "--task", "16", "--rounds", "2", "--out", str(out)]
    argv += ["--parallel-processes", "2", "--parallel-calls", "7", "--parallel-repeats", "2"]
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
    # a call of 7 captions cut in two parts (4 and 3), each timed inside its process on the host's clock
    cell = record["parallel"]["2_processes_7_captions"]
    assert (cell["processes"], cell["captions"], cell["largest_part_captions"]) == (2, 7, 4)
    assert len(cell["calls_wall_ms"]) == 2 and cell["wall_ms"] == statistics.median(cell["calls_wall_ms"])
    assert 0 < cell["first_back_ms"] <= cell["wall_ms"]
    assert 0 < cell["shortest_parse_ms"] <= cell["longest_parse_ms"] <= cell["wall_ms"]
    assert cell["longest_wait_to_begin_ms"] >= 0 and cell["longest_wait_for_result_ms"] >= 0
    assert cell["largest_part_alone_ms"] > 0
